"""The acceptance of issue 22 §1: ``attnscope diff`` over runs never fails an identical program,
and finds a real 2x slowdown, under a CPU burner (``--slow 3``: the 3x pairs that were the CI
test's until issue 38 §5, whose timing part moved here).

A small traced program (two traced layers around causal SDPA, ``--calls`` calls each, one process
a run) is run many times while a burner (one spinning process per core, started here) keeps every
core busy. For each pair k:

  A/A   3 runs of the program against 3 other runs of it: ``diff A1 A2 A3 --vs A4 A5 A6
        --fail-if-slower GATE`` must exit 0 (no gate failure)
  2x    3 of those runs against 3 runs where layer1 does twice the work (``--slow``): it must
        exit 1, with layer1 the group that failed

Runs are made one at a time, the A and 2x runs of a pair alternating (A S A S A S A A A) so both
see the same machine, as ``attnscope run --repeat N --alternate`` does. Each gate in ``--gates``
judges the same runs. The table also shows what the call-level gate of one run per side
(``--call-level-gate``, the behaviour before issue 22) does to the same A/A pairs, and each
pair's noise floor (the largest per-run p50 over the smallest, among its A runs).

Each gate also counts the p50 intervals it called inconclusive (straddling the gate: passed,
exit 0, named on a line). ``--judge DIR`` judges the runs a ``--keep DIR`` left, making none:
the same runs under two versions of attnscope (``PYTHONPATH=OLD_CHECKOUT``).

Run: python benchmarks/bench_diff_aa.py [--pairs 20] [--runs 3] [--calls 40] [--gates 25,5]
                                        [--slow 2] [--keep DIR | --judge DIR] [--no-burner]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

PROGRAM = (Path(__file__).parent / "aa_program.py").read_text()  # shared with the tests

BURNER = textwrap.dedent("""
    import multiprocessing, os
    def spin():
        while True:
            pass
    if __name__ == "__main__":
        spinners = [multiprocessing.Process(target=spin) for _ in range(os.cpu_count() or 2)]
        for p in spinners:
            p.start()
        for p in spinners:
            p.join()  # until killed (with its process group)
