"""``attnscope diff``'s work: load both sides, compare them (``_groups``), print the table or
write JSON, HTML and the diary entry, and return the exit code (the package's docstring says what
each means). Imported only when the command runs."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Sequence
from typing import Any

from rich.table import Table
from rich.text import Text

from .._errors import CLIError
from ..render.console import console as make_console
from ..render.console import fold, natural_width
from ..render.writer import check_output, write_text
from ..traces import SpanRow, attention_calls, load_runs
from ._groups import Backends, Diary, GroupDiff, Key, Noise, diary_runs, noise, side_backends
from ._json import noise_json, to_json
from ._replayed import replayed_json, replayed_lines
from ._stats import CONFIDENCE, Change
from ._text import (
    HEADERS,
    NOISE_HEADERS,
    UNJUDGED_EXIT,
    backend_text,
    group_label,
    layer_cell,
    names,
    noise_cells,
    noise_note,
    notes,
    row_cells,
)

__all__ = ["run_diff"]

_WORSE = frozenset({"slower", "larger"})
_BETTER = frozenset({"faster", "smaller"})


def _sides(args: argparse.Namespace) -> list[list[str]]:
    if args.noise:
        if args.vs is not None:
            raise CLIError("--noise measures the runs of one program: give them as PATHs, no --vs")
        return [args.paths]
    if args.vs is not None:
        return [args.paths, args.vs]
    if len(args.paths) != 2:
        raise CLIError(f"{len(args.paths)} paths: give BEFORE AFTER, or the runs of each side "
                       "as A1 A2 ... --vs B1 B2 ...")
    return [args.paths[:1], args.paths[1:]]


class _Side:
    """One side's runs: each run's attention calls kept apart, the backends of its groups, and
    its first run (path and spans: what the diary records as the side's run metadata)."""

    def __init__(self, paths: list[str], label: str) -> None:
        self.runs: list[list[SpanRow]] = []
        loaded: list[tuple[list[SpanRow], list[SpanRow]]] = []
        self.first: tuple[str, list[SpanRow]] | None = None
        for path in paths:
            for where, spans in load_runs(path):
                found = attention_calls(spans)
                if not found:
                    raise CLIError(f"{where}: no attention calls in this trace ({label})")
                self.runs.append(found)
                loaded.append((spans, found))
                if self.first is None:
                    self.first = (where, spans)
        self.backends: dict[Key, Backends] = side_backends(loaded)

    def info(self) -> dict[str, Any]:
        from ..runinfo import run_info

        return run_info(*self.first) if self.first is not None else {}


def _label(paths: list[str], runs: int) -> str:
    shown = " ".join(paths)
    return shown if runs == 1 else f"{shown} ({runs} runs)"


def _phases_hint(before: list[tuple[Key, int]], after: list[tuple[Key, int]]) -> str:
    """Why nothing matched when the same layers ran on both sides in other phases: a phase
    comes from the KV cache, which one side had and the other not."""
    if not {k[0] for k, _ in before} & {k[0] for k, _ in after}:
        return ""
    return ("; the same layers ran on both sides, in other phases: a layer's phase comes from "
            "its KV cache (prefill, decode; none without a cache), so a run with a cache and "
            "one without never match (transformers' use_cache: gradient checkpointing turns it "
            "off in training); run both sides with the same use_cache")


def run_diff(args: argparse.Namespace) -> int:
    check_output(args.html, "--html")  # before the work
    check_output(args.json, "--json")
    check_output(args.append_diary, "--append-diary")
    if args.diary_note is not None and args.append_diary is None:
        raise CLIError("--diary-note goes into the diary: give --append-diary PATH too")
    sides = _sides(args)
    loaded = [_Side(paths, label)
              for paths, label in zip(sides, ("BEFORE", "AFTER"), strict=False)]
    runs = [side.runs for side in loaded]
    if args.noise:
        return _noise_only(args, _label(sides[0], len(runs[0])), noise(runs[0]))
    before, after = _label(sides[0], len(runs[0])), _label(sides[1], len(runs[1]))
    result = diary_runs(runs[0], runs[1], min_change=args.min_change / 100,
                        confidence=CONFIDENCE,
                        backends=(loaded[0].backends, loaded[1].backends))
    if not result.groups:
        raise CLIError(f"no layer/phase is in both traces (BEFORE: "
                       f"{names(result.only_before)}; AFTER: {names(result.only_after)})"
                       + _phases_hint(result.only_before, result.only_after))
    limit = args.fail_if_slower
    # A gate with no p50 it could judge gives no verdict rather than a pass.
    judged = (limit is not None and (result.run_level or args.call_level_gate)
              and result.p50_judgeable())
    failures = result.gate_failures(limit / 100) if judged and limit is not None else []
    floors = [noise(side) for side in runs] if max(len(r) for r in runs) > 1 else []
    replayed = replayed_lines(result, runs[0], runs[1])
    if args.html:
        from ._html import write_html  # matplotlib: only for the page

        write_html(args.html, result, before, after, limit, judged, floors, replayed)
    if args.json:
        _write_json(args.json, to_json(result, before=before, after=after, limit=limit,
                                       failures=failures, judged=judged, noise=floors)
                    | {"replayed_calls": replayed_json(result, runs[0], runs[1])})
    # The diary before the terminal: `attnscope diff ... | head` closes stdout mid-table, and the
    # entry asked for must not be lost with it. Its error is said after the comparison.
    unwritten: CLIError | None = None
    if args.append_diary:
        from ._diary import append, entry

        try:
            append(args.append_diary, entry(
                result, note_text=args.diary_note, paths=sides, runs=[len(r) for r in runs],
                info=[side.info() for side in loaded], limit=limit, judged=bool(judged),
                failures=failures, floors=floors))
        except CLIError as exc:
            unwritten = exc
    if args.json != "-":
        _print(result, before, after, limit, failures, judged, floors, replayed)
    if unwritten is not None:
        raise unwritten
    return 1 if failures else UNJUDGED_EXIT if limit is not None and not judged else 0


def _noise_only(args: argparse.Namespace, label: str, floors: list[Noise]) -> int:
    if args.fail_if_slower is not None or args.html or args.append_diary:
        raise CLIError("--noise prints the noise floor only: no --fail-if-slower, --html or "
                       "--append-diary")
    if args.json:
        _write_json(args.json, noise_json(label, floors))
    if args.json != "-":
        console = make_console()
        console.print(_noise_table(floors, f"attnscope diff --noise  {label}"))
        console.print(noise_note(floors), soft_wrap=True)
    return 0


def _write_json(path: str, document: dict[str, Any]) -> None:
    text = json.dumps(document, indent=2)
    if path == "-":
        print(text)
        return
    write_text(path, text + "\n", "--json")


# -- the terminal ---------------------------------------------------------------------------


def _print(result: Diary, before: str, after: str, limit: float | None,
           failures: list[tuple[GroupDiff, Change]], judged: bool = True,
           floors: Sequence[list[Noise]] = (), replayed: Sequence[str] = ()) -> None:
    console = make_console()
    title = f"attnscope diff  BEFORE {before}  →  AFTER {after}"
    table = _table(result.groups, range(len(HEADERS)), title)
    if natural_width(console, table) <= console.width:
        console.print(table)
    else:  # narrow: each layer under its own heading, its columns folded into tables that fit
        console.print(title, markup=False, soft_wrap=True)
        for group in result.groups:
            console.print(f"{group_label((group.module, group.phase))} · backend "
                          f"{backend_text(group)}", markup=False, soft_wrap=True, style="bold")
            for part in fold(console, _group_table(group), len(HEADERS) - 1):
                console.print(part)
    for side, floor in zip(("BEFORE", "AFTER"), floors, strict=False):
        console.print(_noise_table(floor, f"A/A noise floor of {side}: how much its runs differ"))
    if floors:
        console.print(noise_note([n for floor in floors for n in floor]), soft_wrap=True)
    for line in notes(result, limit, failures, judged):
        console.print(line, soft_wrap=True)
    for line in replayed:
        console.print(line, soft_wrap=True, markup=False)


def _noise_table(floors: list[Noise], title: str) -> Any:
    table = Table(title=title, title_justify="left")
    for i, header in enumerate(NOISE_HEADERS):
        table.add_column(header, justify="left" if i in (0, 3) else "right", no_wrap=i != 3)
    for n in floors:
        table.add_row(*noise_cells(n))
    return table


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
            cells: list[Any] = [layer_cell(group, i), *row_cells(group, change)]
            style = "red" if change.verdict in _WORSE else "green" if change.verdict in _BETTER \
                else ""
            cells[7] = Text(cells[7], style=style)
            table.add_row(*(cells[c] for c in shown), end_section=i == len(group.changes) - 1)
    return table
