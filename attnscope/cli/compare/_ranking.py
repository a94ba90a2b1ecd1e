"""Which implementation is faster, said with its noise: the per-round ratio of each
implementation's time to the fastest one's, and a distribution-free interval of its median.

The unit of evidence is a round (``_plan``), not a call: calls of one block share the machine's
state at that moment, and a busy machine moves every call of a block together. Within a round the
implementations ran back to back, so the ratio of their times cancels most of what the machine
was doing. The interval is the sign-test interval of the median ratio — order statistics of the
ratios, exact for any distribution, robust to a round that a burst of load spoiled — at the
smallest coverage of 95% or more the number of rounds allows (6 rounds: min to max, 96.9%). An
interval that holds 1 is "not distinguishable here": no ranking the next run could reverse.

Pure functions of plain numbers, so the rules are tested on synthetic timings.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Mapping

from ._plan import MIN_ROUNDS

__all__ = ["Standing", "Ranking", "rank", "lines", "sign_interval", "CONFIDENCE",
           "FASTEST", "SLOWER", "FASTER", "SAME", "FEW"]

CONFIDENCE = 0.95
FASTEST = "fastest"
SLOWER = "slower"
FASTER = "faster"            # than the one with the lowest median time: possible, if rare
SAME = "not distinguishable"
FEW = "too few rounds"


@dataclasses.dataclass(frozen=True)
class Standing:
    """One implementation against the reference: the median over rounds of its time divided by
    the reference's in the same round, the interval of that median (``nan``: none), the verdict,
    the rounds behind it and the interval's coverage."""

    name: str
    ratio: float
    low: float
    high: float
    verdict: str
    rounds: int
    confidence: float


@dataclasses.dataclass(frozen=True)
class Ranking:
    """The reference (the lowest median round time) and every implementation's standing, the
    reference first, then by ratio."""

    reference: str
    standings: list[Standing]


def sign_interval(values: list[float], confidence: float = CONFIDENCE
                  ) -> tuple[float, float, float] | None:
    """(low, high, coverage) of the median of ``values`` from their order statistics, the
    narrowest whose coverage is at least ``confidence``; None when there are too few values for
    that coverage (fewer than 6 at 95%)."""
    n = len(values)
    ordered = sorted(values)
    best: tuple[float, float, float] | None = None
    tail = 0  # P(X <= k - 1), X ~ Binomial(n, 1/2)
    for k in range(1, n // 2 + 1):
        tail += math.comb(n, k - 1) / 2**n
        coverage = 1.0 - 2.0 * tail
        if coverage < confidence:
            break
        best = (ordered[k - 1], ordered[n - k], coverage)
    return best


def rank(times: Mapping[str, Mapping[int, float]], confidence: float = CONFIDENCE
         ) -> Ranking | None:
    """The ranking of implementations from their time in each round (``{name: {round: time}}``,
    any unit; rounds an implementation lacks are left out of its pairs). None with fewer than
    two implementations that have a time."""
    usable = {name: {r: t for r, t in by_round.items() if math.isfinite(t) and t > 0}
              for name, by_round in times.items()}
    usable = {name: by_round for name, by_round in usable.items() if by_round}
    if len(usable) < 2:
        return None
    reference = min(usable, key=lambda name: statistics.median(usable[name].values()))
    base = usable[reference]
    standings = [Standing(reference, 1.0, math.nan, math.nan, FASTEST, len(base), math.nan)]
    for name, by_round in usable.items():
        if name == reference:
            continue
        ratios = [by_round[r] / base[r] for r in sorted(by_round.keys() & base.keys())]
        ratio = statistics.median(ratios) if ratios else math.nan
        found = sign_interval(ratios, confidence) if len(ratios) >= MIN_ROUNDS else None
        if found is None:
            standings.append(Standing(name, ratio, math.nan, math.nan, FEW, len(ratios),
                                      math.nan))
            continue
        low, high, coverage = found
        verdict = SLOWER if low > 1.0 else FASTER if high < 1.0 else SAME
        standings.append(Standing(name, ratio, low, high, verdict, len(ratios), coverage))
    standings[1:] = sorted(standings[1:], key=lambda s: (math.isnan(s.ratio), s.ratio))
    return Ranking(reference, standings)


def _ratio(value: float) -> str:
    return f"{value:.3g}×"


def lines(found: Ranking | None, unit: str, option: str, what: str = "time") -> list[str]:
    """The ranking for people, each claim with its interval and none the noise does not
    support; ``unit``: what the ratios are paired over ("round", "step"); ``option``: the one that
    gives more of them; ``what``: the time compared."""
    if found is None:
        return []
    ref = found.reference
    levels = [s.confidence for s in found.standings[1:] if s.verdict != FEW]
    coverage = f"{min(levels):.1%} interval" if levels else "interval"
    out = [f"which is faster (each one's {what} ÷ {ref}'s in the same {unit}, median over the "
           f"{unit}s, {coverage}):"]
    width = max(len(s.name) for s in found.standings)
    for s in found.standings:
        between = f"interval {_ratio(s.low)}–{_ratio(s.high)}"
        if s.name == ref:
            said = "the lowest median time"
        elif s.verdict in (SLOWER, FASTER):
            said = f"{_ratio(s.ratio)} {ref}'s time, {s.verdict} ({between})"
        elif s.verdict == SAME:
            said = f"not distinguishable from {ref} here ({_ratio(s.ratio)}, {between})"
        else:
            said = (f"not ranked: {s.rounds} {unit}{'' if s.rounds == 1 else 's'}, "
                    f"{MIN_ROUNDS} needed for an interval "
                    f"({option} {MIN_ROUNDS} or more)")
        out.append(f"  {s.name:{width}}  {said}")
    return out
