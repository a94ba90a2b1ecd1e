"""``attnscope report``: what the attention layers in a trace cost, per layer and phase.

Reads a trace file or an ``attnscope run`` directory (:mod:`..traces`), summarises the attention
calls (:mod:`..summary`) and prints rich tables; ``--json`` writes the same numbers,
``--html`` a self-contained page with plots (:mod:`._html`).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.table import Table

from ... import _schema as schema
from .._errors import CLIError, positive_int
from ..e2e import MIN_FOR_INTERVAL, OUTSIDE_BLOCKS, EndToEnd, end_to_end
from ..render.console import console as make_console
from ..render.console import fold
from ..render.units import MISSING, bytes_, duration, si, when
from ..render.writer import check_output, write_text
from ..runinfo import describe, run_info
from ..summary import GroupStats, Quantiles, Summary, shape_text, summarize, time_ns
from ..traces import SpanRow, attention_calls, group_key, load_spans
from ._fallbacks import fallback_lines
from ._replayed import replayed_counts, replayed_lines
from ._requests import Requests, print_requests, requests_json, requests_of

__all__ = ["BLOCKS", "FIRST_NOTE", "Context", "backend_cell", "first_mark", "kernel_calls",
           "register", "run_report", "to_json", "render_terminal", "share_cell", "times_cell"]


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope report`` to the command line."""
    p = sub.add_parser(
        "report", formatter_class=formatter,
        help="summarise a trace: latency, throughput and kernels per attention layer",
        description="Summarise the attention calls in a trace file (Jaeger JSON or OTLP/JSON "
                    "lines) or an `attnscope run` directory: per layer and phase (prefill / "
                    "decode) and backend: calls, tokens, latency percentiles, tokens/s, achieved "
                    "FLOP/s, memory peak, top kernels and the slowest calls.\n\nCounts and "
                    "totals are of every sampled call; latency and rates of the timed ones "
                    "(profiled calls are slowed by the profiler); 'est. calls' re-weights the "
                    "count by 1/sample_rate.")
    p.add_argument("trace", metavar="FILE_OR_DIR", nargs="?",
                   help="trace file or `attnscope run` directory")
    p.add_argument("--diary", metavar="PATH.jsonl",
                   help="instead of a trace: list the performance diary `attnscope diff "
                        "--append-diary` writes (--html: with p50/p99 per group over time)")
    p.add_argument("--html", metavar="PATH", help="also write a self-contained HTML report")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON ('-': stdout)")
    p.add_argument("--price-per-hour", metavar="USD", type=_price, default=None,
                   help="device price per hour: adds the attention cost per 1,000 tokens")
    p.add_argument("--top", metavar="N", type=positive_int, default=5,
                   help="slowest calls and kernels to list")
    p.set_defaults(func=_main)


def _price(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"must be a finite price of at least 0, got {text}")
    return value


def _main(args: Any) -> int:
    if args.diary is not None:
        if args.trace is not None:
            raise CLIError("give a trace or --diary PATH, not both")
        from ..diary import run_diary_report

        return run_diary_report(args.diary, html=args.html, json_path=args.json,
                                out=sys.stdout)
    if args.trace is None:
        raise CLIError("no trace given (usage: attnscope report FILE_OR_DIR, or "
                       "attnscope report --diary PATH.jsonl)")
    return run_report(args.trace, html=args.html, json_path=args.json,
                      price_per_hour=args.price_per_hour, top=args.top, out=sys.stdout)


