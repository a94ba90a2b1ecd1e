"""``attnscope diff BEFORE AFTER``: the performance diary between two sides, and a CI gate.

A side is one run or several: each path is a trace file or run directory (one run) or a repeat
directory (``run-1`` ... ``run-N``, its runs), and ``diff A1 A2 ... --vs B1 B2 ...`` gives several
paths per side. For each (module, phase) present on both sides: p50/p95/p99 time, tokens/s and
memory peak, the relative change with a confidence interval and a verdict (``_stats``: the rule
and the one-run bootstrap over calls; ``_runs``: the hierarchical bootstrap over runs, then calls
within them, used whenever a side has several runs; ``_groups``: the data). Every multi-run diff
also prints the A/A noise floor of each side (how much its runs differ at p50); ``--noise RUNS``
prints only that.

``--fail-if-slower PCT`` exits 1 when a p50 time is slower by more than PCT% beyond noise — with
at least two runs on each side. With one run on a side run-to-run noise is unmeasured, and the
gate does not judge on call-level evidence alone: it exits 3 with a line saying how to get a
verdict, unless ``--call-level-gate`` asks for the call-level gate. ``--json`` writes the same
diary for scripts (``_json``); ``--append-diary PATH.jsonl`` appends the comparison as one line
of the user's performance diary (``_diary``; read back by :mod:`..diary`). Groups match by
(module, phase); each side's backends are shown beside them (``eager → sdpa``). Exit codes: 0
ok, 1 gate failed, 2 bad input (or the diary could not be written), 3 gate not judged.
"""

from __future__ import annotations

import argparse
import math
from typing import Any

__all__ = ["register", "run_diff", "percent", "DEFAULT_MIN_CHANGE", "UNJUDGED_EXIT"]

# The command's work lives in ._command and the modules it imports (numpy, rich): registering the
# command, and `attnscope diff --help`, import none of them (issue 38 §1: scipy.stats cost 6-8 s).
DEFAULT_MIN_CHANGE = 5.0  # percent
UNJUDGED_EXIT = 3  # --fail-if-slower asked for, one run on a side: no verdict either way

_DESCRIPTION = """\
Compare two sides, BEFORE and AFTER, attention layer by layer and phase by phase (prefill/decode):
p50, p95 and p99 time, tokens/s and memory peak, the relative change AFTER/BEFORE - 1 with a 95%
confidence interval, and a verdict: faster / slower (smaller / larger for memory) when the
change is at least --min-change and the whole interval lies beyond it, however wide;
"inconclusive" when the interval excludes 0 but straddles --min-change; else "no change".

A side is one run or several runs. Each path is a trace file (Jaeger JSON, OTLP/JSON lines) or an
`attnscope run` directory (one run), or a repeat directory (run-1 ... run-N, from
`attnscope run --repeat N`: N runs); `diff A1 A2 A3 --vs B1 B2 B3` gives several paths per side.
Several runs: each run's quantiles, the side's figure their median over runs, the interval a
hierarchical bootstrap (runs, then calls within each run), so run-to-run noise is in it; the
noise floor (how much the runs of a side differ at p50) is printed under the table. One run per
side: the interval resamples that run's calls only, and run-to-run noise is unmeasured.

Layers match by (module, phase) whatever implementation ran them; under each layer's name the
table shows each side's attention backend ("backend eager → sdpa", one name when both sides ran
the same, "—" where no call was profiled: the backend is known from profiled calls only).
--append-diary PATH.jsonl appends the comparison as one JSON line to a performance diary (date,
--diary-note, both sides' run metadata, per-layer verdicts, noise floors, the gate's outcome);
`attnscope report --diary PATH` lists it.

Exit codes: 0 done (and the gate passed), 1 --fail-if-slower tripped, 2 bad input (or the diary
could not be written), 3 the gate was asked for but not judged (one run on a side: record
several with `attnscope run --repeat 3`, or pass --call-level-gate)."""


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
    p.add_argument("paths", metavar="PATH", nargs="+",
                   help="BEFORE AFTER (each a trace file, run directory or repeat directory); "
                        "with --vs: every run of BEFORE; with --noise: runs of one program")
    p.add_argument("--vs", metavar="AFTER", nargs="+", default=None,
                   help="the runs of AFTER (the PATHs are then all BEFORE's)")
    p.add_argument("--noise", action="store_true",
                   help="only the A/A noise floor of the runs given: how much their p50s differ")
    p.add_argument("--fail-if-slower", metavar="PCT", type=percent, default=None,
                   help="exit 1 when a p50 time is slower by more than PCT%% beyond noise (the "
                        "whole confidence interval above PCT%%, however wide; one that straddles "
                        "PCT%% is named as inconclusive): a regression gate for CI; needs 2+ "
                        "runs per side, else exit 3")
    p.add_argument("--call-level-gate", action="store_true",
                   help="let the gate judge one run per side on call-level evidence (run-to-run "
                        "noise unmeasured)")
    p.add_argument("--min-change", metavar="PCT", type=percent, default=DEFAULT_MIN_CHANGE,
                   help="smallest change (in %%) reported as faster/slower")
    p.add_argument("--html", metavar="PATH", default=None,
                   help="also write the diary as a self-contained HTML page")
    p.add_argument("--json", metavar="PATH", default=None,
                   help="also write the diary as JSON ('-': to stdout instead of the table)")
    p.add_argument("--append-diary", metavar="PATH.jsonl", default=None,
                   help="append this comparison as one JSON line to the performance diary PATH "
                        "(created if missing; list it with `attnscope report --diary PATH`)")
    p.add_argument("--diary-note", metavar="TEXT", type=_diary_note, default=None,
                   help="with --append-diary: what changed between BEFORE and AFTER (at most "
                        "500 characters), kept in the entry")
    p.set_defaults(func=run_diff)


def _diary_note(text: str) -> str:
    """argparse type for ``--diary-note`` (``._diary.note``, imported when one is given)."""
    from ._diary import note

    return note(text)


def run_diff(args: argparse.Namespace) -> int:
    """Run ``attnscope diff`` (``._command``); returns the exit code."""
    from ._command import run_diff as run

    return run(args)
