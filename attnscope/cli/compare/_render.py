"""``attnscope compare``'s output: one :class:`Row` per implementation, as a table or JSON."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from typing import Any, TextIO

import torch
from rich.table import Table

from ..._version import __version__
from ..render.console import console as make_console
from ..render.console import fold
from ..render.units import MISSING, bytes_, duration
from ._measure import TOLERANCE, Spec
from ._plan import MIN_ROUNDS, ROUNDS, Plan
from ._ranking import Pair, Ranking, lines, rank
from ._stats import Figures

__all__ = ["Row", "render_table", "render_json", "STATUSES"]

# ok: ran, within tolerance · inaccurate: ran, beyond it · failed: raised or returned a wrong
# shape · unavailable: cannot run here · skipped: could, left out of the default set
STATUSES = ("ok", "inaccurate", "failed", "unavailable", "skipped")


@dataclasses.dataclass
class Row:
    """One implementation's outcome."""

    name: str
    status: str
    reason: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)
    user: bool = False
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    figures: Figures | None = None


def _finite(value: float | None) -> float | None:
    return value if value is not None and math.isfinite(value) else None


def _header(spec: Spec, plan: Plan | None = None) -> dict[str, Any]:
    device_name = (torch.cuda.get_device_name(spec.device) if spec.device.type == "cuda"
                   else "cpu")
    return {
        "attnscope_version": __version__, "torch_version": torch.__version__,
        "device": str(spec.device), "device_name": device_name,
        "shape": {"batch": spec.batch, "heads": spec.heads, "kv_heads": spec.kv_heads,
                  "seq_len": spec.seq_len, "kv_len": spec.keys, "head_dim": spec.head_dim},
        "dtype": str(spec.dtype).removeprefix("torch."), "causal": spec.causal,
        "runs": spec.runs, "warmup": spec.warmup, "profile_runs": spec.profile_runs,
        "seed": spec.seed, "time_basis": "device" if spec.device.type == "cuda" else "wall",
        "tolerance_max_abs": TOLERANCE[spec.dtype],
        "rounds": plan.rounds if plan else min(ROUNDS, spec.runs),
        "budget_s": spec.budget_s,
        "runs_asked": plan.runs_asked if plan else spec.runs,
        "warmup_asked": plan.warmup_asked if plan else spec.warmup,
        "cut_by_budget": plan.describe() or None if plan else None,
    }


def _row_json(row: Row, spec: Spec) -> dict[str, Any]:
    f = row.figures or Figures()
    return {
        "name": row.name, "kind": "user" if row.user else "builtin", "status": row.status,
        "reason": row.reason, "notes": row.notes, "backend": f.backend,
        "calls": f.calls, "time_us": f.time_us, "wall_us": f.wall_us, "device_us": f.device_us,
        "flops": f.flops, "tflops": _finite(f.tflops),
        "kernels_per_call": f.kernels_per_call,
        "kernel_unit": "gpu_activity" if spec.device.type == "cuda" else "cpu_op",
        "top_names": f.top_names, "profiled_calls": f.profiled,
        "peak_memory_bytes": f.peak_memory_bytes,
        "max_abs_error": _finite(row.max_abs_error), "max_rel_error": _finite(row.max_rel_error),
        "within_tolerance": None if row.max_abs_error is None else row.status == "ok",
    }


def ranking(rows: list[Row]) -> Ranking | None:
    """The ranking of the implementations that ran to the end (``ok`` or ``inaccurate``)."""
    return rank({r.name: r.figures.rounds for r in rows
                 if r.status in ("ok", "inaccurate") and r.figures is not None})


def _ranking_json(found: Ranking | None) -> dict[str, Any] | None:
    if found is None:
        return None
    def pair(p: Pair) -> dict[str, Any]:
        return {"against": p.against, "verdict": p.verdict, "ratio": _finite(p.ratio),
                "low": _finite(p.low), "high": _finite(p.high),
                "confidence": _finite(p.confidence), "rounds": p.rounds}

    return {"reference": found.reference, "min_rounds": MIN_ROUNDS, "entries": [
        {"name": s.name, "verdict": s.verdict, "ratio": _finite(s.ratio), "low": _finite(s.low),
         "high": _finite(s.high), "confidence": _finite(s.confidence), "rounds": s.rounds,
         "previous": None if s.previous is None else pair(s.previous)}
        for s in found.standings]}