def run_report(trace: str | os.PathLike[str], *, html: str | None = None,
               json_path: str | None = None, price_per_hour: float | None = None,
               top: int = 5, out: Any = None) -> int:
    """Load, summarise, print; write the JSON/HTML files asked for. Returns the exit code."""
    check_output(html, "--html")  # before the work, not after the whole report is printed
    check_output(json_path, "--json")
    rows = load_spans(trace)
    calls = attention_calls(rows)
    summary = summarize(calls, price_per_hour=price_per_hour, top=top, rows=rows)
    context = Context(run_info(trace, rows), end_to_end(rows), requests_of(rows))
    document = to_json(summary, source=os.fspath(trace), spans=len(rows), top=top,
                       context=context, calls=calls)
    if json_path == "-":
        print(json.dumps(document, indent=2), file=out)
    else:
        render_terminal(summary, source=os.fspath(trace), spans=len(rows), top=top, out=out,
                        context=context, calls=calls)
    wrote = []
    if json_path and json_path != "-":
        write_text(json_path, json.dumps(document, indent=2) + "\n", "--json")
        wrote.append(f"JSON: {json_path}")
    if html:
        from ._html import render_html  # matplotlib: only for the page

        write_text(html, render_html(summary, rows, source=os.fspath(trace), top=top,
                                     context=context), "--html")
        wrote.append(f"HTML report: {html}")
    if wrote:  # on stderr: stdout is the report (or the JSON, with --json -)
        print(f"attnscope report: {', '.join(wrote)}", file=sys.stderr)
    return 0


@dataclass(frozen=True, slots=True)
class Context:
    """What the trace was a run of (:mod:`..runinfo`), the end-to-end figures (:mod:`..e2e`)
    and the requests (:mod:`._requests`; None: no request spans)."""

    run: dict[str, Any]
    e2e: EndToEnd
    requests: Requests | None = None


# -- JSON -----------------------------------------------------------------------------------


def _quantiles_json(q: Quantiles | None) -> dict[str, float] | None:
    return None if q is None else {"min": q.min, "p5": q.p5, "p50": q.p50, "p95": q.p95,
                                   "p99": q.p99, "max": q.max}


def _group_json(g: GroupStats) -> dict[str, Any]:
    return {
        "module": g.module, "phase": g.phase, "backend": g.backend, "label": g.label,
        "calls": g.calls, "estimated_calls": g.estimated_calls, "profiled_calls": g.profiled,
        "latency_calls": g.latency_calls, "latency_of": g.latency_of,
        "wall_ns": _quantiles_json(g.wall), "device_ns": _quantiles_json(g.device),
        "time_ns": g.time_ns, "tokens": g.tokens, "flops": g.flops,
        "tokens_per_s": g.tokens_per_s, "tflops": g.tflops, "core_tflops": g.core_tflops,
        "memory_peak_bytes": g.memory_peak_bytes, "backends": dict(g.backends),
        "kernels": [{"name": n, "ns": ns, "share": share} for n, ns, share in g.kernels],
        "kernel_calls": g.profiles, "kernel_calls_enclosed": g.enclosed,
        "cost_per_1k_tokens_usd": g.cost_per_1k_tokens,
        "inexact_calls": dict(g.inexact),
        "roofline": None if g.roofline is None else {
            "calls": g.roofline.calls, "intensity_flop_per_byte": g.roofline.intensity,
            "achieved_tflops": g.roofline.achieved_tflops, "roof_tflops": g.roofline.roof_tflops,
            "fraction": g.roofline.fraction, "bound": g.roofline.bound,
            "peak_source": g.roofline.peak_source},
        "fallbacks": None if g.fallbacks is None else {
            "calls": g.fallbacks.calls, "expected": g.fallbacks.expected,
            "reason": g.fallbacks.reason},
    }


def _call_json(summary: Summary, row: SpanRow) -> dict[str, Any]:
    module, phase = group_key(row)
    a = row.attributes
    return {"module": module, "phase": phase, "label": summary.label_of(row), "name": row.name,
            "trace_id": row.trace_id, "span_id": row.span_id, "start_unix_ns": row.start_ns,
            "start": when(row.start_ns), "wall_ns": a.get(schema.WALL_NS.name),
            "device_ns": a.get(schema.DEVICE_NS.name), "time_ns": time_ns(row),
            "tier": a.get(schema.TIER.name), "replayed": a.get(schema.REPLAYED.name) is True,
            "batch_size": a.get(schema.BATCH_SIZE.name), "seq_len_q": a.get(schema.SEQ_LEN_Q.name),
            "seq_len_kv": a.get(schema.SEQ_LEN_KV.name), "times_p50": summary.times_p50(row),
            "slow": a.get(schema.SLOW.name) is True,
            "first_call": (row.trace_id, row.span_id) in summary.first}


