"""``benchmarks/bench_first_use.py``, the first-use probe a GPU run depends on, checked on CPU
(its step list is also what ``bench_model.py --breakdown`` times in place).

A GPU is lent for minutes: the probe must not die there of a renamed step. Every step it wraps
must still exist, and a CPU run (the same code, no CUDA row reached) must time the calling
thread's steps on every call, and the profiler entry points on the helper thread.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from .support.helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "benchmarks" / "bench_first_use.py"


def test_every_wrapped_step_exists() -> None:
    probe = load_script(SCRIPT, "bench_first_use")
    for path, attr, _ in (*probe.CALLING, *probe.WORKER, probe.DECISION):
        owner = probe.resolve(path)
        assert callable(getattr(owner, attr)), f"{path}.{attr}"
    # bench_model.py --breakdown times each instrumented layer's extractor on its call site
    from attnscope._capture.sampling import CallSite

    assert "extractor" in CallSite.__slots__


def test_longest_gap_is_measured_inside_the_span() -> None:
    probe = load_script(SCRIPT, "bench_first_use")
    assert probe.longest_gap([5, 10, 12, 40, 90], 8, 50) == 28  # 12 -> 40
    assert probe.longest_gap([], 0, 7) == 7  # no mark at all: the whole span
    assert probe.longest_gap([1, 2, 3], 10, 12) == 2


def test_a_cpu_run_times_the_calling_steps_and_the_profiler_entry_points(tmp_path: Path) -> None:
    out = tmp_path / "first_use.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--device", "cpu", "--calls", "4", "--json", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    doc = json.loads(out.read_text())
    steps = {row["step"].strip(): row for row in doc["steps"]}
    for name in ("whole traced call (+ sync)", "enter (decision, capture, clocks)",
                 "_open (summary, allocator, events)", "leave (end, counts, hand-over)",
                 "hand-over (first: worker start)"):
        assert steps[name]["calls"] == 4, name
        assert steps[name]["first_ms"] > 0 and steps[name]["later_ms"] > 0
    # no CUDA on this run: its steps are never reached, and say so (no figure)
    for name in ("allocator reading before", "CUDA event pair from the pool",
                 "host copy (pinned)", "worker: device made current"):
        assert steps[name]["calls"] == 0 and steps[name]["first_ms"] is None, name
    warm = doc["profiler_warm_up"]
    assert warm["warm"] is True
    assert set(warm["entry_points"]) == {"prepare", "enable", "disable"}
    for figures in warm["entry_points"].values():
        assert 0 <= figures["calling_thread_stall_ms"] <= figures["ms"] + 1e-6
        assert figures["longest_launch_ms"] is None  # kernel launches: CUDA only
    assert "first call:" in done.stdout and "prepare" in done.stdout
