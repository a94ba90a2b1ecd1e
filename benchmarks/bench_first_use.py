"""Where a process's first sampled calls spend their time, step by step (issue 37 goal 1).

On one H200 the first instrumented ``generate()`` of a process took 4.0 s against 0.55 s plain,
and 3.9 s with the profile tier off; on CPU it costs no more than a later one. This script names
the steps that pay a first-use cost, in one fresh process, so that a single GPU run says where the
seconds go. It runs a traced SDPA call with a left-padded boolean mask (the device-side mask counts
of a batched server's calls), every call sampled, the profile tier off:

1. set-up: ``attnscope.configure()`` (wall ms);
2. the calling thread's steps, each wrapped with a timer (wall and thread CPU, ms), on their first
   call and as the median of the later ones: ``enter`` / ``leave`` and, inside them, the
   allocator readings, the CUDA event pair, the device-side mask counts, the host copy, the hand-
   over to the worker (its first call starts the worker); and the whole call, with the time the
   calling thread was not running (wall - CPU: the GIL, a blocking call, the scheduler);
3. the worker's first CUDA calls (its side stream, the capture-mode exchange), on its thread;
4. the profiler's warm-up (``profiler_session.warm_up``, CUDA activities on a CUDA device) run on a
   helper thread, as attnscope runs it, while the calling thread spins (on CUDA launching a
   one-element kernel every 50 µs, as a model would): how long each of torch's profiler entry
   points took, the calling thread's longest stall meanwhile and, on CUDA, its longest launch (an
   entry point that holds the GIL, or CUPTI's start-up holding the driver, for a second freezes
   the application for that second).

``--json PATH`` writes the figures too. ``--device cpu`` runs the same steps on the CPU (no CUDA
step is reached there: the CUDA rows stay empty), for checking the script.

Run: python benchmarks/bench_first_use.py [--device cuda|cpu] [--calls 20] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import pkgutil
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

# (module, attribute, row label): the steps timed; a name missing here fails the run at once
# (tests/test_bench_first_use.py), not on the GPU after minutes of set-up
CALLING = (
    ("attnscope._capture.wrapper", "enter", "enter (decision, capture, clocks)"),
    ("attnscope._capture.wrapper", "_open", "  _open (summary, allocator, events)"),
    ("attnscope._capture.device", "memory_before", "    allocator reading before"),
    ("attnscope._capture.wrapper", "_event_timer", "    CUDA event pair from the pool"),
    ("attnscope._capture.wrapper", "leave", "leave (end, counts, hand-over)"),
    ("attnscope._capture.device", "memory_after", "  allocator reading after"),
    ("attnscope._capture.wrapper", "_device_counts", "  device-side counts and host copy"),
    ("attnscope._capture.hostread", "to_host", "    host copy (pinned)"),
    ("attnscope._runtime.worker.WorkerHandle", "submit", "  hand-over (first: worker start)"),
)
# the decision inside enter, timed in place by bench_model.py --breakdown
DECISION = ("attnscope._capture.decision", "decide", "  decision (in enter)")
WORKER = (
    ("attnscope._worker.cuda.DeviceAccess", "prepare", "worker: device made current"),
    ("attnscope._worker.cuda", "relax_capture_mode", "worker: capture-mode exchange"),
)


class Timings:
    """Wall and thread-CPU ns of each call of the wrapped steps, per label and thread kind."""

    def __init__(self) -> None:
        self.rows: dict[str, list[tuple[int, int]]] = {}
        self.main = threading.get_ident()

    def wrap(self, owner: Any, attr: str, label: str, main_only: bool) -> None:
        inner = getattr(owner, attr)
        rows = self.rows.setdefault(label, [])

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if main_only and threading.get_ident() != self.main:
                return inner(*args, **kwargs)
            wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
            try:
                return inner(*args, **kwargs)
            finally:
                rows.append((time.perf_counter_ns() - wall, time.thread_time_ns() - cpu))

        setattr(owner, attr, timed)


def resolve(path: str) -> Any:
    """The module, class or function named by a dotted path."""
    return pkgutil.resolve_name(path)


def inputs(device: str) -> tuple[Any, Any, Any, Any]:
    """q, k, v and a left-padded boolean mask: issue 37's batch (8, 16 heads, 128 tokens, head
    dim 128, bf16) on CUDA, a smaller float32 one on the CPU."""
    import torch

    b, h, n, d = (8, 16, 128, 128) if device == "cuda" else (4, 8, 64, 32)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    q, k, v = (torch.randn(b, h, n, d, device=device, dtype=dtype) for _ in range(3))
    keep = torch.ones(b, 1, n, n, dtype=torch.bool, device=device).tril()
    for row in range(b):
        keep[row, :, :, : row * n // (2 * b)] = False  # row i: its first pads masked out
    return q, k, v, keep


def calling_steps(device: str, calls: int, timings: Timings) -> dict[str, Any]:
    """configure(), then ``calls`` traced calls; per call its wall and the time it did not run."""
    import torch

    import attnscope

    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    q, k, v, mask = inputs(device)

    def body(q: Any, k: Any, v: Any, attn_mask: Any) -> Any:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)

    for _ in range(3):  # torch's own first-use costs (its kernels, cuBLAS, the allocator) first
        body(q, k, v, mask)
    sync()
    t = time.perf_counter_ns()
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, profile_rate=0.0)
    setup_ms = (time.perf_counter_ns() - t) / 1e6
    for path, attr, label in CALLING:
        timings.wrap(resolve(path), attr, label, main_only=True)
    for path, attr, label in WORKER:
        timings.wrap(resolve(path), attr, label, main_only=False)
    traced = attnscope.trace(body, name="attention")
    per_call = []
    for _ in range(calls):
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        traced(q, k, v, attn_mask=mask)
        sync()
        per_call.append((time.perf_counter_ns() - wall, time.thread_time_ns() - cpu))
    attnscope.flush(timeout_s=30)
    return {"configure_ms": setup_ms, "calls": per_call}


def profiler_stall(device: str) -> dict[str, Any]:
    """The profiler's warm-up on a helper thread, the calling thread spinning meanwhile: each
    entry point's span and the calling thread's longest gap inside it (ms)."""
    from attnscope._capture import profiler_session
    from attnscope._runtime import runtime

    if not profiler_session._load():
        return {"skipped": "the profiler cannot load"}
    p = runtime.profiler
    # without CUDA attnscope warmed kineto on the main thread at import: run one more session
    # (the same steps, not the first-use cost; the output says so)
    first = not p.kineto_ran
    p.warm_cpu = p.warm_cuda = False
    spans: dict[str, tuple[int, int]] = {}
    points = runtime.profiler.entry_points
    for name, inner in list(points.items()):
        def timed(*args: Any, _inner: Callable[..., Any] = inner, _name: str = name) -> Any:
            t0 = time.perf_counter_ns()
            try:
                return _inner(*args)
            finally:
                spans[_name] = (t0, time.perf_counter_ns())

        points[name] = timed
    result: dict[str, Any] = {"first_session": first}
    marks: list[int] = []

    def warm() -> None:
        time.sleep(0.02)  # the calling thread spins first
        t0 = time.perf_counter_ns()
        result["warm"] = profiler_session.warm_up(cuda=device == "cuda")
        result["warm_up_ms"] = (time.perf_counter_ns() - t0) / 1e6

    launches: list[tuple[int, int]] = []  # (start, ns) of the calling thread's launches
    launch = _launcher(device)
    helper = threading.Thread(target=warm, name="attnscope-profiler-warmup")
    helper.start()
    last = 0
    while helper.is_alive():
        now = time.perf_counter_ns()
        marks.append(now)
        if launch is not None and now - last > 50_000:  # a kernel every 50 µs: the queue keeps up
            launch()
            last = time.perf_counter_ns()
            launches.append((now, last - now))
    result["entry_points"] = {
        name: {"ms": (t1 - t0) / 1e6,
               "calling_thread_stall_ms": longest_gap(marks, t0, t1) / 1e6,
               "longest_launch_ms": max((ns for t, ns in launches if t0 <= t <= t1),
                                        default=0) / 1e6 if launch is not None else None}
        for name, (t0, t1) in spans.items()}
    return result


def _launcher(device: str) -> Callable[[], Any] | None:
    """On CUDA, a one-element kernel launch: the calling thread keeps the GPU busy as a model
    does, so a stall in the driver (not only the GIL) shows too."""
    if device != "cuda":
        return None
    import torch

    x = torch.zeros(1, device="cuda")
    return lambda: x.add_(1)


def longest_gap(marks: list[int], t0: int, t1: int) -> int:
    """The longest stretch of [t0, t1] with no mark in it (ns)."""
    inside = [t0, *(m for m in marks if t0 <= m <= t1), t1]
    return max(b - a for a, b in zip(inside, inside[1:], strict=False))


def table(timings: Timings, run: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per step: calls, first wall and CPU, median later wall and CPU (ms)."""
    rows = [{"step": "whole traced call (+ sync)", "samples": run["calls"]}]
    rows += [{"step": label, "samples": timings.rows[label]}
             for _, _, label in (*CALLING, *WORKER)]
    out = []
    for row in rows:
        samples = row["samples"]
        later = samples[1:]
        out.append({
            "step": row["step"], "calls": len(samples),
            "first_ms": samples[0][0] / 1e6 if samples else None,
            "first_cpu_ms": samples[0][1] / 1e6 if samples else None,
            "later_ms": statistics.median(s[0] for s in later) / 1e6 if later else None,
            "later_cpu_ms": statistics.median(s[1] for s in later) / 1e6 if later else None})
    return out


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f}"


