"""``attnscope diff``'s data: the attention calls of two traces, grouped by (module, phase), each
group present in both compared metric by metric (:mod:`._stats`).

Per call, from the span's attributes:

- time: device time (``attnscope.device_ns``) when measured, else wall time (``summary.time_ns``,
  the same rule as ``attnscope report``); profiled calls are left out (they ran under
  ``torch.profiler``, which slows them down and would mix two populations);
- tokens/s: ``attnscope.tokens`` ÷ that time, for the same calls;
- memory peak: ``attnscope.memory.peak_bytes``, from every call that has it (the profiled ones on
  CPU; on CUDA also timed calls with ``reset_peak_memory_stats``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ._stats import CONFIDENCE, METRICS, Change, compare, gate_failed
from ..traces import SpanRow, group_key
from ..summary import PHASE_ORDER, time_ns
from ... import _schema as schema

__all__ = ["Key", "GroupDiff", "Diary", "diary", "per_call_values"]

Key = tuple[str, str | None]


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


@dataclass(frozen=True, slots=True)
class Diary:
    """The whole comparison: the shared groups, those in one trace only, the rule's settings."""

    groups: list[GroupDiff]
    only_before: list[tuple[Key, int]]
    only_after: list[tuple[Key, int]]
    min_change: float
    confidence: float

    def gate_failures(self, limit: float) -> list[tuple[GroupDiff, Change]]:
        """The p50 times slower than ``limit`` (a fraction) beyond noise."""
        return [(g, c) for g in self.groups for c in g.changes if gate_failed(c, limit)]


def _int(row: SpanRow, key: str) -> int | None:
    value = row.attributes.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _clock(rows: Sequence[SpanRow]) -> str:
    device = sum(1 for r in rows if (_int(r, schema.DEVICE_NS.name) or 0) > 0)
    return "device" if device == len(rows) and rows else "wall" if not device else "device+wall"


def per_call_values(rows: Sequence[SpanRow]) -> dict[str, list[float]]:
    """The per-call samples of one group, by ``Metric.value``."""
    timed = [r for r in rows if r.attributes.get(schema.TIER.name) != "profile"]
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


def _group_diff(key: Key, before: Sequence[SpanRow], after: Sequence[SpanRow],
                min_change: float, confidence: float) -> GroupDiff:
    vb, va = per_call_values(before), per_call_values(after)
    changes: list[Change] = []
    for value in dict.fromkeys(m.value for m in METRICS):
        metrics = tuple(m for m in METRICS if m.value == value)
        changes += compare(vb[value], va[value], metrics, min_change=min_change,
                           confidence=confidence)
    return GroupDiff(key[0], key[1], len(before), len(after), _clock(before), _clock(after),
                     changes)


def diary(before: Sequence[SpanRow], after: Sequence[SpanRow], *, min_change: float,
          confidence: float = CONFIDENCE) -> Diary:
    """Compare the attention calls ``before`` and ``after`` (from ``traces.attention_calls``).
    ``min_change``: the smallest relative change (a fraction) a verdict other than "no change"
    needs."""
    gb, ga = _grouped(before), _grouped(after)
    shared = sorted(set(gb) & set(ga), key=lambda k: _order(k, gb[k]))
    return Diary(
        groups=[_group_diff(k, gb[k], ga[k], min_change, confidence) for k in shared],
        only_before=_only(gb, ga), only_after=_only(ga, gb),
        min_change=min_change, confidence=confidence)


def _only(these: Mapping[Key, list[SpanRow]], others: Mapping[Key, list[SpanRow]]
          ) -> list[tuple[Key, int]]:
    keys = sorted(set(these) - set(others), key=lambda k: _order(k, these[k]))
    return [(k, len(these[k])) for k in keys]