def _e2e_json(e2e: EndToEnd) -> dict[str, Any]:
    return {
        "generate": [{"name": g.name, "calls": g.calls, "timed": g.used,
                      "wall_ns": _quantiles_json(g.wall),
                      "output_tokens": g.output_tokens, "output_tokens_per_s": g.tokens_per_s,
                      "ttft_ns": _quantiles_json(g.ttft), "ttft_calls": g.ttft_calls,
                      "tpot_ns": _quantiles_json(g.tpot), "tpot_calls": g.tpot_calls,
                      "unknown": dict(g.unknown)}
                     for g in e2e.generates],
        "attention_share": [{"model": s.model, "phase": s.phase, "forwards": s.forwards,
                             "timed": s.used, "attention_calls": s.calls,
                             "model_ns": s.model_ns, "attention_ns": s.attention_ns,
                             "share": s.share, "share_interval": s.share_interval,
                             "share_sampled": s.sampled}
                            for s in e2e.shares],
        "blocks": [{"name": b.name, "calls": b.calls, "timed": b.used,
                    "wall_ns": _quantiles_json(b.wall), "tokens_per_s": b.tokens_per_s,
                    "attention_calls": b.attention_calls, "block_ns": b.block_ns,
                    "attention_ns": b.attention_ns, "share": b.share,
                    "share_interval": b.share_interval, "share_sampled": b.sampled}
                   for b in e2e.blocks],
        "attention_calls_outside_blocks": e2e.outside_blocks,
    }


def to_json(summary: Summary, *, source: str, spans: int, top: int,
            context: Context | None = None,
            calls: Sequence[SpanRow] | None = None) -> dict[str, Any]:
    """The report's numbers as plain JSON values (keys documented in docs/cli.md); ``calls``:
    the summarised call spans, for each group's calls replayed in CUDA graphs."""
    extra = {} if context is None else {"run": context.run, "end_to_end": _e2e_json(context.e2e),
                                        "requests": requests_json(context.requests, top)}
    replayed = replayed_counts(summary, calls)
    return extra | {
        "source": source, "spans": spans, "attention_calls": summary.overall.calls,
        "services": summary.services, "sample_rates": summary.sample_rates,
        "price_per_hour_usd": summary.price_per_hour,
        "groups": [_group_json(g) | {"replayed_calls": replayed.get((g.label, g.phase), 0)}
                   for g in summary.groups],
        "overall": _group_json(summary.overall) | {
            "replayed_calls": sum(replayed.values()),
            "kernels": [{"name": n, "ns": ns, "share": s}
                        for n, ns, s in summary.overall.kernels[:top]]},
        "slowest": [_call_json(summary, r) for r in summary.slowest],
    }


# -- terminal -------------------------------------------------------------------------------

# Which calls each figure is of, under the tables (the header line says how many are timed).
WHICH_CALLS = ("Sampled calls: counts, tokens, FLOPs, mem peak · timed: latency, time, rates · "
               "profiled: core FLOP/s")


def render_terminal(summary: Summary, *, source: str, spans: int, top: int, out: Any,
                    context: Context | None = None,
                    calls: Sequence[SpanRow] | None = None) -> None:
    """The report as rich tables on ``out`` (100 columns when not a terminal); ``calls``: the
    summarised call spans, for the fallback counts per reason (:mod:`._fallbacks`)."""
    console = make_console(out, width=100)
    rates = ", ".join(f"{r:g}" for r in summary.sample_rates)
    o = summary.overall
    console.print(f"[bold]attnscope report[/bold] — {source}", highlight=False)
    for line in describe(context.run) if context is not None else ():
        console.print(line, highlight=False, markup=False, style="dim")
    console.print(f"{spans} spans, {o.calls} attention calls sampled (sample rate {rates}"
                  + (f"; ≈ {o.estimated_calls:,.0f} calls made" if summary.sampled else "")
                  + f"): {_split(o)}.", highlight=False)
    console.print(_calls_table(summary))
    console.print(_latency_table(
        summary, "Latency per attention layer (wall time of the timed calls: the profiler slows "
        "a call)", lambda g: g.wall))
    if any(g.device for g in summary.groups):
        console.print(_latency_table(summary, "Device time per attention layer (timed calls)",
                                     lambda g: g.device))
    console.print(_throughput_table(summary))
    console.print(WHICH_CALLS, highlight=False)
    for line in inexact_lines(summary):
        console.print(line, highlight=False, markup=False)
    for line in replayed_lines(summary, calls):
        console.print(line, highlight=False, markup=False)
    if any(g.latency_of == "profiled" for g in summary.groups):
        console.print("* every call of the row was profiled: its latency, time and rates are of "
                      "profiled calls.", highlight=False)
    if summary.price_per_hour is not None:
        console.print(_cost_table(summary))
    if any(g.roofline for g in summary.groups):
        console.print(_roofline_table(summary))
    for line in fallback_lines(summary, calls):
        console.print(line, highlight=False, markup=False)
    if context is not None:
        _end_to_end(console, context.e2e)
        if context.requests is not None:
            print_requests(console, context.requests, top)
    _kernels_and_slowest(console, summary, top)


