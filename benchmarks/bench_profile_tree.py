"""Operator spans of one profiled Llama attention layer (CPU): flat list before, folded tree now.

A transformers ``LlamaForCausalLM`` built from a config (1 layer, hidden 256, 8 heads / 4 KV
heads, sequence 256), ``attnscope.instrument()``-ed, ``profile_rate=1``: every call of the layer's
``self_attn`` is profiled. For each profiled call the profiler's events are kept and turned into
child spans twice, side by side:

- **before** — what attnscope did until issue 11: every op a sibling span, the
  ``max_kernel_spans − 1`` with the most own time kept, the rest one ``other`` span;
- **after** — :func:`attnscope._profiles.kernels.analyze` now: ops nested as they ran,
  views and ops under the fold threshold folded into their parent's own time, the same cap.

Columns: op spans (``other`` included); the share of the layer's operator time that named op
spans account for (summed own time of the named spans ÷ summed own time of all ops: what the
trace shows op by op); the same as a share of the layer's wall time; the summed duration of the
spans directly under the layer span ÷ its duration (above 100%: overlapping siblings, what made
Jaeger's statistics report self time over 100%).

Target (issue 11): ≥ 95% of the time in ≤ 20 spans.

Run: python benchmarks/bench_profile_tree.py [--calls 5] [--attn sdpa|eager|both]
"""

from __future__ import annotations

import argparse
import platform
import statistics
from typing import Any

import torch

import attnscope
from attnscope._capture import profiler_session as _profiler
from attnscope._profiles import kernels
from attnscope.testing import capture_spans


def build_model(attn: str) -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                      num_attention_heads=8, num_key_value_heads=4, vocab_size=1000,
                      max_position_embeddings=512)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def before(events: list[kernels.RawEvent], max_spans: int, wall: int) -> dict[str, float]:
    """The flat list attnscope emitted before: one sibling span per op, capped."""
    ops = sorted((e for e in events if e.kind == kernels.KIND_CPU_OP), key=lambda e: e.start_ns)
    own = [e.end_ns - e.start_ns for e in ops]
    stack: list[int] = []
    for i, op in enumerate(ops):
        while stack and ops[stack[-1]].end_ns <= op.start_ns:
            stack.pop()
        if stack:
            own[stack[-1]] -= op.end_ns - op.start_ns
        stack.append(i)
    own = [max(0, t) for t in own]
    total = sum(own)
    order = sorted(range(len(ops)), key=lambda i: -own[i])
    kept = order if len(ops) <= max_spans else order[: max_spans - 1]
    kept_own = sum(own[i] for i in kept)
    # every kept op is a sibling lasting its whole duration; `other` lasts the rest's own time
    sibling_ns = sum(ops[i].end_ns - ops[i].start_ns for i in kept) + (total - kept_own)
    return {"spans": min(len(ops), max_spans), "ops": len(ops), "share_ops": kept_own / total,
            "share_wall": kept_own / wall, "siblings": sibling_ns / wall}


def after(report: kernels.KernelReport, total_own: int, wall: int) -> dict[str, float]:
    named = [c for c in report.children if c.name != "other"]
    own = sum(c.attributes.get("attnscope.kernel.self_ns", 0) for c in named)
    top = [c for c in report.children if c.parent < 0]
    return {"spans": len(report.children), "share_ops": own / total_own, "share_wall": own / wall,
            "siblings": sum(c.end_ns - c.start_ns for c in top) / wall}


def run(attn: str, calls: int, max_spans: int) -> list[tuple[dict[str, float], dict[str, float]]]:
    model = build_model(attn)
    attnscope.instrument(model)
    ids = torch.randint(0, 1000, (1, 256))
    seen: list[tuple[list[kernels.RawEvent], dict[str, Any]]] = []
    analyze = kernels.analyze

    def keep(events: Any, **kw: Any) -> kernels.KernelReport:
        seen.append((list(events), kw))
        return analyze(events, **kw)

    kernels.analyze = keep  # type: ignore[assignment]
    try:
        with torch.inference_mode():
            model(ids)  # warm (first-call allocations, lazy inits)
            with capture_spans(profile_rate=1.0, profile_max_per_minute=1e6, sample_rate=1.0,
                               warmup_calls=0, max_kernel_spans=max_spans):
                for _ in range(calls):
                    model(ids)
    finally:
        kernels.analyze = analyze  # type: ignore[assignment]
        attnscope.uninstrument(model)
    rows = []
    for events, kw in seen:
        wall = kw["span_end_ns"] - kw["span_start_ns"]
        report = analyze(events, **kw)
        rows.append((before(events, max_spans, wall),
                     after(report, report.attributes["kernel.total_ns"], wall)))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--attn", choices=("sdpa", "eager", "both"), default="both")
    parser.add_argument("--max-kernel-spans", type=int, default=64)
    args = parser.parse_args(argv)
    if not _profiler.warm_up():
        raise SystemExit("the profiler did not warm up")
    print(f"torch {torch.__version__}, {platform.machine()}, {args.calls} profiled calls each, "
          f"max_kernel_spans={args.max_kernel_spans}; medians")
    print(f"{'layer':<8} {'':<7} {'ops':>5} {'op spans':>9} {'op time':>8} {'wall':>7} "
          f"{'siblings':>9}")
    for attn in (("sdpa", "eager") if args.attn == "both" else (args.attn,)):
        rows = run(attn, args.calls, args.max_kernel_spans)
        ops = statistics.median(b["ops"] for b, _ in rows)
        for label, idx in (("before", 0), ("after", 1)):
            col = [r[idx] for r in rows]

            def med(key: str, col: list[dict[str, float]] = col) -> float:
                return statistics.median(c[key] for c in col)

            print(f"{attn:<8} {label:<7} {ops:>5.0f} {med('spans'):>9.0f} {med('share_ops'):>8.1%} "
                  f"{med('share_wall'):>7.1%} {med('siblings'):>9.1%}")


if __name__ == "__main__":
    main()
