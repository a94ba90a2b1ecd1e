"""``attnscope demo``'s run: a tiny attention model traced end to end, no backend needed.

Two attention implementations (hand-written matmul-softmax-matmul and PyTorch SDPA) run the same
workload; every call is captured, one forward per implementation is profiled, and the trace is
summarised by ``attnscope report``'s tables, one report per implementation (and optionally kept as
Jaeger JSON).
"""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
from typing import Any, TextIO

import torch
import torch.nn.functional as F

import attnscope

from ... import _api
from ..._capture import profiler_session as profiler
from ...exporters import JaegerJSONFileExporter
from ..render.writer import check_output, write_text
from ..report import render_terminal
from ..summary import summarize
from ..traces import SpanRow, attention_calls, children_of, descendants, load_spans

__all__ = ["run_demo"]

_TOP = 5  # slowest calls and kernels per table, as `attnscope report` prints by default


@attnscope.trace(name="attention.naive")
def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    is_causal: bool = True) -> torch.Tensor:
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        sq, skv = q.shape[-2], k.shape[-2]
        keep = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(skv - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


@attnscope.trace(name="attention.sdpa")
def sdpa_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   is_causal: bool = True) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


_IMPLS = (naive_attention, sdpa_attention)


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

    def __init__(self, hidden: int = 256, layers: int = 4, heads: int = 8,
                 kv_heads: int = 2) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(DemoBlock(hidden, heads, kv_heads) for _ in range(layers))

    def forward(self, x: torch.Tensor, attention: Any) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x, attention)
        return x


def run_demo(steps: int = 20, seq_len: int = 256, jaeger_json: str | None = None,
             out: TextIO | None = None, html: str | None = None) -> int:
    """Run the demo and print its report (``html``: also as a page); returns an exit code."""
    check_output(html, "--html")  # before the model runs, not after
    out = out or sys.stdout
    scratch = None if jaeger_json else tempfile.mkdtemp(prefix="attnscope-demo-")
    trace_path = jaeger_json or os.path.join(scratch or "", "trace.json")
    torch.manual_seed(0)
    model = attnscope.instrument(TinyDecoder().eval())  # layers.N.attn spans, layer_index
    x = torch.randn(2, seq_len, 256)
    previous = _api.current()
    # the file `attnscope report` reads at the end (a scratch one when none was asked for),
    # written by attnscope's own pipeline as a user's would be: its resource shows host,
    # versions, pid and the settings in force (built from this configuration, not the previous)
    file_exporter = JaegerJSONFileExporter(trace_path, service_name="attnscope-demo")
    attnscope.configure(exporter=file_exporter, tracer_provider=None,
                        service_name="attnscope-demo", sample_rate=1.0, warmup_calls=0,
                        profile_rate=0.0, profile_max_per_minute=60, overhead_budget=1.0)
    # A service warms the profiler on attnscope's worker; the demo does it up front so that its
    # one profiled forward is not timed instead while the profiler is still cold.
    profiler.warm_up()
    try:
        with torch.inference_mode():
            for impl in (naive_attention, sdpa_attention):
                with attnscope.sampling(force=False):  # warm-up, not captured
                    model(x, impl)
            # The two take turns, step by step, the first one changing each step: a change in
            # the machine's load falls on both, and each step pairs them for the comparison.
            for step in range(steps):
                for impl in _IMPLS if step % 2 == 0 else _IMPLS[::-1]:
                    # the implementation in the name: Jaeger's search list tells the runs apart
                    short = impl.__name__.removesuffix("_attention")
                    with attnscope.span(f"demo.forward ({short})", tokens=x.shape[0] * seq_len,
                                        attributes={"demo.implementation": impl.__name__,
                                                    "demo.step": step}):
                        model(x, impl)
            for impl in _IMPLS:
                short = impl.__name__.removesuffix("_attention")
                with attnscope.span(f"demo.forward ({short}, layers profiled)", sample=True,
                                    attributes={"demo.implementation": impl.__name__}):
                    with attnscope.sampling(force=True, profile=True):  # every layer profiled
                        model(x, impl)
        attnscope.flush(timeout_s=30)
    finally:
        attnscope.shutdown(timeout_s=10)  # shuts the pipeline down: the file is written
        _api.restore(previous)
    try:
        spans = _print_reports(trace_path, jaeger_json, html, out)
    finally:
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    if jaeger_json:
        print(f"\nWrote {spans} spans to {jaeger_json} — open Jaeger UI → Search → Upload to see "
              f"the span tree (docs/jaeger.md), or `attnscope report {jaeger_json}`.", file=out)
    if html:
        print(f"Wrote the HTML report to {html}.", file=out)
    return 0