def _split(o: GroupStats) -> str:
    """The sampled calls as timed, profiled and (when any) timed inside a profiled call, which the
    latency and rates leave out as they do profiled calls."""
    inside = o.calls - o.profiled - o.latency_calls if o.latency_of == "timed" else 0
    return (f"{o.calls - o.profiled - inside} timed, {o.profiled} profiled"
            + (f" ({o.profiled_inside} through the call nested in it)" if o.profiled_inside
               else "")
            + (f", {inside} timed inside a profiled call" if inside else ""))


def _end_to_end(console: Any, e2e: EndToEnd) -> None:
    if e2e.generates:
        t = _table("generate() end to end (wall time; TTFT and TPOT from its traced forwards)",
                   ("call", "calls", "timed", "p50", "p95", "out tok/s", "TTFT p50", "TPOT p50"))
        partial = []
        for g in e2e.generates:
            t.add_row(g.name, str(g.calls), str(g.used), duration(g.wall.p50),
                      duration(g.wall.p95), si(g.tokens_per_s),
                      duration(g.ttft.p50 if g.ttft else None),
                      duration(g.tpot.p50 if g.tpot else None))
            line = g.partial_line()
            if line is not None:
                partial.append(line)
        console.print(t)
        for line in partial:
            console.print(line, highlight=False, markup=False)
    if e2e.shares:
        t = _table("Attention's share of the model's time (traced forwards, wall time)",
                   ("model", "phase", "forwards", "timed", "attn calls", "model time",
                    "attention", "share"))
        for s in e2e.shares:
            t.add_row(s.model, s.phase or MISSING, str(s.forwards), str(s.used), str(s.calls),
                      duration(s.model_ns), duration(s.attention_ns) if s.calls else MISSING,
                      share_cell(s.share, s.share_interval, s.sampled))
        console.print(t)
    if e2e.blocks:
        t = _table("Your traced blocks (attnscope.span, @trace; wall time)", BLOCKS)
        for b in e2e.blocks:
            t.add_row(b.name, str(b.calls), str(b.used), duration(b.wall.p50),
                      duration(b.wall.p95), duration(b.wall.p99), si(b.tokens_per_s),
                      str(b.attention_calls), share_cell(b.share, b.share_interval, b.sampled))
        console.print(t)
        if e2e.outside_blocks:
            console.print(OUTSIDE_BLOCKS.format(e2e.outside_blocks), highlight=False, markup=False)
    if e2e.generates or e2e.shares or e2e.blocks:
        console.print("timed: the calls, forwards and blocks with no profiled span in them (the "
                      "call, a forward or a layer: the profiler slows them), unless all have "
                      "one. Share: the attention calls in them ÷ their time, each weighted by "
                      f"1/sample rate; below rate 1, with its 95% bootstrap interval (≈: from "
                      f"fewer than {MIN_FOR_INTERVAL} of them, too few for one).",
                      highlight=False)


def share_cell(share: float | None, interval: tuple[float, float] | None,
               sampled: bool = False) -> str:
    """"31.2%" (exact), "31.2% (18–47%)" (an estimate with e2e's interval) or "≈31.2%" (an
    estimate from too few forwards or blocks for one)."""
    if share is None:
        return MISSING
    if interval is not None:
        return f"{share:.1%} ({interval[0] * 100:.0f}–{interval[1] * 100:.0f}%)"
    return f"≈{share:.1%}" if sampled else f"{share:.1%}"


