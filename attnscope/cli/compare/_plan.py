"""How many calls ``attnscope compare`` makes, and in which order: a pure function of what was
asked, each implementation's time per call and the time budget, so the rules are testable without
timing anything.

The timed calls run in interleaved *rounds*: each round times a block of calls of every
implementation, in the opposite order from one round to the next. A machine whose load changes
during the run then slows every implementation alike within a round, and the per-round ratios
(``_ranking``) see the change as noise instead of as one implementation being slower.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

__all__ = ["Plan", "plan", "ROUNDS", "MIN_ROUNDS", "DEFAULT_BUDGET_S", "blocks"]

ROUNDS = 10          # rounds when there are calls enough; fewer calls: one call a round
MIN_ROUNDS = 6       # the fewest rounds a ≥95% interval of the median ratio can be drawn from
DEFAULT_BUDGET_S = 60.0


@dataclasses.dataclass(frozen=True)
class Plan:
    """The calls to make: ``runs`` timed calls of each implementation in ``rounds`` rounds,
    ``warmup`` untimed ones before them. ``cut`` when the budget made either fewer than asked;
    ``round_s``: the estimated seconds of one call of every implementation."""

    runs: int
    warmup: int
    rounds: int
    runs_asked: int
    warmup_asked: int
    budget_s: float | None
    round_s: float
    cut: bool

    def describe(self) -> str:
        """One line for people: what was cut and why (empty when nothing was)."""
        if not self.cut:
            return ""
        return (f"--budget {self.budget_s:g} s: {self.runs} timed and {self.warmup} warm-up calls "
                f"each instead of {self.runs_asked} and {self.warmup_asked} (a call of each takes "
                f"about {self.round_s:.3g} s; --budget 0 for all)")


def plan(runs: int, warmup: int, per_call_s: Sequence[float], budget_s: float | None) -> Plan:
    """The plan for implementations taking ``per_call_s`` seconds a call.

    The warm-up and timed calls of all implementations together are kept within ``budget_s``
    (``None`` or 0: no limit) by making fewer of them: first the timed calls down to
    ``MIN_ROUNDS`` (or what was asked, if fewer) and the warm-up to one call, then no further —
    below that there is nothing to rank, so the budget is overrun and the plan says so by its
    figures. Profiled calls are not part of the budget.
    """
    round_s = float(sum(t for t in per_call_s if math.isfinite(t) and t > 0))
    runs_out, warmup_out = runs, warmup
    if budget_s and round_s > 0 and (runs + warmup) * round_s > budget_s:
        fits = int(budget_s // round_s)
        floor_runs, floor_warmup = min(runs, MIN_ROUNDS), min(warmup, 1)
        runs_out = min(runs, max(floor_runs, fits - floor_warmup))
        warmup_out = min(warmup, max(floor_warmup, fits - runs_out))
    cut = (runs_out, warmup_out) != (runs, warmup)
    return Plan(runs_out, warmup_out, min(ROUNDS, runs_out), runs, warmup,
                budget_s or None, round_s, cut)


def blocks(runs: int, rounds: int) -> list[int]:
    """Timed calls in each round: ``runs`` shared out, the first rounds one more when uneven."""
    base, extra = divmod(runs, rounds)
    return [base + (1 if r < extra else 0) for r in range(rounds)]
