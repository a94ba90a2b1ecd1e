"""``attnscope report --html``: the report as one self-contained page with plots.

Plots (matplotlib, inline SVG via :mod:`..render.html`): latency distribution per layer and
phase, time per layer split by phase, the roofline (:mod:`._roofline_plot`), the
kernel/operator breakdown of the profiled calls; the timeline of the slowest profiled call is SVG
drawn by :mod:`._timeline`. Tables: the per-layer numbers, the roofline's points and the slowest
calls.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from ... import _schema as schema
from ..e2e import OUTSIDE_BLOCKS
from ..render.html import PALETTE, PHASE_COLOUR, PHASES, escape, figure, page, svg, table
from ..render.units import MISSING, duration, si, when
from ..runinfo import describe
from ..summary import GroupStats, Summary, latency_rows, shape_text, time_ns, wall_ns
from ..traces import SpanRow, attention_calls, group_key
from . import (
    BLOCKS,
    FIRST_NOTE,
    INEXACT_MARK,
    backend_cell,
    first_mark,
    inexact_lines,
    kernel_calls,
    share_cell,
    times_cell,
)
from ._fallbacks import fallback_lines
from ._replayed import replayed_lines
from ._requests import requests_html
from ._roofline_plot import roofline_section
from ._timeline import spans_under, timeline_svg

__all__ = ["render_html"]


def render_html(summary: Summary, rows: Sequence[SpanRow], *, source: str, top: int,
                context: Any = None) -> str:
    """The whole page as text; ``context``: the report's ``Context`` (run, end to end)."""
    calls = attention_calls(rows)
    head = [] if context is None else [("Run", _run(context.run))]
    e2e = [] if context is None or not (context.e2e.generates or context.e2e.shares
                                        or context.e2e.blocks) else [
        ("End to end: generate(), the model's forwards, your blocks", _end_to_end(context.e2e))]
    sections = [
        *head,
        ("Per layer and phase", _numbers(summary, duration, si)),
        ("Latency distribution per layer", _latency_plot(summary, calls)),
        ("Time per layer, by phase", _time_plot(summary)),
        ("Roofline per attention layer", roofline_section(summary, calls)),
        *_fallbacks(summary, calls),
        *_replayed(summary, calls),
        ("Kernels and operators of the profiled calls", _kernel_plot(summary, top, duration)),
        ("Timeline of one profiled call", _timeline(summary, rows, calls, duration)),
        *e2e,
        *([] if context is None or context.requests is None else [
            ("Requests: what attention cost each one (estimated)",
             requests_html(context.requests, top))]),
        ("Slowest calls", _slowest(summary, duration)),
    ]
    rates = ", ".join(f"{r:g}" for r in summary.sample_rates)
    subtitle = (f"{source} · {summary.overall.calls} attention calls sampled (sample rate "
                f"{rates}), {summary.overall.profiled} profiled · "
                f"services: {', '.join(summary.services) or MISSING}")
    return page("attnscope report", sections, subtitle=subtitle)


def _run(info: dict[str, Any]) -> str:
    lines = describe(info)
    if not lines:
        return "<p class=\"note\">No run metadata in this trace (written by an older attnscope)."
    return "<p class=\"note\">" + "<br>".join(escape(line) for line in lines) + "</p>"


