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
from typing import Any

from rich import box
from rich.table import Table

from .._errors import positive_int
from ..render.console import console as make_console
from ..render.units import MISSING, bytes_, duration, si, when
from ..render.writer import check_output, write_text
from ..summary import GroupStats, Quantiles, Summary, summarize, time_ns
from ..traces import SpanRow, attention_calls, group_key, load_spans
from ... import _schema as schema

__all__ = ["register", "run_report", "to_json", "render_terminal"]


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope report`` to the command line."""
    p = sub.add_parser(
        "report", formatter_class=formatter,
        help="summarise a trace: latency, throughput and kernels per attention layer",
        description="Summarise the attention calls in a trace file (Jaeger JSON or OTLP/JSON "
                    "lines) or an `attnscope run` directory: per layer and phase (prefill / "
                    "decode) latency percentiles, tokens/s, achieved FLOP/s, memory peak, "
                    "backend, top kernels and the slowest calls.\n\nPercentiles are of the "
                    "sampled calls; 'est. calls' re-weights the count by 1/sample_rate.")
    p.add_argument("trace", metavar="FILE_OR_DIR", help="trace file or `attnscope run` directory")
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
    summary = summarize(calls, price_per_hour=price_per_hour, top=top)
    document = to_json(summary, source=os.fspath(trace), spans=len(rows), top=top)
    if json_path == "-":
        print(json.dumps(document, indent=2), file=out)
    else:
        render_terminal(summary, source=os.fspath(trace), spans=len(rows), top=top, out=out)
    if json_path and json_path != "-":
        write_text(json_path, json.dumps(document, indent=2) + "\n", "--json")
    if html:
        from ._html import render_html  # matplotlib: only for the page

        write_text(html, render_html(summary, rows, source=os.fspath(trace), top=top), "--html")
    return 0


# -- JSON -----------------------------------------------------------------------------------


def _quantiles_json(q: Quantiles | None) -> dict[str, float] | None:
    return None if q is None else {"p50": q.p50, "p95": q.p95, "p99": q.p99, "max": q.max}


def _group_json(g: GroupStats) -> dict[str, Any]:
    return {
        "module": g.module, "phase": g.phase, "calls": g.calls,
        "estimated_calls": g.estimated_calls, "profiled_calls": g.profiled,
        "wall_ns": _quantiles_json(g.wall), "device_ns": _quantiles_json(g.device),
        "time_ns": g.time_ns, "tokens": g.tokens, "flops": g.flops,
        "tokens_per_s": g.tokens_per_s, "tflops": g.tflops, "core_tflops": g.core_tflops,
        "memory_peak_bytes": g.memory_peak_bytes, "backends": dict(g.backends),
        "kernels": [{"name": n, "ns": ns, "share": share} for n, ns, share in g.kernels],
        "cost_per_1k_tokens_usd": g.cost_per_1k_tokens,
    }


def _call_json(row: SpanRow) -> dict[str, Any]:
    module, phase = group_key(row)
    a = row.attributes
    return {"module": module, "phase": phase, "name": row.name, "trace_id": row.trace_id,
            "span_id": row.span_id, "start_unix_ns": row.start_ns, "start": when(row.start_ns),
            "wall_ns": a.get(schema.WALL_NS.name), "device_ns": a.get(schema.DEVICE_NS.name),
            "time_ns": time_ns(row), "tier": a.get(schema.TIER.name)}


def to_json(summary: Summary, *, source: str, spans: int, top: int) -> dict[str, Any]:
    """The report's numbers as plain JSON values (keys documented in docs/cli.md)."""
    return {
        "source": source, "spans": spans, "attention_calls": summary.overall.calls,
        "services": summary.services, "sample_rates": summary.sample_rates,
        "price_per_hour_usd": summary.price_per_hour,
        "groups": [_group_json(g) for g in summary.groups],
        "overall": _group_json(summary.overall) | {
            "kernels": [{"name": n, "ns": ns, "share": s}
                        for n, ns, s in summary.overall.kernels[:top]]},
        "slowest": [_call_json(r) for r in summary.slowest],
    }


# -- terminal -------------------------------------------------------------------------------


