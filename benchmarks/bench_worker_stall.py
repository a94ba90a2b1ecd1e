"""How long the application's thread waits at a time while the worker finishes profiled captures.

The worker builds spans in Python and holds the GIL while it does. A thread of the application
that needs the GIL meanwhile (between two torch operations, which release it) waits until the
worker hands it back: after each capture once 2 ms of work have passed, or when the interpreter
forces a switch (every 5 ms). A profiled capture is milliseconds of work in one piece (torch's
profiler events read and analysed), so it was one wait of that length: on a GPU, where the
calling thread launches a decode step's kernels and every wait is the user's latency, a whole
step's worth.

Each round: ``--captures`` profiled attention calls are made while the worker gathers (it waits
up to a second for more before it starts), then a helper thread calls ``attnscope.flush()``,
which starts the worker on the batch, and this thread runs a loop of small torch operations
(each releases and takes back the GIL) until the flush returns, timing each iteration. The
iterations beyond 0.5 ms are waits for the GIL. Printed: the longest wait, the 99.9th
percentile of the iterations, the waits' count and total, and the worker's CPU per capture.

Run: python benchmarks/bench_worker_stall.py [--rounds 5] [--captures 10] [--tier profile|timing]
Linux only (the worker thread's CPU clock); CPU.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import attnscope

_WAIT_S = 0.0005  # an iteration longer than this waited for the GIL


class Discard(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _worker_cpu_ns() -> int:
    from attnscope._runtime import runtime

    worker = runtime.worker.current  # its thread is attnscope's private business
    assert worker is not None and worker.thread.ident is not None
    return time.clock_gettime_ns(time.pthread_getcpuclockid(worker.thread.ident))


def one_round(captures: int) -> tuple[list[float], int]:
    """(each loop iteration's seconds while the worker took the batch, the worker's CPU ns)."""
    q = torch.randn(1, 8, 64, 64)
    attnscope.flush()
    time.sleep(0.05)  # the worker is asleep: the first call below wakes it, and it gathers
    for _ in range(captures):
        attention(q, q, q)
    before = _worker_cpu_ns()
    flusher = threading.Thread(target=attnscope.flush, kwargs={"timeout_s": 60})
    x = torch.zeros(64)
    times: list[float] = []
    flusher.start()
    while flusher.is_alive():
        t = time.perf_counter()
        torch.add(x, 1)
        times.append(time.perf_counter() - t)
    return times, _worker_cpu_ns() - before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--captures", type=int, default=10)
    parser.add_argument("--tier", choices=("profile", "timing"), default="profile")
    args = parser.parse_args()
    profile = args.tier == "profile"
    attnscope.configure(exporter=Discard(), sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=1.0 if profile else 0.0, profile_max_per_minute=1e6,
                        metrics=False)
    q = torch.randn(1, 8, 64, 64)
    for _ in range(3):  # the worker started, the profiler warm
        attention(q, q, q)
    attnscope.flush()
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, tier={args.tier}, {args.captures} captures a round")
    print(f"{'round':>5} {'longest wait':>13} {'p99.9':>9} {'waits':>6} {'waited':>9} "
          f"{'worker/capture':>15}")
    longest = []
    for n in range(args.rounds):
        times, cpu_ns = one_round(args.captures)
        waits = [t for t in times if t > _WAIT_S]
        ordered = sorted(times)
        p999 = ordered[min(len(ordered) - 1, int(0.999 * len(ordered)))]
        longest.append(max(times))
        print(f"{n + 1:>5} {max(times) * 1e3:>10.2f} ms {p999 * 1e3:>6.2f} ms {len(waits):>6} "
              f"{sum(waits) * 1e3:>6.1f} ms {cpu_ns / args.captures / 1e3:>12.0f} µs")
    print(f"median of the rounds' longest wait: {statistics.median(longest) * 1e3:.2f} ms")
    attnscope.shutdown()


if __name__ == "__main__":
    main()
