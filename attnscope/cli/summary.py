"""Per-layer, per-phase, per-backend summaries of the attention calls in a trace (numpy only).

Rows: one per (module, phase, backend): ``traces.group_key`` and the backend of
``traces.call_backends`` (measured by a profiled call, or that of the call's site; ``None`` when
unknown). A layer and phase that ran under several backends get one row per backend, labelled
``module · backend`` (else the label is the module).

What the numbers are — counts and totals from **every sampled call**, latency and rates from the
**timed** calls (the profiled ones, and those timed inside a profiled call —
``attnscope.profiled_by`` — ran under ``torch.profiler``, which slows them; a row whose calls all
did takes them, and says so in ``latency_of``). A call is **profiled** when it was, or when a
call nested in it was (``profiled_by`` ``nested``: the SDPA call inside a layer call, profiled on
its own sampling): its kernels, core time and backend are then that nested call's
(:func:`profiles_within`).

- ``calls``: sampled calls; ``estimated_calls``: Σ ``1/attnscope.sample_rate`` over them (the calls
  the program made if sampling was uniform), a call the sampler had not chosen
  (``attnscope.extra``) counting 0; ``profiled``; ``latency_calls``: the calls the
  percentiles and rates are of.
- ``tokens``, ``flops``: Σ ``attnscope.tokens`` / ``attnscope.flops`` over every sampled call
  that has one (a profiled call saw its tokens like any other).
- Latency: quantiles (numpy's default, linear interpolation) of ``attnscope.wall_ns`` and,
  separately, ``attnscope.device_ns``; ``time_ns``: Σ time of the timed calls, a call's time
  being its device time where measured, else its wall time.
- Rates: tokens/s = Σ tokens ÷ Σ time over the timed calls that have tokens; TFLOP/s the same with
  FLOPs; core TFLOP/s = Σ FLOPs ÷ Σ ``attnscope.core_ns`` over the **profiled** calls that have
  both (core time is measured under the profiler: it can come out below TFLOP/s).
- ``all layers``: counts, FLOPs and time summed over every layer; tokens are those of the module
  that saw the most (every token passes every layer once), leaving out the forwards recomputed in
  a backward pass (phase ``recompute``: the same tokens again); tokens/s = 1 ÷ Σ over modules of
  (Σ time ÷ Σ tokens of its timed calls, its recomputed calls summed apart), the attention time a
  token spends in all layers.
- Kernels/ops: from profiled calls' ``attnscope.kernel.top_names``/``top_ns`` (each call's five
  biggest), as a share of their ``attnscope.kernel.total_ns``, and from calls timed inside a
  profiled call, which the worker gives the same from that profile's events; the overall row's
  also from profiled calls of an inner site that ran on their own (``traces.attention_calls``:
  SDPA in a layer call that was not sampled), whose layer is not known.
- Cost per 1,000 tokens: price per second ÷ tokens/s × 1,000 (attention time only).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .. import _schema as schema
from .roofline import FallbackStats, RooflineStats, fallbacks_of, roofline_of
from .traces import ATTENTION_FACTS, RECOMPUTE, GroupKey, SpanRow, call_backends, group_key

__all__ = ["Quantiles", "GroupStats", "Summary", "summarize", "quantiles", "time_ns", "wall_ns",
           "latency_rows", "operator_spans", "int_attribute", "shape_text", "sample_rate", "weight",
           "is_profiled", "under_profiler", "profiles_within", "first_calls", "PHASE_ORDER"]

CallId = tuple[str, str]  # (trace id, span id)

PHASE_ORDER = {"prefill": 0, "decode": 1, None: 2, RECOMPUTE: 3}


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Of nanosecond values: min, p5, p50, p95, p99, max."""

    min: float
    p5: float
    p50: float
    p95: float
    p99: float
    max: float


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One (module, phase, backend): the numbers of the report's table rows."""

    module: str
    phase: str | None
    backend: str | None  # measured or inherited (traces.call_backends); None: unknown
    label: str           # the module, with " · backend" when its phase ran under several
    calls: int
    estimated_calls: float
    profiled: int        # own profile, or a nested call's (see profiled_inside)
    latency_calls: int   # the calls the percentiles, time and rates are of
    latency_of: str      # "timed", or "profiled" when every call of the row was profiled
    wall: Quantiles
    device: Quantiles | None
    time_ns: int  # Σ device time where measured, else wall time, of the latency calls
    tokens: int | None
    flops: int | None
    tokens_per_s: float | None
    tflops: float | None
    core_tflops: float | None
    memory_peak_bytes: int | None
    # calls that recorded attnscope.backend themselves, per name (overall: and loose profiles)
    backends: Mapping[str, int]
    kernels: list[tuple[str, int, float]]  # (name, ns, share of profiled kernel time)
    cost_per_1k_tokens: float | None
    # calls marked attnscope.exact=false, per attnscope.inexact_reason (empty: all exact)
    inexact: Mapping[str, int] = field(default_factory=dict)
    roofline: RooflineStats | None = None  # :mod:`.roofline`: calls with a roofline
    fallbacks: FallbackStats | None = None  # calls named a silent fallback
    profiled_inside: int = 0  # of ``profiled``: through a call nested in them
    profiles: int = 0  # the profiled spans ``kernels`` and core TFLOP/s are of
    enclosed: int = 0  # of ``profiles``: calls timed inside a profiled call (no core time)