def _end_to_end(e2e: Any) -> str:
    parts = []
    if e2e.generates:
        parts.append(table(
            ["call", "calls", "timed", "p50", "p95", "out tok/s", "TTFT p50", "TPOT p50",
             "TTFT of", "TPOT of"],
            [[g.name, g.calls, g.used, duration(g.wall.p50), duration(g.wall.p95),
              si(g.tokens_per_s), duration(g.ttft.p50 if g.ttft else None),
              duration(g.tpot.p50 if g.tpot else None), g.ttft_calls, g.tpot_calls]
             for g in e2e.generates], left=(0,)))
    if e2e.shares:
        parts.append(table(
            ["model", "phase", "forwards", "timed", "attn calls", "model time", "attention",
             "share"],
            [[s.model, s.phase or MISSING, s.forwards, s.used, s.calls, duration(s.model_ns),
              duration(s.attention_ns) if s.calls else MISSING,
              share_cell(s.share, s.share_interval, s.sampled)]
             for s in e2e.shares], left=(0, 1)))
    if e2e.blocks:
        parts.append(table(
            list(BLOCKS),
            [[b.name, b.calls, b.used, duration(b.wall.p50), duration(b.wall.p95),
              duration(b.wall.p99), si(b.tokens_per_s), b.attention_calls,
              share_cell(b.share, b.share_interval, b.sampled)] for b in e2e.blocks],
            left=(0,)))
        if e2e.outside_blocks:
            line = OUTSIDE_BLOCKS.format(e2e.outside_blocks)
            parts.append(f"<p class=\"note\">{escape(line)}</p>")
    note = ("<p class=\"note\">Wall times. TTFT: the end of a call's prefill forward − its start; "
            "TPOT: the rest ÷ its decode forwards (only where all of them were traced). "
            "Attention's share: the attention calls in the traced forwards (blocks) ÷ their "
            "time, weighted by 1/sample rate; below rate 1, with its 95% bootstrap interval "
            "over the forwards (blocks), or ≈ when they are too few for one. Blocks: your "
            "attnscope.span blocks and @trace'd functions that are not attention calls. Timed: "
            "with no profiled span in "
            "them (the call, a forward or a layer: the profiler slows them), unless all have "
            "one.</p>")
    return note + "".join(parts)


def _replayed(summary: Summary, calls: Sequence[SpanRow]) -> list[tuple[str, str]]:
    """The terminal's ``⟳`` lines (:mod:`._replayed`), as a section when there are any."""
    lines = replayed_lines(summary, calls)
    if not lines:
        return []
    note = ("<p class=\"note\">Calls captured into a CUDA graph, timed in sampled replays of it "
            "(<code>attnscope.replayed</code>): summarised like any call; each span sits under "
            "its replay's <code>cuda_graph.replay</code> span.</p>")
    body = "\n".join(escape(line) for line in lines)
    return [("CUDA graph replays",
             f"{note}<pre class=\"replayed\" style=\"white-space: pre-wrap\">{body}</pre>")]


def _fallbacks(summary: Summary, calls: Sequence[SpanRow]) -> list[tuple[str, str]]:
    """The terminal's ``Fallback:`` lines (:mod:`._fallbacks`), as a section when there are any."""
    lines = fallback_lines(summary, calls)
    if not lines:
        return []
    note = ("<p class=\"note\">Calls that ran SDPA's math kernel while a fused one was "
            "eligible, or because none was (<code>attnscope.backend.fallback</code>), per layer "
            "and phase and per reason (<code>attnscope.backend.expected</code>, "
            "<code>attnscope.backend.reason</code>).</p>")
    body = "\n".join(escape(line) for line in lines)
    return [("Silent fallbacks",
             f"{note}<pre class=\"fallbacks\" style=\"white-space: pre-wrap\">{body}</pre>")]


def _label(g: GroupStats) -> str:
    return f"{g.label} · {g.phase}" if g.phase else g.label


def _numbers(summary: Summary, duration: Any, si: Any) -> str:
    cost, sampled = summary.price_per_hour is not None, summary.sampled
    headers = (["layer", "phase", "calls"] + (["est. calls"] if sampled else [])
               + ["profiled", "tokens", "min", "p5", "p50", "p95", "p99", "max", "tokens/s",
                  "FLOP/s", "core FLOP/s", "backend"] + (["$ / 1k tokens"] if cost else []))
    body = []
    for g in [*summary.groups, summary.overall]:
        w = g.wall
        row = [g.label, g.phase or MISSING, g.calls] \
            + ([f"{g.estimated_calls:,.0f}"] if sampled else []) \
            + [g.profiled, MISSING if g.tokens is None else f"{g.tokens:,}",
               *(duration(v) for v in (w.min, w.p5, w.p50, w.p95, w.p99, w.max)),
               si(g.tokens_per_s),
               si(g.tflops * 1e12 if g.tflops is not None else None)
               + (INEXACT_MARK if g.inexact else ""),
               si(g.core_tflops * 1e12 if g.core_tflops is not None else None),
               backend_cell(summary, g)]
        if cost:
            row.append(MISSING if g.cost_per_1k_tokens is None else f"{g.cost_per_1k_tokens:.3g}")
        body.append(row)
    note = ("<p class=\"note\">Calls, tokens and FLOPs are of every sampled call; percentiles "
            "(wall time), tokens/s and FLOP/s of the timed calls, those not profiled (the "
            "profiler slows a call): Σ tokens or FLOPs ÷ Σ time (device time where measured) "
            "over them; core FLOP/s: the profiled calls' FLOPs ÷ their attention-core time."
            + (" 'est. calls' re-weights the count by 1/sample_rate." if sampled else "")
            + " A layer that ran under several backends has one row per backend.</p>")
    inexact = inexact_lines(summary)
    if inexact:
        note += "<p class=\"note\">" + "<br>".join(escape(line) for line in inexact) + "</p>"
    return note + table(headers, body, left=(0, 1, len(headers) - 1 - int(cost)))


