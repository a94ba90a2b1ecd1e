"""Per-layer, per-phase summaries of the attention calls in a trace (numpy, no plotting).

What the numbers are:

- ``calls``: sampled calls in the file; ``estimated_calls``: the sum of ``1/attnscope.sample_rate``
  over them, the number of calls the program made if sampling was uniform. Everything else is
  computed from the sampled calls only (a percentile is one of the sampled calls).
- Time, tokens, FLOPs and their rates come from the timed calls: profiled ones ran under
  ``torch.profiler``, which slows them (when every call was profiled, from those).
- Time is device time (``attnscope.device_ns``) where a call has it, else wall time; quantiles
  are numpy's default (linear interpolation) of wall and device time separately.
- Rates are totals over totals: tokens/s = Σ tokens ÷ Σ time, TFLOP/s = Σ FLOPs ÷ Σ time,
  core TFLOP/s = Σ FLOPs ÷ Σ ``attnscope.core_ns`` over the profiled calls that have it.
- Kernels/ops: from profiled calls' ``attnscope.kernel.top_names``/``top_ns`` (each call's five
  biggest), as a share of their ``attnscope.kernel.total_ns``.
- Cost per 1,000 tokens: price per hour × Σ time ÷ Σ tokens × 1,000 (attention time only).
  Overall, the tokens are those of the layer that saw the most (every token passes every layer).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .traces import SpanRow, group_key
from .. import _schema as schema

__all__ = ["Quantiles", "GroupStats", "Summary", "summarize", "quantiles", "time_ns",
           "operator_spans", "PHASE_ORDER"]

PHASE_ORDER = {"prefill": 0, "decode": 1, None: 2}


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Of nanosecond values: p50, p95, p99, max."""

    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One (module, phase): the numbers of the report's table rows."""

    module: str
    phase: str | None
    calls: int
    estimated_calls: float
    profiled: int
    wall: Quantiles
    device: Quantiles | None
    time_ns: int  # Σ device time where measured, else wall time
    tokens: int | None
    flops: int | None
    tokens_per_s: float | None
    tflops: float | None
    core_tflops: float | None
    memory_peak_bytes: int | None
    backends: Mapping[str, int]
    kernels: list[tuple[str, int, float]]  # (name, ns, share of profiled kernel time)
    cost_per_1k_tokens: float | None


@dataclass(frozen=True, slots=True)
class Summary:
    """All groups, the overall figures, the slowest calls."""

    groups: list[GroupStats]
    overall: GroupStats
    slowest: list[SpanRow]
    sample_rates: list[float]
    price_per_hour: float | None
    services: list[str] = field(default_factory=list)


def quantiles(values: Sequence[float]) -> Quantiles:
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    p50, p95, p99 = np.percentile(arr, [50, 95, 99])
    return Quantiles(float(p50), float(p95), float(p99), float(arr.max()))


def time_ns(row: SpanRow) -> int:
    """The call's time: device time when measured, else wall time (else the span's length)."""
    device = row.attributes.get(schema.DEVICE_NS.name)
    if isinstance(device, int) and device > 0:
        return device
    wall = row.attributes.get(schema.WALL_NS.name)
    return wall if isinstance(wall, int) else row.duration_ns


def _ints(rows: Iterable[SpanRow], key: str) -> list[int]:
    return [v for r in rows if isinstance(v := r.attributes.get(key), int)
            and not isinstance(v, bool)]


def _kernels(rows: Sequence[SpanRow]) -> list[tuple[str, int, float]]:
    by_name: Counter[str] = Counter()
    total = 0
    for r in rows:
        names, times = r.attributes.get(schema.KERNEL_TOP_NAMES.name), \
            r.attributes.get(schema.KERNEL_TOP_NS.name)
        kernel_total = r.attributes.get(schema.KERNEL_TOTAL_NS.name)
        if not isinstance(names, list) or not isinstance(times, list) \
                or not isinstance(kernel_total, int):
            continue
        total += kernel_total
        for name, ns in zip(names, times, strict=False):
            by_name[str(name)] += int(ns)
    return [(name, ns, ns / total if total else 0.0) for name, ns in by_name.most_common()]