@dataclass(frozen=True, slots=True)
class Summary:
    """All groups, the overall figures, the slowest calls."""

    groups: list[GroupStats]
    overall: GroupStats
    slowest: list[SpanRow]
    sample_rates: list[float]
    price_per_hour: float | None
    services: list[str] = field(default_factory=list)
    labels: Mapping[CallId, str] = field(default_factory=dict)  # call id -> row label
    # a call profiled through calls nested in it: those calls (profiles_within)
    within: Mapping[CallId, list[SpanRow]] = field(default_factory=dict)
    first: frozenset[CallId] = frozenset()  # of the slowest: first calls (first_calls)

    @property
    def sampled(self) -> bool:
        """Whether some sample rate is below 1 (then estimated call counts are shown)."""
        return any(rate < 1 for rate in self.sample_rates)

    def label_of(self, row: SpanRow) -> str:
        """The row label of one of the summarised calls."""
        return self.labels.get((row.trace_id, row.span_id), group_key(row)[0])

    def times_p50(self, row: SpanRow) -> float | None:
        """The call's time (:func:`time_ns`) ÷ the p50 of its table row (layer, phase, backend)
        in the same measure, device or wall time; None when that row has no such p50."""
        label, phase = self.label_of(row), group_key(row)[1]
        group = next((g for g in self.groups if g.label == label and g.phase == phase), None)
        if group is None:
            return None
        device = int_attribute(row, schema.DEVICE_NS.name)
        p50 = (group.device.p50 if group.device is not None else None) \
            if device is not None and device > 0 else group.wall.p50
        return time_ns(row) / p50 if p50 else None


def quantiles(values: Sequence[float]) -> Quantiles:
    import numpy as np

    arr = np.asarray(values, dtype=np.float64)
    p5, p50, p95, p99 = np.percentile(arr, [5, 50, 95, 99])
    return Quantiles(float(arr.min()), float(p5), float(p50), float(p95), float(p99),
                     float(arr.max()))


def time_ns(row: SpanRow) -> int:
    """The call's time: device time when measured, else wall time (else the span's length)."""
    device = row.attributes.get(schema.DEVICE_NS.name)
    if isinstance(device, int) and device > 0:
        return device
    return wall_ns(row)


def wall_ns(row: SpanRow) -> int:
    """The call's wall time (``attnscope.wall_ns``, else the span's length)."""
    wall = row.attributes.get(schema.WALL_NS.name)
    return wall if isinstance(wall, int) and not isinstance(wall, bool) else row.duration_ns


def shape_text(row: SpanRow) -> str | None:
    """``B×Sq×Skv`` of a call (``?`` for one its span does not give); None without lengths."""
    sizes = [int_attribute(row, a.name)
             for a in (schema.BATCH_SIZE, schema.SEQ_LEN_Q, schema.SEQ_LEN_KV)]
    if sizes[1] is None and sizes[2] is None:
        return None
    return "×".join("?" if n is None else str(n) for n in sizes)


