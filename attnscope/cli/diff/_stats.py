"""The statistics behind ``attnscope diff``: the relative change of one quantile between two
samples, its bootstrap confidence interval, the verdict and the regression gate.

Pure functions of numpy arrays, so the rules can be tested on synthetic samples with known shifts.
The bootstrap resamples the calls of each file independently (``scipy.stats.bootstrap`` with two
unpaired samples, percentile intervals, a fixed seed: the same two files always give the same
report). What the interval covers and what it does not is written in docs/cli.md.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = [
    "CONFIDENCE", "MIN_CALLS", "RESAMPLES", "TAIL_CALLS", "Change", "Metric", "METRICS",
    "UNSURE", "calls_needed", "compare", "gate_failed", "gate_inconclusive", "verdict", "finite",
    "relative", "word", "unmeasured",
]

CONFIDENCE = 0.95
RESAMPLES = 2000
MIN_CALLS = 20      # calls per file a group needs before any verdict
TAIL_CALLS = 3      # calls above a quantile each file needs for a verdict on that quantile
SEED = 13
_BATCH_VALUES = 4_000_000  # resampled values held at once (memory bound for huge groups)

FEW = "too few calls"
SAME = "no change"
UNSURE = "inconclusive"


@dataclass(frozen=True, slots=True)
class Metric:
    """One line of the diary: a quantile of a per-call value, and which way is better."""

    name: str            # "p50", "tokens/s", ...
    value: str           # what is measured per call: "time", "tokens_per_s", "memory"
    q: float             # the quantile compared
    higher_is_better: bool
    better: str          # verdict words
    worse: str


METRICS = (
    Metric("p50", "time", 0.50, False, "faster", "slower"),
    Metric("p95", "time", 0.95, False, "faster", "slower"),
    Metric("p99", "time", 0.99, False, "faster", "slower"),
    Metric("tokens/s p50", "tokens_per_s", 0.50, True, "faster", "slower"),
    Metric("memory peak p50", "memory", 0.50, False, "smaller", "larger"),
)


@dataclass(frozen=True, slots=True)
class Change:
    """BEFORE and AFTER's quantile, the relative change ``after / before - 1`` with its confidence
    interval (``nan`` when not computed), the verdict, and the calls behind it."""

    metric: Metric
    before: float
    after: float
    change: float
    low: float
    high: float
    verdict: str
    n_before: int
    n_after: int
    runs_before: tuple[float, ...] = ()  # the quantile in each run (several runs per side)
    runs_after: tuple[float, ...] = ()


def calls_needed(q: float) -> int:
    """Calls each file needs for a verdict on quantile ``q``: ``MIN_CALLS``, and at least
    ``TAIL_CALLS`` calls above the quantile (p95: 60, p99: 300)."""
    return max(MIN_CALLS, math.ceil(TAIL_CALLS / (1.0 - q) - 1e-9))


def verdict(change: float, low: float, high: float, min_change: float, metric: Metric) -> str:
    """The table's word, with ``min_change`` (a fraction) as the threshold of "does it matter":
    a direction when the estimate moved by at least ``min_change`` and the *whole* interval lies
    beyond it (``low >= min_change`` for a rise, ``high <= -min_change`` for a fall),
    however wide the interval is; "inconclusive" when the interval excludes zero and the estimate
    moved that far, but the interval straddles the threshold (the change is real, its size may be
    below what matters); "no change" otherwise (the interval reaches zero, or the estimate moved
    less than ``min_change``).

    The issue 38 pair, every AFTER run slower than every BEFORE run, +331% in [+70.4%, +478.4%]:
    slower (it was "inconclusive" under a rule that judged the interval's width).
    """
    if math.isnan(low) or math.isnan(high) or math.isnan(change):
        return SAME  # 0/0 in some resamples: nothing shown beyond noise
    if low > 0.0 and change >= min_change:
        return _direction(metric, True) if low >= min_change else UNSURE
    if high < 0.0 and change <= -min_change:
        return _direction(metric, False) if high <= -min_change else UNSURE
    return SAME


def _ratio_statistic(qs: tuple[float, ...]) -> Any:
    def statistic(before: npt.NDArray[np.float64], after: npt.NDArray[np.float64],
                  axis: int = -1) -> npt.NDArray[np.float64]:
        b = np.quantile(before, qs, axis=axis)
        a = np.quantile(after, qs, axis=axis)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(a / b - 1.0, dtype=np.float64)
    return statistic


def _intervals(before: npt.NDArray[np.float64], after: npt.NDArray[np.float64],
               qs: tuple[float, ...], confidence: float, resamples: int,
               seed: int) -> list[tuple[float, float]]:
    """One bootstrap for all the quantiles (the same resamples for each)."""
    # scipy.stats takes seconds to import: only a one-run interval needs it, never `--help`
    from scipy import stats  # type: ignore[import-untyped]

    batch = max(1, _BATCH_VALUES // max(len(before), len(after)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # degenerate samples (every call alike) are fine here
        result = stats.bootstrap(
            (before, after), _ratio_statistic(qs), n_resamples=resamples, batch=batch,
            vectorized=True, paired=False, confidence_level=confidence, method="percentile",
            rng=np.random.default_rng(seed))
    lows = np.atleast_1d(result.confidence_interval.low)
    highs = np.atleast_1d(result.confidence_interval.high)
    return [(float(lo), float(hi)) for lo, hi in zip(lows, highs, strict=True)]


def finite(values: npt.ArrayLike) -> npt.NDArray[np.float64]:
    array = np.asarray(values, dtype=np.float64)
    return array[np.isfinite(array)]


def compare(before: npt.ArrayLike, after: npt.ArrayLike, metrics: tuple[Metric, ...], *,
            min_change: float = 0.0, confidence: float = CONFIDENCE,
            resamples: int = RESAMPLES, seed: int = SEED) -> list[Change]:
    """The change of each metric's quantile from ``before`` to ``after`` (per-call values of one
    kind; NaNs dropped). Too few calls for a quantile: its values and change, no interval, verdict
    "too few calls"."""
    b, a = finite(before), finite(after)
    if not len(b) or not len(a):
        return unmeasured(metrics, [b] if len(b) else [], [a] if len(a) else [], False)
    qs = tuple(m.q for m in metrics)
    qb = np.atleast_1d(np.quantile(b, qs))
    qa = np.atleast_1d(np.quantile(a, qs))
    wanted = [m for m, x in zip(metrics, qb, strict=True)
              if x != 0.0 and min(len(a), len(b)) >= calls_needed(m.q)]
    found = dict(zip(wanted, _intervals(b, a, tuple(m.q for m in wanted), confidence, resamples,
                                        seed), strict=True)) if wanted else {}
    out = []
    for m, x, y in zip(metrics, qb, qa, strict=True):
        change = relative(float(x), float(y))
        low, high = found.get(m, (math.nan, math.nan))
        said = word(m, min(len(a), len(b)), float(x), float(y), change, low, high, min_change)
        out.append(Change(m, float(x), float(y), change, low, high, said, len(b), len(a)))
    return out


def word(metric: Metric, fewest: int, before: float, after: float, change: float, low: float,
         high: float, min_change: float) -> str:
    """The verdict on one quantile, ``fewest`` calls in the smallest sample (a file, a run)."""
    if fewest < calls_needed(metric.q):
        return FEW
    if before == 0.0:  # no ratio to bootstrap: 0 -> 0 is no change, 0 -> y has no relative size
        return SAME if after == 0.0 else _direction(metric, after > 0)
    return verdict(change, low, high, min_change, metric)


def unmeasured(metrics: tuple[Metric, ...], before: list[npt.NDArray[np.float64]],
               after: list[npt.NDArray[np.float64]], list_runs: bool) -> list[Change]:
    """Metrics with values on one side at most (memory peak: only profiled calls have one on CPU,
    and one side may have profiled none): no change to compute ("too few calls", shown as not
    measured), but the side that has values keeps its figure — each run's quantile (listed when
    ``list_runs``) and their median. ``before``/``after``: each run's finite, non-empty values."""
    out = []
    for m in metrics:
        per_b = tuple(float(np.quantile(r, m.q)) for r in before)
        per_a = tuple(float(np.quantile(r, m.q)) for r in after)
        out.append(Change(m, float(np.median(per_b)) if per_b else math.nan,
                          float(np.median(per_a)) if per_a else math.nan, math.nan, math.nan,
                          math.nan, FEW, sum(map(len, before)), sum(map(len, after)),
                          per_b if list_runs else (), per_a if list_runs else ()))
    return out


def _direction(metric: Metric, went_up: bool) -> str:
    return metric.better if went_up == metric.higher_is_better else metric.worse


def relative(before: float, after: float) -> float:
    if before == 0.0:
        return 0.0 if after == 0.0 else math.inf if after > 0 else -math.inf
    return after / before - 1.0


def _gated(change: Change) -> bool:
    """Whether the gate judges ``change``: a p50 time with enough calls for a verdict (an
    interval end that could not be computed is NaN: no comparison with it holds)."""
    return change.metric.value == "time" and change.metric.q == 0.5 and change.verdict != FEW


def gate_failed(change: Change, limit: float) -> bool:
    """``--fail-if-slower``: a p50 time whose whole interval lies above ``limit`` (a fraction),
    however wide it is: slower by more than the limit beyond the noise the interval shows."""
    return _gated(change) and change.low > limit


def gate_inconclusive(change: Change, limit: float) -> bool:
    """A p50 time whose interval straddles ``limit``: neither shown slower by more than the
    limit nor shown within it. The gate passes it (exit 0) and names it."""
    return _gated(change) and change.low <= limit < change.high