def _latency_plot(summary: Summary, calls: Sequence[SpanRow]) -> str:
    groups = summary.groups
    if not groups:
        return "<p class=\"note\">No attention calls.</p>"
    values: dict[tuple[str, str | None], list[SpanRow]] = {}
    for r in calls:
        values.setdefault((summary.label_of(r), group_key(r)[1]), []).append(r)
    fig = figure(11, 0.9 + 0.42 * len(groups))
    ax = fig.subplots()
    data = [[wall_ns(r) / 1e6 for r in latency_rows(values[(g.label, g.phase)], summary.within)]
            for g in groups]
    positions = list(range(len(groups)))[::-1]
    parts = ax.boxplot(data, positions=positions, orientation="horizontal", widths=0.6,
                       patch_artist=True, showfliers=False, medianprops={"color": "#1d2330"})
    for patch, g in zip(parts["boxes"], groups, strict=False):
        patch.set_facecolor(PHASE_COLOUR.get(g.phase, PALETTE[2]))
        patch.set_alpha(0.55)
    for pos, vals, g in zip(positions, data, groups, strict=False):  # every timed call as a dot
        jitter = [pos + ((i * 7919) % 100 - 50) / 220 for i in range(len(vals))]
        ax.scatter(vals, jitter, s=16, color=PHASE_COLOUR.get(g.phase, PALETTE[2]),
                   edgecolors="none", alpha=0.8, zorder=3)
    ax.set_yticks(positions, [_label(g) for g in groups], fontsize=9)
    ax.set_xscale("log")
    _plain_ticks(ax)
    ax.set_xlabel("wall time per timed call (ms, log scale)")
    ax.grid(axis="x", color="#e6e8ec", which="both")
    ax.set_axisbelow(True)
    _legend(ax, {g.phase for g in groups})
    return svg(fig)


def _plain_ticks(ax: Any) -> None:
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))


def _legend(ax: Any, phases: set[str | None]) -> None:
    handles = [Patch(color=PHASE_COLOUR[p], label=p or "no phase", alpha=0.7)
               for p in PHASES if p in phases]
    if len(handles) > 1:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9,
                  frameon=False)


def _time_plot(summary: Summary) -> str:
    modules = list(dict.fromkeys(g.label for g in summary.groups))
    if not modules:
        return "<p class=\"note\">No attention calls.</p>"
    fig = figure(11, 0.9 + 0.38 * len(modules))
    ax = fig.subplots()
    left = [0.0] * len(modules)
    y = list(range(len(modules)))[::-1]
    phases = [p for p in PHASES if any(g.phase == p for g in summary.groups)]
    for phase in phases:
        widths = [sum(g.time_ns for g in summary.groups if g.label == m and g.phase == phase)
                  / 1e6 for m in modules]
        ax.barh(y, widths, left=left, color=PHASE_COLOUR[phase], label=phase or "no phase",
                height=0.6)
        left = [a + b for a, b in zip(left, widths, strict=False)]
    ax.set_yticks(y, modules, fontsize=9)
    ax.set_xlabel("total time of the timed calls (ms)")
    ax.grid(axis="x", color="#e6e8ec")
    ax.set_axisbelow(True)
    if len(phases) > 1:
        ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=9, frameon=False)
    return svg(fig)