def _stats(module: str, phase: str | None, rows: Sequence[SpanRow],
           price_per_hour: float | None, tokens: int | None = None) -> GroupStats:
    # profiled calls ran under torch.profiler, which slows them: time from the timed ones
    timed = [r for r in rows if r.attributes.get(schema.TIER.name) != "profile"] or list(rows)
    walls = _ints(timed, schema.WALL_NS.name) or [r.duration_ns for r in timed]
    devices = _ints(timed, schema.DEVICE_NS.name)
    total_ns = sum(time_ns(r) for r in timed)
    with_tokens = [r for r in timed if isinstance(r.attributes.get(schema.TOKENS.name), int)]
    if tokens is None and with_tokens:
        tokens = sum(_ints(with_tokens, schema.TOKENS.name))
    token_ns = sum(time_ns(r) for r in with_tokens) if with_tokens else total_ns
    with_flops = [r for r in timed if isinstance(r.attributes.get(schema.FLOPS.name), int)]
    flops = sum(_ints(with_flops, schema.FLOPS.name)) if with_flops else None
    flop_ns = sum(time_ns(r) for r in with_flops)
    cored = [r for r in rows if isinstance(r.attributes.get(schema.FLOPS.name), int)
             and isinstance(r.attributes.get(schema.CORE_NS.name), int)]
    core_ns = sum(_ints(cored, schema.CORE_NS.name))
    profiled = [r for r in rows if r.attributes.get(schema.TIER.name) == "profile"]
    peaks = _ints(rows, schema.PEAK_BYTES.name)
    backends = Counter(str(r.attributes[schema.BACKEND.name]) for r in rows
                       if schema.BACKEND.name in r.attributes)
    return GroupStats(
        module=module, phase=phase, calls=len(rows),
        estimated_calls=sum(1.0 / _rate(r) for r in rows), profiled=len(profiled),
        wall=quantiles(walls), device=quantiles(devices) if devices else None,
        time_ns=total_ns, tokens=tokens, flops=flops,
        tokens_per_s=tokens / token_ns * 1e9 if tokens and token_ns else None,
        tflops=flops / flop_ns / 1e3 if flops is not None and flop_ns else None,
        core_tflops=sum(_ints(cored, schema.FLOPS.name)) / core_ns / 1e3 if core_ns else None,
        memory_peak_bytes=max(peaks) if peaks else None, backends=dict(backends),
        kernels=_kernels(profiled),
        cost_per_1k_tokens=(price_per_hour * token_ns / 3.6e12 / tokens * 1e3
                            if price_per_hour is not None and tokens else None))


def _rate(row: SpanRow) -> float:
    rate = row.attributes.get(schema.SAMPLE_RATE.name)
    return float(rate) if isinstance(rate, (int, float)) and 0 < rate <= 1 else 1.0


def _order(key: tuple[str, str | None], rows: Sequence[SpanRow]) -> tuple[Any, ...]:
    index = rows[0].attributes.get(schema.LAYER_INDEX.name)
    return (index if isinstance(index, int) else 1 << 30, key[0], PHASE_ORDER.get(key[1], 3))


def summarize(calls: Sequence[SpanRow], price_per_hour: float | None = None,
              top: int = 5) -> Summary:
    """The report's numbers for ``calls`` (from :func:`attnscope.cli.traces.attention_calls`)."""
    grouped: dict[tuple[str, str | None], list[SpanRow]] = defaultdict(list)
    for row in calls:
        grouped[group_key(row)].append(row)
    keys = sorted(grouped, key=lambda k: _order(k, grouped[k]))
    groups = [_stats(k[0], k[1], grouped[k], price_per_hour) for k in keys]
    per_module: Counter[str] = Counter()
    for g in groups:
        per_module[g.module] += g.tokens or 0
    most_tokens = max(per_module.values(), default=0) or None
    overall = _stats("all layers", None, calls, price_per_hour, tokens=most_tokens)
    slowest = sorted(calls, key=lambda r: (-time_ns(r), r.start_ns))[:top]
    rates = sorted({_rate(r) for r in calls})
    services = sorted({r.service for r in calls if r.service})
    return Summary(groups, overall, slowest, rates, price_per_hour, services)


def operator_spans(rows: Sequence[SpanRow], call: SpanRow) -> list[SpanRow]:
    """The operator/kernel spans under ``call`` (at any depth), by start time."""
    children: dict[str, list[SpanRow]] = defaultdict(list)
    for r in rows:
        if r.parent_id and schema.KERNEL_KIND.name in r.attributes:
            children[r.parent_id].append(r)
    out: list[SpanRow] = []
    todo = [call.span_id]
    while todo:
        kids = children.get(todo.pop(), [])
        out.extend(kids)
        todo.extend(k.span_id for k in kids)
    return sorted(out, key=lambda r: r.start_ns)