def int_attribute(row: SpanRow, key: str) -> int | None:
    value = row.attributes.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ints(rows: Iterable[SpanRow], key: str) -> list[int]:
    return [v for r in rows if (v := int_attribute(r, key)) is not None]


def is_profiled(row: SpanRow) -> bool:
    return row.attributes.get(schema.TIER.name) == "profile"


def under_profiler(row: SpanRow) -> bool:
    """Profiled, or timed inside a profiled call (``attnscope.profiled_by``): either way the
    profiler ran during the call and slowed it (5x for a prefill layer on CPU)."""
    return is_profiled(row) or schema.PROFILED_BY.name in row.attributes


def latency_rows(rows: Sequence[SpanRow],
                 within: Mapping[CallId, Any] | None = None) -> list[SpanRow]:
    """The calls latency and rates are of: those the profiler did not slow, else (it slowed all)
    all of them. ``within``: calls profiled through a nested call (:func:`profiles_within`),
    slowed too."""
    return [r for r in rows if not under_profiler(r)
            and (within is None or (r.trace_id, r.span_id) not in within)] or list(rows)


def profiles_within(rows: Sequence[SpanRow], calls: Sequence[SpanRow]
                    ) -> tuple[dict[CallId, list[SpanRow]], list[SpanRow]]:
    """The profiled call spans among ``rows`` that are not among ``calls``: by the call of
    ``calls`` they are a child of (the SDPA call inside a layer call: the layer's attention
    core, profiled), and those with attention facts that are no call's child (an inner site's
    call that ran on its own). A profiled decoder layer or forward is neither."""
    reported = {(c.trace_id, c.span_id) for c in calls}
    within: dict[CallId, list[SpanRow]] = defaultdict(list)
    loose: list[SpanRow] = []
    for r in rows:
        if not is_profiled(r) or schema.KERNEL_KIND.name in r.attributes \
                or (r.trace_id, r.span_id) in reported:
            continue
        if r.parent_id and (r.trace_id, r.parent_id) in reported:
            within[(r.trace_id, r.parent_id)].append(r)
        elif any(key in r.attributes for key in ATTENTION_FACTS):
            loose.append(r)
    for c in calls:  # said by the worker, its nested span not in the file (cut, or filtered)
        if c.attributes.get(schema.PROFILED_BY.name) == "nested":
            within.setdefault((c.trace_id, c.span_id), [])
    return dict(within), loose


def _over_time(rows: Sequence[SpanRow], key: str) -> tuple[int, int] | None:
    """(Σ ``key``, Σ time) over the calls of ``rows`` that have ``key``; None when none has."""
    having = [(v, time_ns(r)) for r in rows if (v := int_attribute(r, key)) is not None]
    return (sum(v for v, _ in having), sum(t for _, t in having)) if having else None


def _rate(pair: tuple[int, int] | None) -> float | None:
    return pair[0] / pair[1] * 1e9 if pair and pair[0] and pair[1] else None


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


