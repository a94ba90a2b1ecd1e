"""Per call site, a running estimate of its latency distribution; slow calls escalate.

The worker sees every timing-tier capture. For each (call site, phase) it keeps a log-bucketed
histogram of the call's time (device time when there is one, else wall time): ``_PER_OCTAVE``
buckets per doubling from 1 µs to about 18 minutes, counts halved every ``_HALF_LIFE`` samples so
the estimate follows a service whose load drifts. A call beyond the ``slow_call_quantile`` of the
estimate made *before* it (at least ``MIN_SAMPLES`` earlier calls) is slow: its span says so, and
the site is armed (``runtime.grants``) so that its next call in the same shape bucket is profiled.
"""

from __future__ import annotations

import math
import weakref
from math import log
from typing import Any

from .._record import buckets as _buckets
from .._record.capture import TIER_TIMING, Capture
from .._runtime import runtime

__all__ = ["Histogram", "Escalator", "MIN_SAMPLES"]

_PER_OCTAVE = 8
_OCTAVES = 30  # 1 µs · 2**30 ≈ 18 minutes
_BUCKETS = _PER_OCTAVE * _OCTAVES
_LOG_STEP = math.log(2.0) / _PER_OCTAVE
_MIN_NS = 1_000
_HALF_LIFE = 2_048
MIN_SAMPLES = 100  # a p99 needs about this many calls before it means anything
_RECOMPUTE = 16
_MAX_PHASES = 8  # estimates per call site (phases are "", "prefill", "decode")


class Histogram:
    """A fixed-size log-bucketed histogram of durations (ns) with exponential forgetting."""

    __slots__ = ("counts", "total", "added", "_cached", "_cached_at")

    def __init__(self) -> None:
        self.counts = [0.0] * _BUCKETS
        self.total = 0.0
        self.added = 0
        self._cached = (-1.0, 0.0)  # (q, its quantile)
        self._cached_at = -1

    def threshold(self, q: float) -> float:
        """:meth:`quantile`, recomputed every ``_RECOMPUTE`` samples (a walk over the buckets
        costs the worker more than the rest of the decision)."""
        if self._cached[0] != q or self.added - self._cached_at >= _RECOMPUTE:
            self._cached = (q, self.quantile(q))
            self._cached_at = self.added
        return self._cached[1]

    @staticmethod
    def _index(ns: int) -> int:
        if ns <= _MIN_NS:
            return 0
        return min(_BUCKETS - 1, int(log(ns / _MIN_NS) / _LOG_STEP))

    def add(self, ns: int) -> None:
        self.counts[self._index(ns)] += 1.0
        self.total += 1.0
        self.added += 1
        if self.added % _HALF_LIFE == 0:
            self.counts = [c * 0.5 for c in self.counts]
            self.total *= 0.5

    def quantile(self, q: float) -> float:
        """The duration (ns) below which a fraction ``q`` of the calls fell, interpolated
        geometrically inside its bucket."""
        target = q * self.total
        seen = 0.0
        for i, count in enumerate(self.counts):
            if count and seen + count >= target:
                inside = (target - seen) / count
                return _MIN_NS * math.exp((i + inside) * _LOG_STEP)
            seen += count
        return _MIN_NS * math.exp(_BUCKETS * _LOG_STEP)


class Escalator:
    """The worker's latency estimates and the slow-call decision (one per worker)."""

    def __init__(self) -> None:
        self._sites: weakref.WeakKeyDictionary[Any, dict[str, Histogram]] = (
            weakref.WeakKeyDictionary())
        # the last site's estimates: calls come in runs from one site (no strong reference)
        self._last: tuple[weakref.ref[Any], dict[str, Histogram]] | None = None

    def observe(self, cap: Capture, device_ns: int | None, quantile: float,
                escalate: bool = True) -> tuple[str | None, float | None]:
        """One finished capture: learn its time (device time when measured); returns why it was
        profiled (its grant's kind) and the quantile it was slow beyond (its site is armed then),
        each None when not. ``escalate=False`` (the profile tier is off: ``profile_rate`` or
        ``profile_max_per_minute`` is 0): slow calls are marked, no site is armed."""
        if cap.grant is not None:
            return cap.grant.kind, None
        # in_profile: an enclosing call's profiler slowed it, so it is neither slow nor a sample
        if quantile >= 1.0 or cap.tier != TIER_TIMING or cap.error is not None \
                or cap.in_profile:
            return None, None
        ns = device_ns if isinstance(device_ns, int) and device_ns > 0 else cap.wall_ns
        phases = self._phases(cap.site)
        key = _buckets.phase(cap.summary, cap.facts)
        hist = phases.get(key)
        if hist is None:
            if len(phases) >= _MAX_PHASES:
                return None, None
            hist = phases[key] = Histogram()
        slow = None
        if hist.added >= MIN_SAMPLES and ns > hist.threshold(quantile):
            slow = quantile
            runtime.grants.slow_found()  # counted with the profile tier off too: it is marked
            if escalate:
                runtime.grants.arm(cap.site, _buckets.bucket(cap.summary, cap.facts),
                                   cap.capture_id, quantile, runtime.sampler.bucket)
        hist.add(ns)
        return None, slow

    def _phases(self, site: Any) -> dict[str, Histogram]:
        last = self._last
        if last is not None and site is not None and last[0]() is site:
            return last[1]
        phases = self._sites.get(site)
        if phases is None:
            phases = self._sites[site] = {}
        self._last = (weakref.ref(site), phases)
        return phases