""")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env["ATTNSCOPE_METRICS"] = "false"
    return env


def run_once(directory: Path, slow: int, calls: int) -> None:
    directory.mkdir(parents=True)
    done = subprocess.run([sys.executable, "-c", PROGRAM, str(directory / "traces.jaeger.json"),
                           str(slow), str(calls)], env=_env(), capture_output=True, text=True,
                          timeout=300)
    if done.returncode:
        raise SystemExit(f"run {directory} failed: {done.stderr[-2000:]}")


def diff(*args: str | Path) -> tuple[int, dict[str, Any]]:
    from attnscope.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["diff", *map(str, args), "--json", "-"])
    return code, json.loads(out.getvalue())


def _p50(doc: dict[str, Any], module: str) -> dict[str, Any]:
    group = next(g for g in doc["groups"] if g["module"] == module)
    return next(m for m in group["metrics"] if m["metric"] == "p50")


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value * 100:+.1f}%"


def _pair(root: Path, k: int, runs: int, calls: int, gates: list[float], slow_by: int,
          make: bool = True) -> dict[str, Any]:
    a_dirs = [root / f"pair{k}" / "a" / f"run-{i + 1}" for i in range(2 * runs)]
    s_dirs = [root / f"pair{k}" / "s" / f"run-{i + 1}" for i in range(runs)]
    order = [(a_dirs[i], 1) for i in range(2 * runs)]
    for i, s in enumerate(s_dirs):  # A S A S ... then the remaining A runs
        order.insert(2 * i + 1, (s, slow_by))
    for directory, slow in order if make else ():
        run_once(directory, slow, calls)
    first, second = a_dirs[:runs], a_dirs[runs:]
    out: dict[str, Any] = {"codes": {}}
    for gate in gates:  # the same runs judged by each gate
        limit = ["--fail-if-slower", f"{gate:g}"]
        aa_code, aa = diff(*first, "--vs", *second, *limit)
        slow_code, slowed = diff(*first, "--vs", *s_dirs, *limit)
        one_code, _ = diff(first[0], second[0], *limit, "--call-level-gate")
        failed = {g["module"] for g in slowed["groups"] if g["gate_failed"]}
        unsure = sum(len(doc["gate"].get("inconclusive", ())) for doc in (aa, slowed))
        out["codes"][gate] = (aa_code, slow_code, failed, one_code, unsure)
        out.update(aa_l0=_p50(aa, "layer0"), aa_l1=_p50(aa, "layer1"),
                   slow_l1=_p50(slowed, "layer1"),
                   floor=max((n["noise_floor"] or 0.0) for side in aa["noise"].values()
                             for n in side))
    return out


def _burner() -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", BURNER], start_new_session=True)


def _report(results: list[dict[str, Any]], gates: list[float], title: str,
            started: float, slow_by: int) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, title_justify="left")
    for header in ("pair", "A/A exit", "A/A layer0 p50", "A/A layer1 p50", "A noise floor",
                   "1-run call-level exit", f"{slow_by}x exit", f"{slow_by}x layer1 p50 [95% CI]",
                   "verdict"):
        table.add_column(header, justify="right")
    for k, r in enumerate(results, start=1):
        s = r["slow_l1"]
        aa_code, slow_code, _, one_code, _ = r["codes"][gates[0]]
        table.add_row(str(k), str(aa_code),
                      f"{_pct(r['aa_l0']['change'])} {r['aa_l0']['verdict']}",
                      f"{_pct(r['aa_l1']['change'])} {r['aa_l1']['verdict']}",
                      f"{r['floor'] * 100:.1f}%", str(one_code), str(slow_code),
                      f"{_pct(s['change'])} [{_pct(s['interval'][0])}, {_pct(s['interval'][1])}]",
                      s["verdict"])
    console = Console(width=200)
    console.print(table)
    n = len(results)
    for gate in gates:
        codes = [r["codes"][gate] for r in results]
        detected = sum(c[1] == 1 and c[2] == {"layer1"} for c in codes)
        console.print(f"gate {gate:g}%: A/A gate failures (exit 1) "
                      f"{sum(c[0] == 1 for c in codes)} of {n}; {slow_by}x slowdown detected "
                      f"(exit 1, layer1 alone failed) {detected} of {n}; one run per side with "
                      f"--call-level-gate, A/A failures {sum(c[3] == 1 for c in codes)} of {n}; "
                      f"p50 intervals called inconclusive {sum(c[4] for c in codes)} of {4 * n}")
    console.print(f"largest A/A noise floor: {max(r['floor'] for r in results) * 100:.1f}%; "
                  f"wall time {time.monotonic() - started:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--pairs", type=int, default=20)
    parser.add_argument("--runs", type=int, default=3, help="runs per side")
    parser.add_argument("--calls", type=int, default=40, help="calls per layer per run")
    parser.add_argument("--gates", default="25,5",
                        help="--fail-if-slower PCTs, comma-separated (the first in the table)")
    parser.add_argument("--slow", type=int, default=2, help="layer1's work in the slow runs")
    parser.add_argument("--keep", metavar="DIR", default=None, help="keep the runs in DIR")
    parser.add_argument("--judge", metavar="DIR", default=None,
                        help="judge the runs a --keep DIR left (same --pairs/--runs), make none")
    parser.add_argument("--no-burner", action="store_true")
    args = parser.parse_args()
    gates = [float(g) for g in args.gates.split(",")]
    burner = None if args.no_burner or args.judge else _burner()
    started = time.monotonic()
    results = []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(args.judge or args.keep or tmp)
            for k in range(args.pairs):
                results.append(_pair(root, k, args.runs, args.calls, gates, args.slow,
                                     make=args.judge is None))
                print(f"pair {k + 1}/{args.pairs} done ({time.monotonic() - started:.0f} s)",
                      file=sys.stderr)
    finally:
        if burner is not None:
            os.killpg(burner.pid, signal.SIGKILL)  # the burner and its spinners: ours
            burner.wait()
    _report(results, gates, f"diff over runs: {args.pairs} pairs, {args.runs} runs a side, "
                            f"{args.calls} calls a layer, layer1 {args.slow}x, gate "
                            f"{gates[0]:g}%, burner {'off' if burner is None else 'on'}",
            started, args.slow)


if __name__ == "__main__":
    main()