def _stats(key: GroupKey, label: str, rows: Sequence[SpanRow], price_per_hour: float | None,
           within: Mapping[CallId, list[SpanRow]], tokens: int | None = None,
           tokens_per_s: float | None = None, loose: Sequence[SpanRow] = ()) -> GroupStats:
    """One row. ``tokens``/``tokens_per_s``/``loose``: given for the overall row (see the module
    doc); ``within``: :func:`profiles_within`."""
    timed = latency_rows(rows, within)
    devices = _ints(timed, schema.DEVICE_NS.name)
    all_tokens, all_flops = _ints(rows, schema.TOKENS.name), _ints(rows, schema.FLOPS.name)
    if tokens is None and all_tokens:
        tokens = sum(all_tokens)
    if tokens_per_s is None:
        tokens_per_s = _rate(_over_time(timed, schema.TOKENS.name))
    inside = [r for r in rows if not is_profiled(r) and (r.trace_id, r.span_id) in within]
    profiled = [r for r in rows if is_profiled(r)]
    # timed inside a profiled call, their kernels from its events (_profiles/windows.py)
    enclosed = [r for r in rows if not is_profiled(r) and schema.KERNEL_TOP_NAMES.name in
                r.attributes and r.attributes.get(schema.PROFILED_BY.name) == "enclosing"]
    profiles = [*profiled, *(p for r in inside for p in within[(r.trace_id, r.span_id)]),
                *loose, *enclosed]
    cored = [(f, c) for r in profiles if (f := int_attribute(r, schema.FLOPS.name)) is not None
             and (c := int_attribute(r, schema.CORE_NS.name))]
    core = _rate((sum(f for f, _ in cored), sum(c for _, c in cored))) if cored else None
    flop_rate = _rate(_over_time(timed, schema.FLOPS.name))
    peaks = _ints(rows, schema.PEAK_BYTES.name)
    backends = Counter(str(r.attributes[schema.BACKEND.name]) for r in (*rows, *loose)
                       if schema.BACKEND.name in r.attributes)
    return GroupStats(
        module=key[0], phase=key[1], backend=key[2], label=label, calls=len(rows),
        estimated_calls=sum(weight(r) for r in rows),
        profiled=len(profiled) + len(inside), latency_calls=len(timed),
        latency_of="timed" if any(not under_profiler(r) and (r.trace_id, r.span_id) not in within
                                  for r in rows) else "profiled",
        wall=quantiles([wall_ns(r) for r in timed]),
        device=quantiles(devices) if devices else None,
        time_ns=sum(time_ns(r) for r in timed), tokens=tokens,
        flops=sum(all_flops) if all_flops else None, tokens_per_s=tokens_per_s,
        tflops=flop_rate / 1e12 if flop_rate is not None else None,
        core_tflops=core / 1e12 if core is not None else None,
        memory_peak_bytes=max(peaks) if peaks else None, backends=dict(backends),
        kernels=_kernels(profiles),
        cost_per_1k_tokens=(price_per_hour / 3600 / tokens_per_s * 1e3
                            if price_per_hour is not None and tokens_per_s else None),
        inexact=dict(Counter(str(r.attributes.get(schema.INEXACT_REASON.name, "unknown"))
                             for r in rows if r.attributes.get(schema.EXACT.name) is False)),
        roofline=roofline_of(rows), fallbacks=fallbacks_of(rows), profiled_inside=len(inside),
        profiles=len(profiles), enclosed=len(enclosed))


def sample_rate(row: SpanRow) -> float:
    rate = row.attributes.get(schema.SAMPLE_RATE.name)
    return float(rate) if isinstance(rate, (int, float)) and 0 < rate <= 1 else 1.0


def weight(row: SpanRow) -> float:
    """How many of the program's calls ``row`` stands for: 1/its sample rate; 0 for a call the
    sampler had not chosen (``attnscope.extra``: profiled after a slow call, outside the random
    sample, whose own calls estimate all of them)."""
    return 0.0 if row.attributes.get(schema.EXTRA.name) is True else 1.0 / sample_rate(row)


def _random(rows: Sequence[SpanRow]) -> Sequence[SpanRow]:
    """``rows`` without the extra ones (:func:`weight` 0), unless that leaves none."""
    drawn = [r for r in rows if r.attributes.get(schema.EXTRA.name) is not True]
    return drawn or rows


def _order(key: GroupKey, rows: Sequence[SpanRow]) -> tuple[Any, ...]:
    index = rows[0].attributes.get(schema.LAYER_INDEX.name)
    return (index if isinstance(index, int) else 1 << 30, key[0], PHASE_ORDER.get(key[1], 4),
            min(r.start_ns for r in rows), key[2] or "")