def _kernel_plot(summary: Summary, top: int, duration: Any) -> str:
    kernels = summary.overall.kernels[:max(top, 8)]
    if not kernels:
        return ("<p class=\"note\">No profiled calls in this trace, so no kernel breakdown "
                "(raise <code>profile_rate</code>).</p>")
    fig = figure(11, 0.8 + 0.36 * len(kernels))
    ax = fig.subplots()
    y = list(range(len(kernels)))[::-1]
    ax.barh(y, [share * 100 for _, _, share in kernels], color=PALETTE[2], height=0.6)
    for yi, (_, ns, share) in zip(y, kernels, strict=False):
        ax.text(share * 100, yi, f"  {share:.1%} · {duration(ns)}", va="center", fontsize=8)
    ax.set_yticks(y, [_short(name, 60) for name, _, _ in kernels], fontsize=9)
    ax.set_xlabel("share of the profiled calls' kernel time (%)")
    ax.set_xlim(0, max(share for _, _, share in kernels) * 125)
    ax.grid(axis="x", color="#e6e8ec")
    ax.set_axisbelow(True)
    note = (f"<p class=\"note\">From the {escape(kernel_calls(summary.overall))}: each "
            "call's five biggest kernels/ops (<code>attnscope.kernel.top_names</code>), as a "
            "share of their kernel time.</p>")
    return note + svg(fig)


def _short(text: str, n: int) -> str:
    return text if len(text) <= n else text[:n - 1] + "…"


def _timeline(summary: Summary, rows: Sequence[SpanRow], calls: Sequence[SpanRow],
              duration: Any) -> str:
    profiled = [(c, spans_under(rows, c)) for c in calls
                if c.attributes.get(schema.TIER.name) == "profile"
                or summary.within.get((c.trace_id, c.span_id))]
    profiled = [(c, spans) for c, spans in profiled if spans]
    # else a call timed inside a profiled one: its operators are from that profile
    enclosed = [] if profiled else [
        (c, spans) for c in calls if c.attributes.get(schema.PROFILED_BY.name) == "enclosing"
        and (spans := spans_under(rows, c))]
    if not profiled and not enclosed:
        return "<p class=\"note\">No profiled call with operator spans in this trace.</p>"
    call, spans = max(profiled or enclosed, key=lambda p: time_ns(p[0]))
    label = summary.label_of(call)
    nested = [s for s in spans if schema.KERNEL_KIND.name not in s.attributes]
    inside = "; ".join(f"{s.name} {duration(s.duration_ns)} "
                       f"({s.duration_ns / max(call.duration_ns, 1):.0%} of the call)"
                       for s in sorted(nested, key=lambda s: -s.duration_ns)[:3])
    note = (f"<p class=\"note\">{escape(label)} ({escape(group_key(call)[1] or 'no phase')}), "
            + ("timed inside a profiled call (no attention call was profiled on its own), "
               if enclosed else "")
            + f"{duration(time_ns(call))}, trace {escape(call.trace_id)}: the {len(spans)} spans "
            "under it as they ran, in ms since it started: nested spans (blue) and operators, "
            "each below its parent (small ops are folded into their parent by attnscope). "
            + (f"Inside it: {escape(inside)}. " if inside else "")
            + "A bar too narrow for its name names it on hover.</p>")
    return note + timeline_svg(call, spans, label, duration)


def _slowest(summary: Summary, duration: Any) -> str:
    body = [[summary.label_of(r), group_key(r)[1] or MISSING, shape_text(r) or MISSING,
             duration(time_ns(r)) + first_mark(summary, r),
             times_cell(summary.times_p50(r)), when(r.start_ns), r.trace_id,
             r.span_id] for r in summary.slowest]
    note = f"<p class=\"note\">{escape(FIRST_NOTE)}</p>" if summary.first else ""
    return table(["layer", "phase", "B×Sq×Skv", "time", "× p50", "start (UTC)", "trace id",
                  "span id"], body, left=(0, 1, 5, 6, 7)) + note

