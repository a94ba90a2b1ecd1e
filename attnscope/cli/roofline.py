"""Per-layer roofline and fallback figures of a trace, from the attributes the worker wrote.

A call's roofline (``attnscope.roofline.*``: peaks configured, or a CUDA device attnscope knows)
and its fallback verdict (``attnscope.backend.fallback``) are span attributes; this module
collects them per report row:

- ``calls``: calls of the row with a roofline; ``intensity``, ``achieved_tflops``, ``fraction``:
  medians of their ``arithmetic_intensity``, ``roofline.achieved_tflops``, ``roofline.fraction``.
  The worker rounds those to 4 significant digits; where a span also holds the exact integers
  they came from (``flops``, ``bytes`` and the time ``roofline.time_source`` names), a call's
  three figures are taken from those, so that a figure printed at 3 digits is rounded once;
  ``roof_tflops``: the median of each call's roof, ``min(peak_tflops, intensity × peak_gbps)``;
  ``bound``: the bound most of them had (ties: ``memory``); ``peak_source``: theirs, joined.
- :func:`roofs_of`: the distinct peaks the calls were measured against (a trace can hold several:
  dtypes with different compute peaks, several devices), one roof each for the HTML plot.
- ``fallbacks``: calls with ``attnscope.backend.fallback = true``; ``expected``, ``reason``: the
  most frequent among them.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import median

from .. import _schema as schema
from .traces import SpanRow

__all__ = ["RooflineStats", "FallbackStats", "Roof", "roofline_of", "roofs_of", "fallbacks_of"]

_FRACTION, _ACHIEVED = schema.ROOFLINE_FRACTION.name, schema.ROOFLINE_ACHIEVED_TFLOPS.name
_INTENSITY, _BOUND = schema.ARITHMETIC_INTENSITY.name, schema.ROOFLINE_BOUND.name
_PEAK_T, _PEAK_G = schema.ROOFLINE_PEAK_TFLOPS.name, schema.ROOFLINE_PEAK_GBPS.name
_SOURCE = schema.ROOFLINE_PEAK_SOURCE.name
_FLOPS, _BYTES = schema.FLOPS.name, schema.BYTES.name
_TIME_SOURCE = schema.ROOFLINE_TIME_SOURCE.name
# roofline.time_source names the time by its key (derive.roofline): the attribute holding it
_TIMES = {a.key: a.name for a in (schema.CORE_NS, schema.DEVICE_NS, schema.WALL_NS)}
_FALLBACK, _EXPECTED, _REASON = (schema.BACKEND_FALLBACK.name, schema.BACKEND_EXPECTED.name,
                                 schema.BACKEND_REASON.name)


@dataclass(frozen=True, slots=True)
class RooflineStats:
    """A row's calls under their roofs (see the module doc)."""

    calls: int
    intensity: float
    achieved_tflops: float
    roof_tflops: float
    fraction: float
    bound: str
    peak_source: str


@dataclass(frozen=True, slots=True)
class Roof:
    """One pair of peaks some calls carried, and how many calls carried it."""

    peak_tflops: float
    peak_gbps: float
    peak_source: str
    calls: int

    @property
    def ridge(self) -> float:
        """The intensity (FLOP/byte) where the memory roof meets the compute roof."""
        return self.peak_tflops * 1e3 / self.peak_gbps

    def at(self, intensity: float) -> float:
        """The roof at ``intensity``, in TFLOP/s."""
        return min(self.peak_tflops, intensity * self.peak_gbps / 1e3)  # GB/s × FLOP/B = GFLOP/s


@dataclass(frozen=True, slots=True)
class FallbackStats:
    """A row's calls named a fallback (see the module doc)."""

    calls: int
    expected: str | None
    reason: str | None


def _num(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _figures(row: SpanRow) -> tuple[float, float, float, float, Roof] | None:
    """(intensity, achieved TFLOP/s, roof, fraction, peaks) of a call, None unless it has all."""
    a = row.attributes
    fraction, achieved, intensity = (_num(a.get(_FRACTION)), _num(a.get(_ACHIEVED)),
                                     _num(a.get(_INTENSITY)))
    peak_t, peak_g = _num(a.get(_PEAK_T)), _num(a.get(_PEAK_G))
    if fraction is None or achieved is None or intensity is None or peak_t is None \
            or peak_g is None or peak_t <= 0 or peak_g <= 0:
        return None
    peaks = Roof(peak_t, peak_g, str(a.get(_SOURCE, "")), 1)
    exact = _exact(a)
    if exact is not None:  # the same figures, from the integers the rounded ones came from
        intensity, achieved = exact
        roof = peaks.at(intensity)
        return intensity, achieved, roof, achieved / roof, peaks
    return intensity, achieved, peaks.at(intensity), fraction, peaks


def _exact(a: Mapping[str, object]) -> tuple[float, float] | None:
    """(FLOP/byte, TFLOP/s) of a call from its FLOPs, bytes and the time its roofline used;
    None unless the span holds all three as positive integers."""
    flops, moved = a.get(_FLOPS), a.get(_BYTES)
    time_name = _TIMES.get(str(a.get(_TIME_SOURCE)))
    ns = a.get(time_name) if time_name is not None else None
    if type(flops) is not int or type(moved) is not int or type(ns) is not int \
            or min(flops, moved, ns) <= 0:
        return None
    return flops / moved, flops / ns / 1e3  # FLOP/ns is GFLOP/s


def roofline_of(rows: Sequence[SpanRow]) -> RooflineStats | None:
    """The row's roofline, or None when no call of it has one."""
    found = []
    for r in rows:
        figures = _figures(r)
        if figures is not None:
            found.append((*figures[:4], str(r.attributes.get(_BOUND, "")),
                          figures[4].peak_source))
    if not found:
        return None
    bounds = Counter(f[4] for f in found)
    bound = max(sorted(bounds), key=lambda b: (bounds[b], b == "memory"))
    return RooflineStats(
        calls=len(found), intensity=median(f[0] for f in found),
        achieved_tflops=median(f[1] for f in found), roof_tflops=median(f[2] for f in found),
        fraction=median(f[3] for f in found), bound=bound,
        peak_source=",".join(sorted({f[5] for f in found if f[5]})))


def roofs_of(rows: Sequence[SpanRow]) -> list[Roof]:
    """The distinct peaks among the calls of ``rows`` with a roofline, most calls first."""
    counts = Counter((f[4].peak_tflops, f[4].peak_gbps, f[4].peak_source)
                     for f in map(_figures, rows) if f is not None)
    return [Roof(t, g, source, n) for (t, g, source), n
            in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]


def fallbacks_of(rows: Sequence[SpanRow]) -> FallbackStats | None:
    """The row's fallbacks, or None when no call of it was named one."""
    fell = [r.attributes for r in rows if r.attributes.get(_FALLBACK) is True]
    if not fell:
        return None
    expected = Counter(str(a[_EXPECTED]) for a in fell if _EXPECTED in a)
    reasons = Counter(str(a[_REASON]) for a in fell if _REASON in a)
    return FallbackStats(len(fell), expected.most_common(1)[0][0] if expected else None,
                         reasons.most_common(1)[0][0] if reasons else None)
