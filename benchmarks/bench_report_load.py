"""``attnscope report`` on a large trace: its wall time and peak memory, tree against tree.

A live service's trace files rotate at 64 MiB (about 40,000 spans of OTLP/JSON each); a report
over a day's directory reads many. This makes a trace of attnscope's own spans (a tiny Llama's
``generate()``, every attention call traced, written by the ``otlp-json`` exporter), copies its
lines with fresh trace and span ids until it holds ``--spans`` spans, and runs
``attnscope report FILE --json OUT`` on it in a fresh process per run, for each ``--tree`` given
(a checkout whose ``attnscope/`` goes first on ``PYTHONPATH``; default: this one), the trees
alternated over ``--runs`` rounds. Printed per tree: wall time and peak RSS (``ru_maxrss`` of the
child), median of the runs, and whether every tree's JSON report is the same.

Run: python benchmarks/bench_report_load.py [--spans 100000] [--runs 3] [--tree DIR ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent


def _make_seed_trace(path: Path) -> None:
    """A few thousand spans of a real run, written by attnscope's own exporter."""
    code = (
        "import sys, torch, attnscope\n"
        f"sys.path.insert(0, {str(_HERE)!r})\n"
        "from bench_model import build_model\n"
        f"attnscope.configure(exporter='otlp-json:{path}', sample_rate=1.0, warmup_calls=0,\n"
        "                     overhead_budget=1.0, profile_rate=0.0, metrics=False)\n"
        "model = build_model()\n"
        "attnscope.instrument(model, trace_model=True)\n"
        "ids = torch.randint(3, 200, (2, 16))\n"
        "with torch.no_grad():\n"
        "    for _ in range(4):\n"
        "        model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),\n"
        "                       max_new_tokens=32, do_sample=False, pad_token_id=0)\n"
        "attnscope.shutdown()\n")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=_HERE.parent)


def _grow(seed: Path, out: Path, spans: int) -> int:
    """``seed``'s documents copied with new ids (the copy's number in each id's first hex
    digits) until ``spans`` spans are written; returns how many were."""
    docs = [json.loads(line) for line in seed.read_text().splitlines() if line.strip()]
    written, copy = 0, 0
    with out.open("w") as f:
        while written < spans:
            copy += 1
            prefix = f"{copy:06x}"
            for doc in docs:
                for rs in doc["resourceSpans"]:
                    for ss in rs["scopeSpans"]:
                        for s in ss["spans"]:
                            for key in ("traceId", "spanId", "parentSpanId"):
                                if s.get(key):
                                    s[key] = prefix + s[key][6:]
                            written += 1
                f.write(json.dumps(doc) + "\n")
    return written


def _run(tree: Path, trace: Path, out: Path) -> tuple[float, float]:
    """One report in a fresh process: (wall seconds, peak RSS in MiB). A wrapper process runs
    it and prints its children's ``ru_maxrss``: this process's own would be the largest of all
    runs so far."""
    code = ("import resource, subprocess, sys\n"
            "subprocess.run(sys.argv[1:], check=True, stdout=subprocess.DEVNULL)\n"
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n")
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code, sys.executable, "-m", "attnscope",
                           "report", str(trace), "--json", str(out)], check=True, text=True,
                          capture_output=True, env=dict(os.environ, PYTHONPATH=str(tree)),
                          cwd=tree)
    return time.perf_counter() - start, int(done.stdout.strip()) / 1024


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tree", action="append", type=Path,
                        help="a checkout to run (repeat for before/after); default: this one")
    args = parser.parse_args()
    trees = [t.resolve() for t in (args.tree or [_HERE.parent])]
    with tempfile.TemporaryDirectory(prefix="attnscope-bench-report-") as tmp:
        seed, trace = Path(tmp) / "seed.otlp.jsonl", Path(tmp) / "big.otlp.jsonl"
        _make_seed_trace(seed)
        count = _grow(seed, trace, args.spans)
        print(f"machine: {platform.machine()}, python {platform.python_version()}, "
              f"load average {os.getloadavg()[0]:.1f}; trace: {count} spans, "
              f"{trace.stat().st_size / 1e6:.0f} MB")
        results: dict[Path, list[tuple[float, float]]] = {t: [] for t in trees}
        reports: dict[Path, str] = {}
        for _ in range(args.runs):
            for tree in trees:
                out = Path(tmp) / f"report-{len(reports)}.json"
                results[tree].append(_run(tree, trace, out))
                reports[tree] = out.read_text()
        for tree, runs in results.items():
            walls, peaks = [w for w, _ in runs], [p for _, p in runs]
            print(f"{tree}: report {statistics.median(walls):.2f} s "
                  f"({min(walls):.2f}-{max(walls):.2f}), peak RSS "
                  f"{statistics.median(peaks):.0f} MiB ({min(peaks):.0f}-{max(peaks):.0f})")
        same = len({_without_source(r) for r in reports.values()}) == 1
        print(f"the JSON reports are {'the same' if same else 'DIFFERENT'}")
        return 0 if same else 1


def _without_source(report: str) -> str:
    doc = json.loads(report)
    doc.pop("source", None)
    return json.dumps(doc, sort_keys=True)


if __name__ == "__main__":
    sys.exit(main())