# The blocks table's columns: "attn calls" sampled inside the timed blocks, "attn share" their
# time's share of the blocks' (e2e.BlockStats)
BLOCKS = ("block", "calls", "timed", "p50", "p95", "p99", "tok/s", "attn calls", "attn share")


INEXACT_MARK = " †"
# what each reason leaves of the row's figures (docs/attributes.md#not-exact)
_INEXACT_MEANS = {"mask_not_kept": "FLOPs an upper bound, tokens left out",
                  "mask_unread": "FLOPs an upper bound", "layer_narrows": "FLOPs an upper bound",
                  "cache_unread": "keys, phase and FLOPs left out"}


def inexact_lines(summary: Summary) -> list[str]:
    """One line per row with calls attnscope could not establish exactly (``†``)."""
    lines = []
    for g in summary.groups:
        if g.inexact:
            why = "; ".join(f"{n} {reason} ({_INEXACT_MEANS.get(reason, 'not exact')})"
                            for reason, n in sorted(g.inexact.items()))
            lines.append(f"† {g.label} {g.phase or MISSING}: {sum(g.inexact.values())} of "
                         f"{g.calls} calls not exact: {why}")
    return lines


def _rows(summary: Summary) -> list[GroupStats]:
    return [*summary.groups, summary.overall]


def _add(t: Table, summary: Summary, g: GroupStats, cells: list[str]) -> None:
    t.add_row(g.label, g.phase or MISSING, *cells,
              style="bold" if g is summary.overall else None,
              end_section=bool(summary.groups) and g is summary.groups[-1])


def _calls_table(summary: Summary) -> Table:
    sampled = summary.sampled
    t = _table("Calls per attention layer (every sampled call)",
               ("layer", "phase", "calls") + (("est. calls",) if sampled else ())
               + ("profiled", "tokens", "FLOPs", "backend"))
    for g in _rows(summary):
        _add(t, summary, g, [str(g.calls)] + ([f"{g.estimated_calls:,.0f}"] if sampled else [])
             + [str(g.profiled), MISSING if g.tokens is None else f"{g.tokens:,}",
                si(g.flops) + (INEXACT_MARK if g.inexact else ""), backend_cell(summary, g)])
    return t


def backend_cell(summary: Summary, g: GroupStats) -> str:
    """A row's backend; the "all layers" row's: every backend of the rows above, and of the
    profiled calls no row holds (an SDPA call whose layer call was not sampled), terminal and
    HTML alike."""
    if g is summary.overall:
        return ",".join(sorted({b.backend for b in summary.groups if b.backend}
                               | set(g.backends))) or MISSING
    return g.backend or MISSING


def _latency_table(summary: Summary, title: str, pick: Any) -> Table:
    t = _table(title, ("layer", "phase", "min", "p5", "p50", "p95", "p99", "max"))
    for g in _rows(summary):
        q: Quantiles | None = pick(g)
        values = (q.min, q.p5, q.p50, q.p95, q.p99, q.max) if q else (None,) * 6
        cells = [duration(v) for v in values]
        if g.latency_of == "profiled":
            cells[-1] += " *"
        _add(t, summary, g, cells)
    return t


def _throughput_table(summary: Summary) -> Table:
    t = _table("Throughput per attention layer (the timed calls' tokens or FLOPs ÷ their time)",
               ("layer", "phase", "time", "tok/s", "FLOP/s", "core FLOP/s", "mem peak"))
    for g in _rows(summary):
        mark = INEXACT_MARK if g.inexact else ""
        _add(t, summary, g, [duration(g.time_ns), si(g.tokens_per_s),
                             si(g.tflops * 1e12 if g.tflops is not None else None) + mark,
                             si(g.core_tflops * 1e12 if g.core_tflops is not None else None)
                             + (mark if g.core_tflops is not None else ""),
                             bytes_(g.memory_peak_bytes)])
    return t


