"""The worker thread's cost, measured side by side in one run.

Prints, per emitted timing-tier span, the worker thread's CPU time (what it takes from the
application: the GIL and a core) next to the cost of building the same span directly with the
OpenTelemetry SDK (same attributes, same provider, processor and exporter) — the floor. Also the
worker's wake-ups and CPU while the process is idle (target: none).

Both set-ups by default, one after the other in the same process: metrics off, then metrics on (an
in-memory meter provider; the worker records one duration histogram value per span). For the
latter, a second reference: the same SDK span plus the same histogram record done by hand.

By default attnscope exports through a provider of its own (``exporter=`` a SpanExporter), the
usual set-up; ``--app-provider`` hands it the application's provider instead (``tracer_provider=``),
where spans go through the SDK's ``Tracer.start_span``.

Full collections of the garbage collector are kept out of both sides: after the warm-up the
heap is frozen (``gc.freeze()``). A full collection scans the whole heap (torch and the SDK);
left in, one lands in most rounds of 5000 spans, on whichever thread allocates when the threshold
trips, usually the reference's, so the comparison measured where the collector happened to run
(the figures: docs/benchmarks.md, "Metrics recorded a batch at a time"). Young collections, which
each side's own allocations cause, still run and are counted where they run.

Run: python benchmarks/bench_worker.py [--spans 5000] [--rounds 5] [--metrics [off|on|both]]
                                      [--app-provider]
Linux only (reads /proc for per-thread figures: the scheduler's nanosecond count where the kernel
keeps one, else clock ticks).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import statistics
import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import set_span_in_context

import attnscope


def _worker() -> Any:
    """The running worker (also of attnscope versions before the reshaping, for A/B runs)."""
    try:
        from attnscope._runtime import runtime
    except ImportError:
        try:
            from attnscope._state import state  # type: ignore[import-not-found]
        except ImportError:
            from attnscope import _worker as old  # type: ignore[attr-defined]

            return old.get()
        return state.worker
    return runtime.worker.current


class Keep(SpanExporter):
    """Drops spans but remembers the last one (to copy its attributes for the reference)."""

    def __init__(self) -> None:
        self.last: ReadableSpan | None = None

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if spans:
            self.last = spans[-1]
        return SpanExportResult.SUCCESS


def _thread_cpu_ns(native_id: int) -> int:
    """CPU time of one thread of this process: the scheduler's runtime in ns (schedstat), else
    user + system from stat (clock ticks, 10 ms: keep the span counts large then)."""
    try:
        with open(f"/proc/self/task/{native_id}/schedstat") as fh:
            return int(fh.read().split()[0])
    except (OSError, ValueError, IndexError):
        pass
    with open(f"/proc/self/task/{native_id}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    ticks = int(fields[11]) + int(fields[12])  # utime, stime
    return ticks * 1_000_000_000 // os.sysconf("SC_CLK_TCK")


def _switches(native_id: int) -> int:
    with open(f"/proc/self/task/{native_id}/status") as fh:
        for line in fh:
            if line.startswith("voluntary_ctxt_switches"):
                return int(line.split()[1])
    return 0


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> Any:
    return q


def worker_round(n: int) -> float:
    """Worker CPU ns per span for ``n`` spans (CPU ticks are 10 ms: keep n large)."""
    q = torch.zeros(1, 8, 128, 64)
    worker = _worker()
    assert worker is not None
    tid = worker.thread.native_id
    before_cpu, before_emitted = _thread_cpu_ns(tid), worker.builder.stats.emitted
    for _ in range(n):
        attention(q, q, q)
    assert attnscope.flush(timeout_s=60)
    emitted = worker.builder.stats.emitted - before_emitted
    return (_thread_cpu_ns(tid) - before_cpu) / max(1, emitted)


def reference_round(tracer: Any, name: str, attrs: dict[str, Any], n: int,
                    histogram: Any = None, labels: dict[str, str] | None = None) -> float:
    """CPU ns per span to build the same span directly, on a thread of its own (and, given a
    ``histogram``, to record its duration there in the span's context, as the worker does)."""
    out: list[float] = []

    def run() -> None:
        t0 = time.thread_time_ns()
        for _ in range(n):
            start = time.time_ns()
            span = tracer.start_span(name, attributes=attrs, start_time=start)
            span.end(end_time=start + 1000)
            if histogram is not None:
                histogram.record(1e-6, labels, context=set_span_in_context(span))
        out.append((time.thread_time_ns() - t0) / n)

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out[0]


def idle_figures(seconds: float) -> tuple[int, float]:
    worker = _worker()
    assert worker is not None
    tid = worker.thread.native_id
    s0, c0 = _switches(tid), _thread_cpu_ns(tid)
    time.sleep(seconds)
    return _switches(tid) - s0, (_thread_cpu_ns(tid) - c0) / 1e6


def measure(args: argparse.Namespace, metrics: bool) -> dict[str, Any]:
    """One set-up (metrics on or off): rounds of the worker and of the reference, then idling."""
    exporter = Keep()
    # The reference: the same exporter behind the SDK's own provider and batch processor.
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=1 << 16))
    meter = MeterProvider(metric_readers=[InMemoryMetricReader()]) if metrics else None
    destination: dict[str, Any] = (
        {"tracer_provider": provider} if args.app_provider else {"exporter": exporter})
    attnscope.configure(sample_rate=1.0, warmup_calls=0, overhead_budget=1.0, profile_rate=0.0,
                        queue_size=1 << 16, metrics=metrics, meter_provider=meter,
                        **destination)
    q = torch.zeros(1, 8, 128, 64)
    attention(q, q, q)  # starts the worker
    assert attnscope.flush(timeout_s=30)
    worker_round(500)  # warm
    gc.collect()
    gc.freeze()  # see the module docstring: full collections out of the figures
    last = exporter.last
    assert last is not None
    attrs = dict(last.attributes or {})
    tracer = provider.get_tracer("reference")
    histogram = None
    if meter is not None:  # the same instrument, on a provider of its own
        histogram = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter(
            "reference").create_histogram("attnscope.attention.duration", unit="s")
    labels = {"attnscope.module_class": last.name, "attnscope.device": str(attrs.get(
        "attnscope.device", "cpu"))}
    ours, ref, ref_metrics = [], [], []
    for _ in range(args.rounds):
        ours.append(worker_round(args.spans))
        ref.append(reference_round(tracer, last.name, attrs, args.spans))
        if histogram is not None:
            ref_metrics.append(reference_round(tracer, last.name, attrs, args.spans,
                                               histogram, labels))
    idle_switches, idle_cpu_ms = idle_figures(2.0)
    attnscope.shutdown()
    provider.shutdown()
    gc.unfreeze()
    return {"ours": ours, "ref": ref, "ref_metrics": ref_metrics, "attrs": len(attrs),
            "idle": (idle_switches, idle_cpu_ms)}