def _overall_tokens_per_s(calls: Sequence[SpanRow],
                          within: Mapping[CallId, list[SpanRow]]) -> float | None:
    """1 ÷ Σ over modules of (Σ time ÷ Σ tokens of its timed calls): a token passes every
    layer once, so its attention time is the sum of the layers' time per token. A layer's
    recomputed forwards (checkpointing) are summed apart: each is a second pass of its tokens,
    whose time per token adds to the first's."""
    per_module: dict[tuple[str, bool], list[SpanRow]] = defaultdict(list)
    for row in calls:
        module, phase = group_key(row)
        per_module[(module, phase == RECOMPUTE)].append(row)
    seconds_per_token = 0.0
    for rows in per_module.values():
        pair = _over_time(latency_rows(rows, within), schema.TOKENS.name)
        if pair and pair[0]:
            seconds_per_token += pair[1] / 1e9 / pair[0]
    return 1.0 / seconds_per_token if seconds_per_token > 0 else None


def summarize(calls: Sequence[SpanRow], price_per_hour: float | None = None,
              top: int = 5, rows: Sequence[SpanRow] | None = None) -> Summary:
    """The report's numbers for ``calls`` (from :func:`attnscope.cli.traces.attention_calls`).
    ``rows``: every span of the trace, whose call spans nested in ``calls`` tell their sites
    apart (:func:`attnscope.cli.traces.call_backends`); default ``calls``."""
    every = calls if rows is None else rows
    backend_of = call_backends(every, calls)
    within, loose = profiles_within(every, calls)
    grouped: dict[GroupKey, list[SpanRow]] = defaultdict(list)
    for row in calls:
        module, phase = group_key(row)
        grouped[(module, phase, backend_of.get((row.trace_id, row.span_id)))].append(row)
    keys = sorted(grouped, key=lambda k: _order(k, grouped[k]))
    # a label names the backend where one layer and phase ran under several
    backends_per_row: dict[tuple[str, str | None], set[str | None]] = defaultdict(set)
    for k in keys:
        backends_per_row[(k[0], k[1])].add(k[2])
    label = {k: f"{k[0]} · {k[2] or '—'}" if len(backends_per_row[(k[0], k[1])]) > 1 else k[0]
             for k in keys}
    groups = [_stats(k, label[k], grouped[k], price_per_hour, within) for k in keys]
    per_module: Counter[str] = Counter()
    for g in groups:
        if g.phase != RECOMPUTE:  # the same tokens again
            per_module[g.module] += g.tokens or 0
    most_tokens = max(per_module.values(), default=0) or None
    overall = _stats(("all layers", None, None), "all layers", calls, price_per_hour, within,
                     tokens=most_tokens, tokens_per_s=_overall_tokens_per_s(calls, within),
                     loose=loose)
    # of the calls the profiler did not slow (it made the profiled ones the slowest, 5-20x on CPU)
    slowest = sorted(latency_rows(calls, within), key=lambda r: (-time_ns(r), r.start_ns))[:top]
    rates = sorted({sample_rate(r) for r in _random(calls)})
    services = sorted({r.service for r in calls if r.service})
    labels = {(r.trace_id, r.span_id): label[k] for k, members in grouped.items() for r in members}
    return Summary(groups, overall, slowest, rates, price_per_hour, services, labels, within,
                   first_calls(calls, slowest))


def first_calls(calls: Sequence[SpanRow], of: Sequence[SpanRow]) -> frozenset[CallId]:
    """Those of ``of`` that are their process's first call of their layer and phase: the
    earliest of ``calls`` in it, sampled at rate 1 by a process that configured no warm-up calls
    (``attnscope.config.warmup_calls`` 0), so that no earlier call can have gone unsampled. Such
    a call pays torch's first-use costs."""
    earliest: dict[tuple[Any, ...], SpanRow] = {}
    for r in calls:
        key = (r.service, r.resource.get("host.name"), r.resource.get("process.pid"),
               *group_key(r))
        if key not in earliest or r.start_ns < earliest[key].start_ns:
            earliest[key] = r
    firsts = {(r.trace_id, r.span_id) for r in earliest.values()
              if sample_rate(r) == 1.0 and r.resource.get("process.pid") is not None
              and r.resource.get(schema.CONFIG_WARMUP_CALLS.name) == 0}
    return frozenset(c for r in of if (c := (r.trace_id, r.span_id)) in firsts)


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
