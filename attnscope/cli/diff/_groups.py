"""``attnscope diff``'s data: the attention calls of two sides (one run each, or several),
grouped by (module, phase), each group present in both compared metric by metric: one run per
side by the call-level bootstrap of :mod:`._stats`, several by the hierarchical bootstrap over
runs of :mod:`._runs`. A run keeps its calls apart from the other runs' throughout.

Per call, from the span's attributes:

- time: device time (``attnscope.device_ns``) when measured, else wall time (``summary.time_ns``,
  the same rule as ``attnscope report``); profiled calls, and calls timed inside a profiled one
  (``attnscope.profiled_by``), are left out (they ran under ``torch.profiler``, which slows them
  down and would mix two populations);
- tokens/s: ``attnscope.tokens`` ÷ that time, for the same calls;
- memory peak: ``attnscope.memory.peak_bytes``, from every call that has it (the profiled ones on
  CPU; on CUDA also timed calls with ``reset_peak_memory_stats``). A side that measured it keeps
  its figure when the other did not (no change to compute: "not measured").

Groups are matched by (module, phase) only, whatever implementation ran them: switching the
implementation is the change people diff most. Each side's backends (``traces.call_backends``:
a profiled call's own, or its site's) are kept beside the group (:class:`Backends`); a call
with none known counts as unknown, never as a guess.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from ... import _schema as schema
from ..summary import PHASE_ORDER, time_ns, under_profiler
from ..traces import SpanRow, call_backends, group_key
from ._runs import compare_runs, noise_floor, run_quantiles
from ._stats import CONFIDENCE, FEW, METRICS, Change, compare, gate_failed, gate_inconclusive

__all__ = ["Key", "Backends", "GroupDiff", "Diary", "Noise", "diary", "diary_runs", "noise",
           "per_call_values", "side_backends"]

Key = tuple[str, str | None]


@dataclass(frozen=True, slots=True)
class Backends:
    """The attention backends one side's calls of a group ran under: each backend's calls
    (most calls first), and the calls whose backend is unknown (timed, never profiled)."""

    calls: tuple[tuple[str, int], ...] = ()
    unknown: int = 0

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.calls)


def side_backends(runs: Sequence[tuple[Sequence[SpanRow], Sequence[SpanRow]]]
                  ) -> dict[Key, Backends]:
    """Per group, the backends of one side: ``runs`` holds each run's (spans, attention
    calls). Each run is resolved on its own (span ids are only unique within a trace)."""
    counts: dict[Key, Counter[str | None]] = defaultdict(Counter)
    for spans, calls in runs:
        known = call_backends(spans, calls)
        for call in calls:
            counts[group_key(call)][known.get((call.trace_id, call.span_id))] += 1
    out = {}
    for key, counter in counts.items():
        named = sorted(((b, n) for b, n in counter.items() if b is not None),
                       key=lambda item: (-item[1], item[0]))
        out[key] = Backends(tuple(named), counter.get(None, 0))
    return out


@dataclass(frozen=True, slots=True)
class GroupDiff:
    """One (module, phase) present in both traces."""

    module: str
    phase: str | None
    calls_before: int   # every attention call of the group, profiled ones included
    calls_after: int
    clock_before: str   # "device", "wall" or "device+wall": the time the quantiles are of
    clock_after: str
    changes: list[Change]
    runs_before: int = 1  # runs of each side with calls of this group
    runs_after: int = 1
    backends_before: Backends = field(default_factory=Backends)
    backends_after: Backends = field(default_factory=Backends)

    def p50(self) -> Change | None:
        """The p50 time's change (the gate's and the noise floor's metric)."""
        return next((c for c in self.changes if c.metric.value == "time" and c.metric.q == 0.5),
                    None)


@dataclass(frozen=True, slots=True)
class Diary:
    """The whole comparison: the shared groups, those in one trace only, the rule's settings."""

    groups: list[GroupDiff]
    only_before: list[tuple[Key, int]]
    only_after: list[tuple[Key, int]]
    min_change: float
    confidence: float
    runs_before: int = 1
    runs_after: int = 1

    @property
    def run_level(self) -> bool:
        """Whether run-to-run noise is measured: at least two runs on each side."""
        return min(self.runs_before, self.runs_after) >= 2

    def p50_judgeable(self) -> bool:
        """Whether any group has enough timed calls for a p50 verdict (the gate's metric)."""
        return any(c.metric.name == "p50" and c.verdict != FEW for g in self.groups
                   for c in g.changes)

    def gate_failures(self, limit: float) -> list[tuple[GroupDiff, Change]]:
        """The p50 times slower than ``limit`` (a fraction) beyond noise."""
        return [(g, c) for g in self.groups for c in g.changes if gate_failed(c, limit)]

    def gate_inconclusive(self, limit: float) -> list[tuple[GroupDiff, Change]]:
        """The p50 times whose interval straddles ``limit``: the gate passes them, by name."""
        return [(g, c) for g in self.groups for c in g.changes if gate_inconclusive(c, limit)]


def _int(row: SpanRow, key: str) -> int | None:
    value = row.attributes.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _clock(rows: Sequence[SpanRow]) -> str:
    device = sum(1 for r in rows if (_int(r, schema.DEVICE_NS.name) or 0) > 0)
    return "device" if device == len(rows) and rows else "wall" if not device else "device+wall"


