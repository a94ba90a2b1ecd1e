"""``attnscope compare``'s figures, read from attnscope's own spans of each implementation.

Timed calls (``compare.phase`` = ``timed``): wall time, and device time on CUDA, as percentiles;
FLOPs as attnscope counted them; the median time of each round (``compare.round``, see ``_plan``)
for the ranking. Profiled calls (``profiled``, profile tier): the backend that
ran, kernels (CUDA) or ATen ops (CPU) per call, the names with the most time, the memory peak.
"""

from __future__ import annotations

import collections
import dataclasses
import statistics
from collections.abc import Iterable, Mapping
from typing import Any

import numpy

from ... import _schema as schema

__all__ = ["Figures", "figures", "PERCENTILES"]

PERCENTILES = (50, 95, 99)


@dataclasses.dataclass
class Figures:
    """What attnscope's spans say about one implementation (``None``: not measured)."""

    calls: int = 0
    wall_us: dict[str, float] | None = None
    device_us: dict[str, float] | None = None
    flops: int | None = None
    tflops: float | None = None
    profiled: int = 0
    backend: str | None = None
    kernels_per_call: int | None = None
    top_names: list[str] = dataclasses.field(default_factory=list)
    peak_memory_bytes: int | None = None
    # round → the median time of its timed calls, in time_us's basis (µs)
    rounds: dict[int, float] = dataclasses.field(default_factory=dict)

    @property
    def time_us(self) -> dict[str, float] | None:
        """The time figures are based on: device time when measured (CUDA), else wall time."""
        return self.device_us or self.wall_us


def _percentiles(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    found = numpy.percentile(numpy.asarray(values, dtype=float), PERCENTILES)
    return {f"p{p}": round(float(v), 3) for p, v in zip(PERCENTILES, found, strict=True)}


def figures(spans: Iterable[Any], name: str) -> Figures:
    """The figures of the spans named ``name`` (``ReadableSpan``s or anything with ``name`` and
    ``attributes``)."""
    timed: list[Mapping[str, Any]] = []
    profiled: list[Mapping[str, Any]] = []
    for span in spans:
        if span.name != name:
            continue
        attrs = dict(span.attributes or {})
        phase = attrs.get("compare.phase")
        if phase == "timed" and attrs.get(schema.TIER.name) == "timing":
            timed.append(attrs)
        elif phase == "profiled" and attrs.get(schema.TIER.name) == "profile":
            profiled.append(attrs)
    out = Figures(calls=len(timed), profiled=len(profiled))
    out.wall_us = _percentiles([a[schema.WALL_NS.name] / 1e3 for a in timed
                                if schema.WALL_NS.name in a])
    out.device_us = _percentiles([a[schema.DEVICE_NS.name] / 1e3 for a in timed
                                  if schema.DEVICE_NS.name in a])
    out.rounds = _round_medians(timed, schema.DEVICE_NS.name if out.device_us is not None
                                else schema.WALL_NS.name)
    flops = [a[schema.FLOPS.name] for a in timed if schema.FLOPS.name in a]
    if flops:
        out.flops = int(flops[0])
        basis = out.time_us
        if basis is not None and basis["p50"] > 0:
            out.tflops = out.flops / (basis["p50"] * 1e-6) / 1e12
    _profiled(out, profiled)
    return out


def _round_medians(timed: list[Mapping[str, Any]], key: str) -> dict[int, float]:
    by_round: dict[int, list[float]] = collections.defaultdict(list)
    for a in timed:
        r = a.get("compare.round")
        if isinstance(r, int) and key in a:
            by_round[r].append(a[key] / 1e3)
    return {r: float(statistics.median(v)) for r, v in sorted(by_round.items())}


def _profiled(out: Figures, profiled: list[Mapping[str, Any]]) -> None:
    if not profiled:
        return
    backends = collections.Counter(str(a.get(schema.BACKEND.name, "unknown")) for a in profiled)
    out.backend = backends.most_common(1)[0][0]
    counts = [int(a[schema.KERNEL_COUNT.name]) for a in profiled if schema.KERNEL_COUNT.name in a]
    if counts:
        out.kernels_per_call = int(statistics.median_low(counts))
    names = profiled[-1].get(schema.KERNEL_TOP_NAMES.name)
    out.top_names = [str(n) for n in names] if isinstance(names, (list, tuple)) else []
    peaks = [int(a[schema.PEAK_BYTES.name]) for a in profiled
             if schema.PEAK_BYTES.name in a]
    out.peak_memory_bytes = max(peaks) if peaks else None
