"""The statistics of ``attnscope diff`` over several runs per side: runs are the unit of evidence.

Per run, each quantile is computed from that run's calls (the robust per-run summary: p50, p95,
p99 of its calls); a side's figure is the **median over its runs** of that per-run quantile (one
run that landed on a bad core or a cold cache moves it little). The change is
``AFTER / BEFORE - 1`` of those figures.

Its interval is a **hierarchical bootstrap** (percentile method, a fixed seed: the same files
give the same report). Each resample draws, on each side independently, as many runs as the side
has, *with replacement*; each drawn run contributes a bootstrap replicate of its own quantile,
made by resampling its calls with replacement; the side's resampled figure is the median of the
drawn runs' replicates. Run-to-run variation therefore sits in the interval (a side whose runs
disagree gets a wide one), and so does call-to-call variation inside each run. The call level is
done once per run (``resamples`` replicates of each run's quantiles, each drawn run picks one at
random), which bounds the cost at ``resamples`` × calls per side.

The noise floor (``noise_floor``) is how much the runs of one side differ from each other: the
largest per-run p50 over the smallest, minus 1 — the largest change an A/A pair of those runs
would show.

With one run on a side the run level has nothing to resample: the interval is then the call-level
bootstrap of :mod:`._stats`, and the diff says that run-to-run noise is unmeasured.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from ._stats import (
    CONFIDENCE,
    RESAMPLES,
    SEED,
    Change,
    Metric,
    calls_needed,
    finite,
    relative,
    unmeasured,
    word,
)

__all__ = ["compare_runs", "noise_floor", "run_quantiles"]

_BATCH_VALUES = 4_000_000  # resampled call values held at once
Runs = Sequence[npt.NDArray[np.float64]]


def run_quantiles(runs: Sequence[npt.ArrayLike], qs: Sequence[float]) -> npt.NDArray[np.float64]:
    """Each run's quantiles ``qs`` of its calls: shape (runs, len(qs))."""
    return np.array([np.quantile(np.asarray(r, dtype=np.float64), list(qs)) for r in runs],
                    dtype=np.float64).reshape(
        len(runs), len(qs))


def noise_floor(per_run: Sequence[float]) -> float:
    """The largest relative difference between two runs' figures (``max / min - 1``); ``nan``
    with fewer than two runs or a zero."""
    values = np.asarray(per_run, dtype=np.float64)
    if len(values) < 2 or not np.all(values > 0):
        return math.nan
    return float(values.max() / values.min() - 1.0)


def _call_replicates(values: npt.NDArray[np.float64], qs: Sequence[float], resamples: int,
                     rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """``resamples`` bootstrap replicates of one run's quantiles: shape (resamples, len(qs))."""
    rows = max(1, _BATCH_VALUES // len(values))
    parts = []
    for start in range(0, resamples, rows):
        draw = rng.integers(0, len(values), (min(rows, resamples - start), len(values)))
        parts.append(np.quantile(values[draw], list(qs), axis=1).T)
    return np.concatenate(parts).reshape(resamples, len(qs))


def _side_replicates(runs: Runs, qs: Sequence[float], resamples: int,
                     rng: np.random.Generator) -> npt.NDArray[np.float64]:
    """The side's resampled figure (median over resampled runs): shape (resamples, len(qs))."""
    replicates = np.stack([_call_replicates(r, qs, resamples, rng) for r in runs])
    which_run = rng.integers(0, len(runs), (resamples, len(runs)))
    which_draw = rng.integers(0, resamples, (resamples, len(runs)))
    picked = replicates[which_run, which_draw]  # (resamples, runs, len(qs))
    return np.asarray(np.median(picked, axis=1), dtype=np.float64)


def _hierarchical(before: Runs, after: Runs, qs: Sequence[float], confidence: float,
                  resamples: int, seed: int) -> list[tuple[float, float]]:
    rng = np.random.default_rng(seed)
    b = _side_replicates(before, qs, resamples, rng)
    a = _side_replicates(after, qs, resamples, rng)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = a / b - 1.0
    alpha = (1.0 - confidence) / 2
    out = []
    for column in ratio.T:
        if not np.all(np.isfinite(column)):
            out.append((math.nan, math.nan))  # 0 in some resample: no relative interval
            continue
        low, high = np.quantile(column, [alpha, 1.0 - alpha])
        out.append((float(low), float(high)))
    return out


def _finite_runs(runs: Sequence[npt.ArrayLike]) -> list[npt.NDArray[np.float64]]:
    return [a for a in map(finite, runs) if len(a)]


def compare_runs(before: Sequence[npt.ArrayLike], after: Sequence[npt.ArrayLike],
                 metrics: tuple[Metric, ...], *, min_change: float = 0.0,
                 confidence: float = CONFIDENCE, resamples: int = RESAMPLES,
                 seed: int = SEED) -> list[Change]:
    """The change of each metric's quantile from the runs ``before`` to the runs ``after`` (each
    run: the per-call values of one kind; NaNs and runs without values dropped). A quantile needs
    ``calls_needed`` calls in every run of both sides, else "too few calls" (its figures and
    change are still given)."""
    b, a = _finite_runs(before), _finite_runs(after)
    n_b, n_a = sum(len(r) for r in b), sum(len(r) for r in a)
    if not b or not a:
        return unmeasured(metrics, b, a, max(len(before), len(after)) > 1)
    qs = [m.q for m in metrics]
    per_b, per_a = run_quantiles(b, qs), run_quantiles(a, qs)
    fig_b, fig_a = np.median(per_b, axis=0), np.median(per_a, axis=0)
    fewest = min(len(r) for r in (*b, *a))
    wanted = [i for i, m in enumerate(metrics)
              if fig_b[i] != 0.0 and fewest >= calls_needed(m.q)]
    found = dict(zip(wanted, _hierarchical(b, a, [qs[i] for i in wanted], confidence,
                                           resamples, seed), strict=True)) if wanted else {}
    out = []
    for i, m in enumerate(metrics):
        x, y = float(fig_b[i]), float(fig_a[i])
        change = relative(x, y)
        low, high = found.get(i, (math.nan, math.nan))
        said = word(m, fewest, x, y, change, low, high, min_change)
        out.append(Change(m, x, y, change, low, high, said, n_b, n_a,
                          tuple(float(v) for v in per_b[:, i]),
                          tuple(float(v) for v in per_a[:, i])))
    return out
