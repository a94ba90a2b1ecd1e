"""Calling-thread cost of issue 14's live features, before/after side by side in one run.

"before" = the same process with slow-call escalation and the trigger file off
(``slow_call_quantile=1.0, live_trigger=False``); "after" = both on (the defaults). Rounds are
interleaved. Prints ns/call (median) for the unsampled path and the timing tier, and their
ratios to a pass-through wrapper / an OTel span, as bench_hotpath.py does.

Run: python benchmarks/bench_live.py [--rounds 9] [--calls 20000]
"""

from __future__ import annotations

import platform
import statistics
from collections.abc import Callable
from typing import Any

import torch

# the harness of bench_hotpath.py (same folder: on the path when run as a script), so the two
# tables measure the same things the same way
from bench_hotpath import (
    body,
    discarding_provider,
    otel_span_call,
    parse_args,
    passthrough,
    per_call_ns,
)

import attnscope

OFF = {"slow_call_quantile": 1.0, "live_trigger": False}
ON = {"slow_call_quantile": 0.99, "live_trigger": True}


def main(argv: list[str] | None = None) -> dict[str, float]:
    args = parse_args(argv)
    q = torch.zeros(1, 8, 128, 64)
    plain = passthrough(body)
    unsampled = attnscope.trace(body)
    sampled = attnscope.trace(sample_rate=1.0)(passthrough(body))
    otel_span = otel_span_call(q)
    base = {"tracer_provider": discarding_provider(), "sample_rate": 0.0, "warmup_calls": 0,
            "overhead_budget": 1.0, "profile_rate": 0.0, "queue_size": 1_000_000}
    rows: dict[str, list[float]] = {}

    def measure(name: str, fn: Callable[[], Any], calls: int) -> None:
        rows.setdefault(name, []).append(per_call_ns(fn, calls))

    for _ in range(args.rounds + 1):  # the first round warms every path up and is dropped
        for label, live in (("before", OFF), ("after", ON)):
            attnscope.configure(**base, **live)  # the worker reads both settings per capture
            measure("pass-through wrapper", lambda: plain(q, q, q), args.calls)
            measure(f"unsampled, {label}", lambda: unsampled(q, q, q), args.calls)
            measure(f"timing tier, {label}", lambda: sampled(q, q, q), args.calls // 10)
            attnscope.flush(timeout_s=30)  # the worker's backlog stays out of the next row
            measure("OTel span, 10 attributes", otel_span, args.calls // 10)
    med = {name: statistics.median(v[1:]) for name, v in rows.items()}
    print(f"machine: {platform.processor() or platform.machine()}, "
          f"{platform.python_version()}, torch {torch.__version__}, rounds={args.rounds}, "
          f"calls/round={args.calls}; before = escalation and trigger off, after = on")
    print(f"{'variant':28} {'ns/call (median)':>18} {'min':>10} {'max':>10}")
    for name, v in rows.items():
        print(f"{name:28} {med[name]:18.0f} {min(v[1:]):10.0f} {max(v[1:]):10.0f}")
    out: dict[str, float] = {}
    print()
    for label in ("before", "after"):
        r1 = med[f"unsampled, {label}"] / med["pass-through wrapper"]
        r2 = med[f"timing tier, {label}"] / med["OTel span, 10 attributes"]
        out[f"unsampled_{label}"], out[f"timing_{label}"] = r1, r2
        print(f"{label:6}  unsampled / pass-through = {r1:.2f} (target <= 1.5)   "
              f"timing tier / OTel span = {r2:.2f} (target <= 0.33)")
    attnscope.shutdown(timeout_s=10)
    return out


if __name__ == "__main__":
    main()