def _print_reports(trace_path: str, jaeger_json: str | None, html: str | None,
                   out: TextIO) -> int:
    """``attnscope report``'s tables once per implementation (both run on the same layers, so
    one report of the whole trace would mix them), the page of the whole trace for ``html``.
    Returns the number of spans in the trace."""
    rows = load_spans(trace_path)
    calls = attention_calls(rows)
    by_id = {r.span_id: r for r in rows}
    children = children_of(rows)
    print(f"attnscope demo — {len(rows)} spans captured (TinyDecoder: 4 layers, GQA 8/2 heads, "
          "CPU)", file=out)
    for impl in (naive_attention, sdpa_attention):
        label = impl.__name__.replace("_attention", "")
        mine = [c for c in calls if _implementation(c, by_id) == impl.__name__]
        source = f"attention.{label}" + (f" in {jaeger_json}" if jaeger_json else "")
        print("", file=out)
        # its calls' own subtrees: with the whole trace, the other implementation's profiled
        # calls were loose ones of this report (both backends in its "all layers" row, the
        # other's kernels in its table)
        subtrees = mine + [d for c in mine for d in descendants(c, children)]
        render_terminal(summarize(mine, top=_TOP, rows=subtrees), source=source,
                        spans=len(rows), top=_TOP, out=out, calls=mine)
    _print_comparison(calls, by_id, out)
    if html:
        from ..report._html import render_html  # matplotlib: only for the page

        # the whole trace: a row per layer and backend (naive's "math", SDPA's "flash")
        write_text(html, render_html(summarize(calls, top=_TOP, rows=rows), rows,
                                     source=trace_path, top=_TOP), "--html")
    return len(rows)


def _print_comparison(calls: list[SpanRow], by_id: dict[str, SpanRow], out: TextIO) -> None:
    """Which implementation is faster, with its noise: each step's attention time (the sum of
    its forward's calls) paired across the two (``attnscope compare``'s ranking)."""
    from ..compare._ranking import lines, rank

    times: dict[str, dict[int, float]] = {}
    for call in calls:
        forward: SpanRow | None = call
        while forward is not None and "demo.step" not in forward.attributes:
            forward = by_id.get(forward.parent_id) if forward.parent_id else None
        if forward is not None:
            label = str(forward.attributes.get("demo.implementation", "?")).removesuffix(
                "_attention")
            step = int(forward.attributes["demo.step"])
            by_step = times.setdefault(label, {})
            by_step[step] = by_step.get(step, 0.0) + call.duration_ns / 1e6
    print("", file=out)
    for line in lines(rank(times), "step", "--steps", "attention time per forward"):
        print(line, file=out)


def _implementation(row: SpanRow, by_id: dict[str, SpanRow]) -> str:
    """The implementation a call ran under (the ``demo.implementation`` of an enclosing span)."""
    seen: SpanRow | None = row
    while seen is not None:
        impl = seen.attributes.get("demo.implementation")
        if impl is not None:
            return str(impl)
        seen = by_id.get(seen.parent_id) if seen.parent_id else None
    return "?"