def render_terminal(summary: Summary, *, source: str, spans: int, top: int, out: Any) -> None:
    """The report as rich tables on ``out`` (100 columns when not a terminal)."""
    console = make_console(out, width=100)
    sampled = [r for r in summary.sample_rates if r < 1]
    rates = ", ".join(f"{r:g}" for r in summary.sample_rates)
    console.print(f"[bold]attnscope report[/bold] — {source}")
    console.print(f"{spans} spans, {summary.overall.calls} attention calls sampled "
                  f"(sample rate {rates}"
                  + (f"; ≈ {summary.overall.estimated_calls:,.0f} calls made" if sampled else "")
                  + f"), {summary.overall.profiled} profiled.")
    console.print("Times are of the sampled calls that were not profiled (the profiler slows "
                  "a call).")
    device = any(g.device for g in summary.groups)
    lat = _table("Latency per attention layer (wall time)",
                 ("layer", "phase", "calls") + (("est. calls",) if sampled else ())
                 + ("p50", "p95", "p99", "max") + (("device p50", "device p99") if device else ()))
    for g in [*summary.groups, summary.overall]:
        cells = [g.module, g.phase or MISSING, str(g.calls)] \
            + ([f"{g.estimated_calls:,.0f}"] if sampled else []) \
            + [duration(v) for v in (g.wall.p50, g.wall.p95, g.wall.p99, g.wall.max)]
        if device:
            cells += [duration(g.device.p50 if g.device else None),
                      duration(g.device.p99 if g.device else None)]
        lat.add_row(*cells, style="bold" if g is summary.overall else None,
                    end_section=g is summary.groups[-1])
    console.print(lat)
    console.print(_throughput_table(summary))
    if summary.price_per_hour is not None:
        console.print(_cost_table(summary))
    _kernels_and_slowest(console, summary, top)


def _throughput_table(summary: Summary) -> Table:
    t = _table("Throughput per attention layer (totals ÷ total time)",
               ("layer", "phase", "time", "tok/s", "FLOP/s", "core FLOP/s", "mem peak",
                "backend"))
    for g in [*summary.groups, summary.overall]:
        cells = [g.module, g.phase or MISSING, duration(g.time_ns), si(g.tokens_per_s),
                 si(g.tflops * 1e12 if g.tflops is not None else None),
                 si(g.core_tflops * 1e12 if g.core_tflops is not None else None),
                 bytes_(g.memory_peak_bytes), ",".join(sorted(g.backends)) or MISSING]
        t.add_row(*cells, style="bold" if g is summary.overall else None,
                  end_section=g is summary.groups[-1])
    return t


def _cost_table(summary: Summary) -> Table:
    """Cost per 1,000 tokens at the given device price (its own table: 100 columns hold it)."""
    t = _table(f"Cost at ${summary.price_per_hour:g} per device-hour (attention time only)",
               ("layer", "phase", "time", "tokens", "$/1k tok"))
    for g in [*summary.groups, summary.overall]:
        cost = g.cost_per_1k_tokens
        t.add_row(g.module, g.phase or MISSING, duration(g.time_ns),
                  MISSING if g.tokens is None else f"{g.tokens:,}",
                  MISSING if cost is None else f"{cost:.3g}",
                  style="bold" if g is summary.overall else None,
                  end_section=g is summary.groups[-1])
    return t


def _table(title: str, columns: tuple[str, ...]) -> Table:
    t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
              min_width=len(title) + 1, collapse_padding=True, title_style="bold")
    for col in columns:
        left = col in ("layer", "phase", "backend", "kernel / op", "start (UTC)", "trace id")
        t.add_column(col, justify="left" if left else "right", no_wrap=True)
    return t


def _kernels_and_slowest(console: Any, summary: Summary, top: int) -> None:
    kernels = summary.overall.kernels[:top]
    if kernels:
        k = _table(f"Top kernels/ops of the {summary.overall.profiled} profiled calls",
                   ("kernel / op", "time", "share"))
        for name, ns, share in kernels:
            k.add_row(name, duration(ns), f"{share:.1%}")
        console.print(k)
    else:
        console.print("No profiled calls: no kernel breakdown (raise profile_rate to get one).")
    s = _table("Slowest calls",
               ("layer", "phase", "time", "start (UTC)", "trace id"))
    for row in summary.slowest:
        module, phase = group_key(row)
        s.add_row(module, phase or MISSING, duration(time_ns(row)), when(row.start_ns)[11:23],
                  row.trace_id)
    console.print(s)
