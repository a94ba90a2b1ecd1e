"""``attnscope demo``: a tiny attention model traced end to end, no backend needed.

Two attention implementations (hand-written matmul-softmax-matmul and PyTorch SDPA) run the same
workload; every call is captured, one forward per implementation is profiled, and the spans are
summarised as a table (and optionally written as Jaeger JSON).
"""

from __future__ import annotations

import dataclasses
import math
import os
import shutil
import statistics
from collections import defaultdict
from typing import Any, TextIO

import torch
import torch.nn.functional as F
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import attnscope

from .. import _api
from ..capture import profiler
from ..export.destinations import resource
from ._errors import positive_int

__all__ = ["run_demo", "register"]


@attnscope.trace(name="attention.naive")
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        sq, skv = q.shape[-2], k.shape[-2]
        keep = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(skv - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@attnscope.trace(name="attention.sdpa")
def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


class DemoAttention(torch.nn.Module):
    """Grouped-query self-attention (8 query heads, 2 KV heads) around a pluggable core."""

    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        # the names instrument() reads, as in transformers' attention layers
        self.num_heads, self.num_key_value_heads = heads, kv_heads
        self.head_dim, self.is_causal = hidden // heads, True
        self.qkv = torch.nn.Linear(hidden, (heads + 2 * kv_heads) * self.head_dim)
        self.out = torch.nn.Linear(hidden, hidden)

    def forward(self, hidden_states: torch.Tensor, attention: Any) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        heads, kv_heads = self.num_heads, self.num_key_value_heads
        h = self.qkv(hidden_states).view(b, s, heads + 2 * kv_heads, self.head_dim).transpose(1, 2)
        q, k, v = h.split([heads, kv_heads, kv_heads], dim=1)
        k, v = k.repeat_interleave(heads // kv_heads, 1), v.repeat_interleave(heads // kv_heads, 1)
        core: torch.Tensor = attention(q, k, v, is_causal=True)
        out: torch.Tensor = self.out(core.transpose(1, 2).reshape(b, s, -1))
        return out


class DemoBlock(torch.nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(hidden)
        self.attn = DemoAttention(hidden, heads, kv_heads)

    def forward(self, x: torch.Tensor, attention: Any) -> torch.Tensor:
        attended: torch.Tensor = self.attn(self.norm(x), attention)
        return x + attended


class TinyDecoder(torch.nn.Module):
    """Four pre-norm attention blocks; ``instrument()`` finds their attention layers."""

    def __init__(self, hidden: int = 256, layers: int = 4, heads: int = 8, kv_heads: int = 2) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(DemoBlock(hidden, heads, kv_heads) for _ in range(layers))

    def forward(self, x: torch.Tensor, attention: Any) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, attention)
        return x


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope demo`` to the command line."""
    parser = sub.add_parser(
        "demo", formatter_class=formatter,
        help="trace a small built-in model on the CPU and print what attnscope saw",
        description="Trace a small built-in model (4 attention layers) with two attention "
                    "implementations on the CPU, no backend needed, and print what attnscope saw.")
    parser.add_argument("--steps", type=positive_int, default=20,
                        help="forward passes per implementation")
    parser.add_argument("--seq-len", type=positive_int, default=256, help="tokens per sequence")
    parser.add_argument("--jaeger-json", default="attnscope-demo-trace.json",
                        help="also write the spans here for Jaeger's Upload tab ('' to skip)")
    parser.add_argument("--html", metavar="PATH", default=None,
                        help="also write the `attnscope report` of the spans as an HTML page")
    parser.set_defaults(func=_main)


def _main(args: Any) -> int:
    import sys

    return run_demo(steps=args.steps, seq_len=args.seq_len, jaeger_json=args.jaeger_json or None,
                    html=args.html, out=sys.stdout)


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(p / 100 * len(ordered)) - 1))]


def run_demo(steps: int = 20, seq_len: int = 256, jaeger_json: str | None = None,
             out: TextIO | None = None, html: str | None = None) -> int:
    """Run the demo and print its report (``html``: also as a page); returns an exit code."""
    import sys
    import tempfile

    out = out or sys.stdout
    scratch = None if jaeger_json else tempfile.mkdtemp(prefix="attnscope-demo-")
    trace_path = jaeger_json or os.path.join(scratch or "", "trace.json")
    torch.manual_seed(0)
    model = attnscope.instrument(TinyDecoder().eval())  # layers.N.attn spans, layer_index
    x = torch.randn(2, seq_len, 256)
    memory = InMemorySpanExporter()
    previous = _api.current()
    # the resource attnscope gives its own providers: the trace shows host, versions, pid
    provider = TracerProvider(resource=resource(dataclasses.replace(
        previous, service_name="attnscope-demo")))
    provider.add_span_processor(SimpleSpanProcessor(memory))
    from ..export.jaeger_json import JaegerJSONFileExporter

    # the file `attnscope report` reads at the end (a scratch one when none was asked for)
    file_exporter = JaegerJSONFileExporter(trace_path, service_name="attnscope-demo")
    provider.add_span_processor(SimpleSpanProcessor(file_exporter))
    attnscope.configure(tracer_provider=provider, sample_rate=1.0, warmup_calls=0, profile_rate=0.0,
                        profile_max_per_minute=60, overhead_budget=1.0)
    # A service warms the profiler on attnscope's worker; the demo does it up front so that its
    # one profiled forward is not timed instead while the profiler is still cold.
    profiler.warm_up()
    try:
        with torch.inference_mode():
            for impl in (naive_attention, sdpa_attention):
                with attnscope.sampling(force=False):  # warm-up, not captured
                    model(x, impl)
                for step in range(steps):
                    with attnscope.span("demo.forward", tokens=x.shape[0] * seq_len,
                                        attributes={"demo.implementation": impl.__name__}):
                        model(x, impl)
                with attnscope.span("demo.forward.profiled", sample=True,
                                    attributes={"demo.implementation": impl.__name__}):
                    with attnscope.sampling(force=True, profile=True):  # every layer profiled
                        model(x, impl)
        attnscope.flush(timeout_s=30)
    finally:
        attnscope.shutdown(timeout_s=10)
        _api.restore(previous)
    spans = list(memory.get_finished_spans())
    file_exporter.force_flush()
    provider.shutdown()
    _report(spans, out)
    try:
        _full_report(trace_path, html, out)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if jaeger_json:
        print(f"\nWrote {len(spans)} spans to {jaeger_json} — open Jaeger UI → Search → Upload to see "
              f"the span tree (docs/jaeger.md), or `attnscope report {jaeger_json}`.", file=out)
    if html:
        print(f"Wrote the HTML report to {html}.", file=out)
    return 0


def _full_report(trace_path: str, html: str | None, out: TextIO) -> None:
    """``attnscope report`` of the demo's spans: per layer, kernels, slowest calls."""
    try:
        from ._report import run_report
    except ImportError:  # the tables and plots need the cli extra
        print("\n(pip install 'attnscope[cli]' for the per-layer report)", file=out)
        return
    print("", file=out)
    run_report(trace_path, html=html, out=out)


def _report(spans: list[ReadableSpan], out: TextIO) -> None:
    by_name: dict[str, list[dict[str, Any]]] = defaultdict(list)
    kernels: dict[str, list[ReadableSpan]] = defaultdict(list)
    names = {s.context.span_id: s.name for s in spans}
    by_id = {s.context.span_id: s for s in spans}
    for s in spans:
        a = dict(s.attributes or {})
        parent = by_id.get(s.parent.span_id) if s.parent is not None else None
        under_profiler = parent is not None and dict(parent.attributes or {}).get(
            "attnscope.tier") == "profile"
        if s.name.startswith("attention.") and a.get("attnscope.tier") == "timing" \
                and not under_profiler:
            by_name[s.name].append(a)
        if s.parent is not None and names.get(s.parent.span_id, "").startswith("attention.") \
                and "attnscope.kernel.kind" in a:
            kernels[names[s.parent.span_id]].append(s)
    print(f"attnscope demo — {len(spans)} spans captured (TinyDecoder: 4 layers, GQA 8/2 heads, CPU)\n",
          file=out)
    header = (f"{'implementation':18} {'calls':>5} {'p50 µs':>9} {'p95 µs':>9} {'p99 µs':>9} "
              f"{'GFLOP/call':>10} {'GFLOP/s':>8} {'tokens/s':>11}")
    print(header, file=out)
    print("-" * len(header), file=out)
    for name, rows in sorted(by_name.items()):
        walls = [r["attnscope.wall_ns"] / 1e3 for r in rows]
        flops = rows[0].get("attnscope.flops", 0)
        tflops = statistics.median(r.get("attnscope.tflops", 0.0) for r in rows)
        tps = statistics.median(r.get("attnscope.tokens_per_s", 0.0) for r in rows)
        print(f"{name:18} {len(rows):5d} {_pct(walls, 50):9.0f} {_pct(walls, 95):9.0f} "
              f"{_pct(walls, 99):9.0f} {flops / 1e9:10.3f} {tflops * 1e3:8.2f} {tps:11.0f}", file=out)
    profiled = [s for s in spans if dict(s.attributes or {}).get("attnscope.tier") == "profile"]
    if profiled:
        print("\nprofiled calls (torch.profiler, one forward per implementation):", file=out)
        for s in profiled:
            a = dict(s.attributes or {})
            top_names: Any = a.get("attnscope.kernel.top_names") or ()
            top = ", ".join(str(n) for n in list(top_names)[:3]) if isinstance(top_names, (list, tuple)) else ""
            impl = _implementation(s, by_id)
            print(f"  {impl:18} {s.name:14} backend={a.get('attnscope.backend', '?'):9} "
                  f"ops={a.get('attnscope.kernel.count', '?')}  top: {top}", file=out)
    else:
        print("\n(no profile-tier spans: torch.profiler capture was unavailable)", file=out)


def _implementation(span: ReadableSpan, by_id: dict[int, ReadableSpan]) -> str:
    """The implementation a span ran under (the ``demo.implementation`` of an enclosing span)."""
    seen: ReadableSpan | None = span
    while seen is not None:
        impl = dict(seen.attributes or {}).get("demo.implementation")
        if impl is not None:
            return str(impl)
        seen = by_id.get(seen.parent.span_id) if seen.parent is not None else None
    return "?"