def per_call_values(rows: Sequence[SpanRow]) -> dict[str, list[float]]:
    """The per-call samples of one group, by ``Metric.value``."""
    timed = [r for r in rows if not under_profiler(r)]  # the profiler slowed the others
    times = [float(time_ns(r)) for r in timed]
    rates = [tokens / t * 1e9 for r, t in zip(timed, times, strict=True)
             if (tokens := _int(r, schema.TOKENS.name)) is not None and t > 0]
    peaks = [float(p) for r in rows if (p := _int(r, schema.PEAK_BYTES.name)) is not None]
    return {"time": times, "tokens_per_s": rates, "memory": peaks}


def _grouped(calls: Sequence[SpanRow]) -> dict[Key, list[SpanRow]]:
    out: dict[Key, list[SpanRow]] = defaultdict(list)
    for row in calls:
        out[group_key(row)].append(row)
    return out


def _order(key: Key, rows: Sequence[SpanRow]) -> tuple[int, str, int]:
    index = _int(rows[0], schema.LAYER_INDEX.name)
    return (index if index is not None else 1 << 30, key[0], PHASE_ORDER.get(key[1], 3))


def _group_diff(key: Key, before: list[list[SpanRow]], after: list[list[SpanRow]],
                min_change: float, confidence: float, by_runs: bool,
                backends: tuple[Mapping[Key, Backends], Mapping[Key, Backends]]) -> GroupDiff:
    """``before``/``after``: the group's calls in each run that has some."""
    vb = [per_call_values(run) for run in before]
    va = [per_call_values(run) for run in after]
    changes: list[Change] = []
    for value in dict.fromkeys(m.value for m in METRICS):
        metrics = tuple(m for m in METRICS if m.value == value)
        if by_runs:
            changes += compare_runs([v[value] for v in vb], [v[value] for v in va], metrics,
                                    min_change=min_change, confidence=confidence)
        else:
            changes += compare(vb[0][value], va[0][value], metrics, min_change=min_change,
                               confidence=confidence)
    all_b = [r for run in before for r in run]
    all_a = [r for run in after for r in run]
    return GroupDiff(key[0], key[1], len(all_b), len(all_a), _clock(all_b), _clock(all_a),
                     changes, len(before), len(after),
                     backends[0].get(key, Backends(unknown=len(all_b))),
                     backends[1].get(key, Backends(unknown=len(all_a))))


def diary(before: Sequence[SpanRow], after: Sequence[SpanRow], *, min_change: float,
          confidence: float = CONFIDENCE) -> Diary:
    """Compare the attention calls ``before`` and ``after`` (from ``traces.attention_calls``),
    one run each. ``min_change``: the smallest relative change (a fraction) a verdict other
    than "no change" needs."""
    return diary_runs([before], [after], min_change=min_change, confidence=confidence)


def diary_runs(before: Sequence[Sequence[SpanRow]], after: Sequence[Sequence[SpanRow]], *,
               min_change: float, confidence: float = CONFIDENCE,
               backends: tuple[Mapping[Key, Backends], Mapping[Key, Backends]] = ({}, {})
               ) -> Diary:
    """Compare the runs ``before`` with the runs ``after`` (each run: its attention calls).
    Several runs on either side: the hierarchical bootstrap over runs (:mod:`._runs`).
    ``backends``: each side's :func:`side_backends` (a group missing there: all unknown)."""
    gb, ga = _grouped_runs(before), _grouped_runs(after)
    first_b = {k: runs[0] for k, runs in gb.items()}
    first_a = {k: runs[0] for k, runs in ga.items()}
    shared = sorted(set(gb) & set(ga), key=lambda k: _order(k, gb[k][0]))
    by_runs = max(len(before), len(after)) > 1
    return Diary(
        groups=[_group_diff(k, gb[k], ga[k], min_change, confidence, by_runs, backends)
                for k in shared],
        only_before=_only_runs(gb, first_b, ga), only_after=_only_runs(ga, first_a, gb),
        min_change=min_change, confidence=confidence,
        runs_before=len(before), runs_after=len(after))


@dataclass(frozen=True, slots=True)
class Noise:
    """The A/A noise floor of one group over the runs of one side: each run's p50 time and the
    largest relative difference between two of them (``nan``: fewer than two runs)."""

    module: str
    phase: str | None
    calls: int
    p50s: tuple[float, ...]
    spread: float


def noise(runs: Sequence[Sequence[SpanRow]]) -> list[Noise]:
    """The noise floor of every group of ``runs`` (runs of one program), by p50 time."""
    grouped = _grouped_runs(runs)
    out = []
    for key in sorted(grouped, key=lambda k: _order(k, grouped[k][0])):
        times = [t for run in grouped[key] if (t := per_call_values(run)["time"])]
        p50s = tuple(float(v) for v in run_quantiles(times, [0.5])[:, 0]) if times else ()
        out.append(Noise(key[0], key[1], sum(len(run) for run in grouped[key]), p50s,
                         noise_floor(p50s)))
    return out


def _grouped_runs(runs: Sequence[Sequence[SpanRow]]) -> dict[Key, list[list[SpanRow]]]:
    """Per group, its calls in each run that has some (in run order)."""
    out: dict[Key, list[list[SpanRow]]] = defaultdict(list)
    for run in runs:
        for key, rows in _grouped(run).items():
            out[key].append(rows)
    return out


def _only_runs(these: Mapping[Key, list[list[SpanRow]]], first: Mapping[Key, list[SpanRow]],
               others: Mapping[Key, list[list[SpanRow]]]) -> list[tuple[Key, int]]:
    keys = sorted(set(these) - set(others), key=lambda k: _order(k, first[k]))
    return [(k, sum(len(run) for run in these[k])) for k in keys]
