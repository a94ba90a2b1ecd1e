"""``attnscope diff BEFORE AFTER``: the performance diary between two traces, and a CI gate.

For each (module, phase) present in both traces: p50/p95/p99 time, tokens/s and memory peak, the
relative change with a bootstrap confidence interval and a verdict (``_stats``: the rule;
``_groups``: the data). ``--fail-if-slower PCT`` exits 1 when a p50 time is slower by more
than PCT% beyond noise; ``--json`` writes the same diary for scripts (``_json``). Exit codes:
0 ok, 1 gate failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from .._errors import CLIError
from ..render.console import console as make_console
from ..render.console import fold, natural_width
from ..render.writer import check_output, write_text
from ..traces import attention_calls, load_spans
from ._groups import Diary, GroupDiff, diary
from ._json import to_json
from ._stats import CONFIDENCE, Change
from ._text import HEADERS, group_label, names, notes, row_cells

__all__ = ["register", "run_diff", "percent", "DEFAULT_MIN_CHANGE"]

DEFAULT_MIN_CHANGE = 5.0  # percent
_WORSE = frozenset({"slower", "larger"})
_BETTER = frozenset({"faster", "smaller"})

_DESCRIPTION = """\
Compare two traces (BEFORE, AFTER: Jaeger JSON, OTLP/JSON lines or an `attnscope run` directory),
attention layer by layer and phase by phase (prefill/decode): p50, p95 and p99 time, tokens/s and
memory peak, the relative change AFTER/BEFORE - 1 with a 95% bootstrap confidence interval over
the calls in each file, and a verdict: faster / slower (smaller / larger for memory) when the
interval excludes 0 and the change is at least --min-change, else "no change".

The interval covers call-to-call variation inside each file, not drift between runs (another
machine, another load, a warmer cache): --min-change is the allowance for that.

Exit codes: 0 done (and the gate passed), 1 --fail-if-slower tripped, 2 bad input."""


def percent(text: str) -> float:
    """argparse type: a finite percentage, 0 or more."""
    try:
        value = float(text.rstrip("%"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite percentage >= 0, got {text}")
    return value


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope diff`` to the command line."""
    p = sub.add_parser("diff", formatter_class=formatter, description=_DESCRIPTION,
                       help="compare two traces: what got faster or slower, beyond noise")
    p.add_argument("before", metavar="BEFORE", help="the reference trace (file or run directory)")
    p.add_argument("after", metavar="AFTER", help="the trace to judge against it")
    p.add_argument("--fail-if-slower", metavar="PCT", type=percent, default=None,
                   help="exit 1 when a p50 time is slower by more than PCT%% beyond noise (the "
                        "whole confidence interval above PCT%%): a regression gate for CI")
    p.add_argument("--min-change", metavar="PCT", type=percent, default=DEFAULT_MIN_CHANGE,
                   help="smallest change (in %%) reported as faster/slower")
    p.add_argument("--html", metavar="PATH", default=None,
                   help="also write the diary as a self-contained HTML page")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="also write the diary as JSON ('-': to stdout instead of the table)")
    p.set_defaults(func=run_diff)


def run_diff(args: argparse.Namespace) -> int:
    check_output(args.html, "--html")  # before the work
    check_output(args.json, "--json")
    calls = []
    for label, path in (("BEFORE", args.before), ("AFTER", args.after)):
        found = attention_calls(load_spans(path))
        if not found:
            raise CLIError(f"{path}: no attention calls in this trace ({label})")
        calls.append(found)
    result = diary(calls[0], calls[1], min_change=args.min_change / 100, confidence=CONFIDENCE)
    if not result.groups:
        raise CLIError(f"no layer/phase is in both traces (BEFORE: "
                       f"{names(result.only_before)}; AFTER: {names(result.only_after)})")
    failures = (result.gate_failures(args.fail_if_slower / 100)
                if args.fail_if_slower is not None else [])
    if args.html:
        from ._html import write_html  # matplotlib: only for the page

        write_html(args.html, result, args.before, args.after, args.fail_if_slower)
    if args.json:
        _write_json(args.json, to_json(result, before=args.before, after=args.after,
                                       limit=args.fail_if_slower, failures=failures))
    if args.json != "-":
        _print(result, args.before, args.after, args.fail_if_slower, failures)
    return 1 if failures else 0


def _write_json(path: str, document: dict[str, Any]) -> None:
    text = json.dumps(document, indent=2)
    if path == "-":
        print(text)
        return
    write_text(path, text + "\n", "--json")


# -- the terminal ---------------------------------------------------------------------------


def _print(result: Diary, before: str, after: str, limit: float | None,
           failures: list[tuple[GroupDiff, Change]]) -> None:
    console = make_console()
    title = f"attnscope diff  BEFORE {before}  →  AFTER {after}"
    table = _table(result.groups, range(len(HEADERS)), title)
    if natural_width(console, table) <= console.width:
        console.print(table)
    else:  # narrow: each layer under its own heading, its columns folded into tables that fit
        console.print(title, markup=False, soft_wrap=True)
        for group in result.groups:
            console.print(group_label((group.module, group.phase)), markup=False,
                          soft_wrap=True, style="bold")
            for part in fold(console, _group_table(group), len(HEADERS) - 1):
                console.print(part)
    for line in notes(result, limit, failures):
        console.print(line, soft_wrap=True)


def _group_table(group: GroupDiff) -> Callable[[Sequence[int]], Any]:
    """For :func:`fold`: one layer's table of the given columns of ``HEADERS`` without its
    first ("layer (phase)": the heading above), so the key column is the metric."""
    def build(columns: Sequence[int]) -> Any:
        return _table([group], [0, *(c + 1 for c in columns)], None, layer=False)

    return build


def _table(groups: list[GroupDiff], columns: Any, title: str | None, *,
           layer: bool = True) -> Any:
    """The diary's table with the given columns of ``HEADERS`` (0: the layer, shown only when
    ``layer``); figures are never wrapped or cut, the verdict may wrap."""
    shown = [c for c in columns if c != 0 or layer]
    table = Table(title=title, title_justify="left")
    for c in shown:
        table.add_column(HEADERS[c], justify="left" if c in (0, 1, 7) else "right",
                         no_wrap=c != 7)
    for group in groups:
        for i, change in enumerate(group.changes):
            cells: list[Any] = [group_label((group.module, group.phase)) if i == 0 else "",
                                *row_cells(group, change)]
            style = "red" if change.verdict in _WORSE else "green" if change.verdict in _BETTER \
                else ""
            cells[7] = Text(cells[7], style=style)
            table.add_row(*(cells[c] for c in shown), end_section=i == len(group.changes) - 1)
    return table