def _row(label: str, values: Sequence[float]) -> str:
    return (f"{label:52} {statistics.median(values) / 1e3:9.1f} {min(values) / 1e3:9.1f} "
            f"{max(values) / 1e3:9.1f}")


def _ratio(ours: Sequence[float], ref: Sequence[float]) -> float:
    return statistics.median(o / r for o, r in zip(ours, ref, strict=True))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spans", type=int, default=5000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--metrics", nargs="?", const="on", default="both",
                        choices=("off", "on", "both"),
                        help="record metrics too (in memory): off, on, or both set-ups in turn "
                             "(the default; --metrics alone: on)")
    parser.add_argument("--app-provider", action="store_true",
                        help="give attnscope the application's TracerProvider")
    args = parser.parse_args(argv)
    modes = {"off": (False,), "on": (True,), "both": (False, True)}[args.metrics]
    results = {m: measure(args, m) for m in modes}

    n_attrs = next(iter(results.values()))["attrs"]
    print(f"python {platform.python_version()}  torch {torch.__version__}  "
          f"attnscope {attnscope.__version__}  {args.spans} spans x {args.rounds} rounds  "
          f"span attributes: {n_attrs}  "
          f"provider={'application' if args.app_provider else 'attnscope'}  "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}  cpus {os.cpu_count()}")
    print(f"{'':52} {'median':>9} {'min':>9} {'max':>9}")
    for metrics, r in results.items():
        tag = "metrics " + ("on" if metrics else "off")
        print(_row(f"[{tag}] worker CPU per emitted span (us)", r["ours"]))
        print(_row(f"[{tag}] OTel SDK span, same attributes (us)", r["ref"]))
        if r["ref_metrics"]:
            print(_row(f"[{tag}] SDK span + histogram record by hand (us)", r["ref_metrics"]))
        print(f"[{tag}] ratio worker / OTel span (median of rounds): "
              f"{_ratio(r['ours'], r['ref']):.2f}")
        if r["ref_metrics"]:
            print(f"[{tag}] ratio worker / SDK span + histogram record: "
                  f"{_ratio(r['ours'], r['ref_metrics']):.2f}")
        switches, cpu_ms = r["idle"]
        print(f"[{tag}] idle 2 s: worker wake-ups {switches}, worker CPU {cpu_ms:.1f} ms")


if __name__ == "__main__":
    main()