def render_json(spec: Spec, rows: list[Row], out: TextIO, plan: Plan | None = None) -> None:
    """The whole comparison as one JSON document (non-finite numbers as null)."""
    doc = _header(spec, plan)
    doc["implementations"] = [_row_json(r, spec) for r in rows]
    doc["ranking"] = _ranking_json(ranking(rows))
    json.dump(doc, out, indent=2, allow_nan=False)
    out.write("\n")


def _time(us: float | None) -> str:
    return duration(None if us is None else us * 1e3)


def _error(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1e}"


def render_table(spec: Spec, rows: list[Row], out: TextIO, plan: Plan | None = None) -> None:
    """A terminal table of the implementations that ran, the ranking, then those that did not,
    with why."""
    h = _header(spec, plan)
    console = make_console(out)
    gqa = f", {spec.kv_heads} KV heads" if spec.kv_heads != spec.heads else ""
    basis = "device time" if h["time_basis"] == "device" else "wall time"
    unit = "kernels" if spec.device.type == "cuda" else "ops"
    keys = f" keys={spec.keys}" if spec.keys != spec.seq_len else ""
    console.print(f"attnscope compare — B={spec.batch} H={spec.heads}{gqa} S={spec.seq_len}{keys} "
                  f"D={spec.head_dim} {h['dtype']}{' causal' if spec.causal else ''} on "
                  f"{h['device_name']} · {spec.runs} timed calls each in {h['rounds']} "
                  f"interleaved rounds ({basis}) · torch {h['torch_version']}", markup=False,
                  soft_wrap=True)  # whole lines: a terminal wraps them, a pipe keeps them
    if h["cut_by_budget"]:
        console.print(f"fewer calls than asked: {h['cut_by_budget']}", markup=False,
                      soft_wrap=True)
    titles = ("implementation", "status", "backend", "p50", "p95", "p99", "TFLOP/s",
              f"{unit}/call", "peak mem", "max abs err", "rel err")
    ran = [r for r in rows if r.status in ("ok", "inaccurate", "failed")]
    cells = [_cells(r) for r in ran]

    def table_of(columns: Sequence[int]) -> Any:
        table = Table(show_edge=False, pad_edge=False)
        for c in columns:  # figures are never wrapped or cut
            table.add_column(titles[c], justify="left" if c < 3 else "right", no_wrap=True)
        for row in cells:
            table.add_row(*(row[c] for c in columns))
        return table

    # a narrow terminal: the columns folded into tables that fit, each led by the name
    for table in fold(console, table_of, len(titles)):
        console.print(table)
    flops = next((r.figures.flops for r in ran if r.figures and r.figures.flops), None)
    console.print(f"FLOPs per call (attnscope.flops): {flops if flops is not None else MISSING} · "
                  f"error against float64 attention of the same inputs, allowed max abs "
                  f"{h['tolerance_max_abs']:g} for {h['dtype']}", markup=False, soft_wrap=True)
    for line in lines(ranking(rows), "round", "--runs"):
        console.print(line, markup=False, soft_wrap=True)
    _notes(console, rows)


def _cells(r: Row) -> list[str]:
    f = r.figures or Figures()
    t = f.time_us or {}
    return [r.name, r.status, f.backend or MISSING, _time(t.get("p50")), _time(t.get("p95")),
            _time(t.get("p99")), MISSING if f.tflops is None else f"{f.tflops:.3g}",
            MISSING if f.kernels_per_call is None else str(f.kernels_per_call),
            bytes_(f.peak_memory_bytes), _error(r.max_abs_error), _error(r.max_rel_error)]


def _notes(console: Any, rows: list[Row]) -> None:
    for r in rows:
        if r.status in ("inaccurate", "failed") and r.reason:
            console.print(f"  {r.name}: {r.status.upper()}: {r.reason}", markup=False)
    for r in rows:
        for note in r.notes:
            console.print(f"  {r.name}: {note}", markup=False)
    idle = [r for r in rows if r.status in ("unavailable", "skipped")]
    if idle:
        console.print("not run here:", markup=False)
        for r in idle:
            console.print(f"  {r.name:10} {r.status}: {r.reason}", markup=False)
