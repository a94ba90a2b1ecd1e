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

__all__ = ["Pair", "Standing", "Ranking", "rank", "pair", "lines", "sign_interval", "CONFIDENCE",
           "FASTEST", "SLOWER", "FASTER", "SAME", "FEW"]

CONFIDENCE = 0.95
FASTEST = "fastest"
SLOWER = "slower"
FASTER = "faster"            # than the one with the lowest median time: possible, if rare
SAME = "not distinguishable"
FEW = "too few rounds"


@dataclasses.dataclass(frozen=True)
class Pair:
    """One implementation's time divided by ``against``'s in the same round: the median over the
    rounds, its interval (``nan``: none), the verdict, the rounds behind it and the coverage."""

    against: str
    ratio: float
    low: float
    high: float
    verdict: str
    rounds: int
    confidence: float


@dataclasses.dataclass(frozen=True)
class Standing(Pair):
    """Implementation ``name`` against the reference (its :class:`Pair`, ``against`` the
    reference), and against the one listed just before it (``previous``, when that one is not
    the reference): the order of the list is a claim too."""

    name: str = dataclasses.field(kw_only=True)
    previous: Pair | None = None


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
    standings = [Standing(reference, 1.0, math.nan, math.nan, FASTEST, len(usable[reference]),
                          math.nan, name=reference)]
    for name, by_round in usable.items():
        if name != reference:
            p = pair(by_round, usable[reference], reference, confidence)
            standings.append(Standing(*dataclasses.astuple(p), name=name))
    standings[1:] = sorted(standings[1:], key=lambda s: (math.isnan(s.ratio), s.ratio))
    for i in range(2, len(standings)):
        before, this = standings[i - 1], standings[i]
        if FEW not in (before.verdict, this.verdict):
            standings[i] = dataclasses.replace(
                this, previous=pair(usable[this.name], usable[before.name], before.name,
                                    confidence))
    return Ranking(reference, standings)


def pair(times: Mapping[int, float], against: Mapping[int, float], name: str,
         confidence: float = CONFIDENCE) -> Pair:
    """``times`` ÷ ``against`` round by round (the rounds both have), as a :class:`Pair` against
    the implementation called ``name``."""
    ratios = [times[r] / against[r] for r in sorted(times.keys() & against.keys())]
    ratio = statistics.median(ratios) if ratios else math.nan
    found = sign_interval(ratios, confidence) if len(ratios) >= MIN_ROUNDS else None
    if found is None:
        return Pair(name, ratio, math.nan, math.nan, FEW, len(ratios), math.nan)
    low, high, coverage = found
    verdict = SLOWER if low > 1.0 else FASTER if high < 1.0 else SAME
    return Pair(name, ratio, low, high, verdict, len(ratios), coverage)


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
        if s.name == ref:
            said = "the lowest median time"
        else:
            said = _claim(s, unit, option)
        if s.previous is not None:  # the order of the list, said with its noise too
            said += "; " + _claim(s.previous, unit, option)
        out.append(f"  {s.name:{width}}  {said}")
    return out


def _claim(p: Pair, unit: str, option: str) -> str:
    between = f"interval {_ratio(p.low)}–{_ratio(p.high)}"
    if p.verdict in (SLOWER, FASTER):
        return f"{_ratio(p.ratio)} {p.against}'s time, {p.verdict} ({between})"
    if p.verdict == SAME:
        return f"not distinguishable from {p.against} here ({_ratio(p.ratio)}, {between})"
    return (f"not ranked against {p.against}: {p.rounds} {unit}{'' if p.rounds == 1 else 's'}, "
            f"{MIN_ROUNDS} needed for an interval ({option} {MIN_ROUNDS} or more)")