def _cost_table(summary: Summary) -> Table:
    """Cost per 1,000 tokens at the given device price (its own table: 100 columns hold it)."""
    t = _table(f"Cost at ${summary.price_per_hour:g} per device-hour (attention only: "
               "price/s ÷ tok/s)", ("layer", "phase", "tok/s", "$/1k tok"))
    for g in _rows(summary):
        cost = g.cost_per_1k_tokens
        _add(t, summary, g, [si(g.tokens_per_s), MISSING if cost is None else f"{cost:.3g}"])
    return t


def _roofline_table(summary: Summary) -> Table:
    """Where each row's calls stand on the roofline (medians of the calls that have one)."""
    t = _table("Roofline per attention layer (medians of the calls with peaks known)",
               ("layer", "phase", "FLOP/B", "achieved", "roof", "fraction", "bound"))
    for g in _rows(summary):
        r = g.roofline
        if r is None:
            _add(t, summary, g, [MISSING] * 5)
            continue
        _add(t, summary, g, [f"{r.intensity:.3g}", si(r.achieved_tflops * 1e12, "FLOP/s"),
                             si(r.roof_tflops * 1e12, "FLOP/s"), f"{r.fraction:.1%}", r.bound])
    return t


def _table(title: str, columns: tuple[str, ...]) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
              min_width=len(title) + 1, collapse_padding=True, title_style="bold")
    for col in columns:
        left = col in ("layer", "phase", "backend", "kernel / op", "start (UTC)", "trace id",
                       "call", "model", "block")
        t.add_column(col, justify="left" if left else "right", no_wrap=True)
    return t


def _kernels_and_slowest(console: Any, summary: Summary, top: int) -> None:
    kernels = summary.overall.kernels[:top]
    if kernels:
        k = _table(f"Top kernels/ops of the {kernel_calls(summary.overall)}",
                   ("kernel / op", "time", "share"))
        for name, ns, share in kernels:
            k.add_row(name, duration(ns), f"{share:.1%}")
        console.print(k)
    else:
        console.print("No profiled calls: no kernel breakdown (raise profile_rate to get one).")
    cells = [[summary.label_of(row), group_key(row)[1] or MISSING, shape_text(row) or MISSING,
              duration(time_ns(row)) + first_mark(summary, row),
              times_cell(summary.times_p50(row)), row.trace_id] for row in summary.slowest]

    def table_of(columns: Sequence[int]) -> Table:
        t = _table("Slowest calls", tuple(SLOWEST[c] for c in columns))
        for row in cells:
            t.add_row(*(row[c] for c in columns))
        return t

    for part in fold(console, table_of, len(SLOWEST), keys=2):
        console.print(part)
    if summary.first:
        console.print(FIRST_NOTE, highlight=False, markup=False)


def kernel_calls(o: GroupStats) -> str:
    """Which calls the kernel table is of: "3 profiled calls", "2 calls timed inside a profiled
    call", "5 calls under the profiler (3 profiled, 2 timed inside a profiled call)"."""
    own = o.profiles - o.enclosed
    if not o.enclosed:
        return f"{own} profiled calls"
    if not own:
        return f"{o.enclosed} calls timed inside a profiled call"
    return (f"{o.profiles} calls under the profiler ({own} profiled, {o.enclosed} timed inside "
            "a profiled call)")


# The slowest call that is its process's first of its layer and phase (summary.first_calls)
FIRST_MARK = "¹"
FIRST_NOTE = (f"{FIRST_MARK} the first call of its layer and phase in its process: torch's "
              "first-use costs (allocation, kernel choice, lazy initialisation) are in its time")


def first_mark(summary: Summary, row: SpanRow) -> str:
    """``¹`` after the time of a first call (:func:`..summary.first_calls`), else nothing."""
    return FIRST_MARK if (row.trace_id, row.span_id) in summary.first else ""


# The slowest calls' columns: B×Sq×Skv its shape, "× p50" its time ÷ its table row's p50. Its
# start is in --json and --html: with it the table is 110 columns, over the 100 of a file.
SLOWEST = ("layer", "phase", "B×Sq×Skv", "time", "× p50", "trace id")


def times_cell(ratio: float | None) -> str:
    """A call's time ÷ its row's p50 (:meth:`Summary.times_p50`), as the report shows it."""
    return MISSING if ratio is None else f"{ratio:.3g}×"