def report(device: str, run: dict[str, Any], rows: list[dict[str, Any]],
           stall: dict[str, Any]) -> None:
    import torch

    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(f"torch {torch.__version__} on {name}; configure(): {run['configure_ms']:.1f} ms")
    print(f"{'step':40} {'calls':>5} {'first ms':>10} {'first CPU':>10} {'later ms':>10} "
          f"{'later CPU':>10}")
    for r in rows:
        print(f"{r['step']:40} {r['calls']:5d} {_ms(r['first_ms']):>10} "
              f"{_ms(r['first_cpu_ms']):>10} {_ms(r['later_ms']):>10} {_ms(r['later_cpu_ms']):>10}")
    first_wall, first_cpu = run["calls"][0]
    print(f"first call: {(first_wall - first_cpu) / 1e6:.3f} ms of its wall time off the CPU "
          "(GIL, blocking calls, the GPU's sync, the scheduler)")
    print(f"profiler warm-up on a helper thread ({'CUDA' if device == 'cuda' else 'CPU'} "
          f"activities, {'the first' if stall.get('first_session') else 'not the first'} "
          f"kineto session of the process): {stall.get('warm_up_ms', 0):.1f} ms, "
          f"warm={stall.get('warm')}"
          f"{'; ' + stall['skipped'] if 'skipped' in stall else ''}")
    for point, figures in stall.get("entry_points", {}).items():
        launch = figures.get("longest_launch_ms")
        print(f"  {point:8} {figures['ms']:10.3f} ms; the calling thread's longest stall inside "
              f"it {figures['calling_thread_stall_ms']:.3f} ms"
              + ("" if launch is None else f", its longest kernel launch {launch:.3f} ms"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--json", default=None, help="write the figures here too")
    args = parser.parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("--device cuda: CUDA is not available to this torch "
                         f"({torch.__version__}); --device cpu runs the same steps on the CPU")
    timings = Timings()
    run = calling_steps(args.device, max(2, args.calls), timings)
    rows = table(timings, run)
    stall = profiler_stall(args.device)
    report(args.device, run, rows, stall)
    doc = {"device": args.device, "torch": torch.__version__,
           "configure_ms": run["configure_ms"], "steps": rows, "profiler_warm_up": stall}
    if args.json:
        with open(args.json, "w", encoding="utf-8") as out:
            json.dump(doc, out, indent=1)
    return doc


if __name__ == "__main__":
    main(sys.argv[1:])
