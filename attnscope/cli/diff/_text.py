"""``attnscope diff``'s words and numbers: signed percentages, intervals, the table's
cells and the notes under it, shared by the terminal table and the HTML page."""

from __future__ import annotations

import math

from ..render.units import MISSING, quantity
from ._groups import Diary, GroupDiff
from ._stats import FEW, Change, calls_needed

__all__ = ["HEADERS", "group_label", "names", "signed_percent", "interval",
           "verdict_text", "row_cells", "notes"]


def names(keys: list[tuple[tuple[str, str | None], int]]) -> str:
    shown = ", ".join(group_label(k) for k, _ in keys[:3])
    return shown + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")


def group_label(key: tuple[str, str | None]) -> str:
    return f"{key[0]} ({key[1]})" if key[1] else key[0]


# -- numbers as text ------------------------------------------------------------------------


def signed_percent(fraction: float) -> str:
    if math.isnan(fraction):
        return MISSING
    if math.isinf(fraction):
        return "+inf" if fraction > 0 else "-inf"
    return f"{fraction * 100:+.1f}%"


def interval(change: Change) -> str:
    if math.isnan(change.low) or math.isnan(change.high):
        return MISSING
    return f"[{signed_percent(change.low)}, {signed_percent(change.high)}]"


def verdict_text(change: Change) -> str:
    if change.verdict == FEW:
        if not change.n_before or not change.n_after:
            return "not measured"
        return f"too few calls (< {calls_needed(change.metric.q)})"
    return change.verdict


def row_cells(group: GroupDiff, change: Change) -> list[str]:
    """One table row: metric, calls, BEFORE, AFTER, change, interval, verdict."""
    kind = change.metric.value
    return [change.metric.name, f"{change.n_before} / {change.n_after}",
            quantity(change.before, kind), quantity(change.after, kind),
            signed_percent(change.change), interval(change), verdict_text(change)]


HEADERS = ["layer (phase)", "metric", "calls B / A", "BEFORE", "AFTER", "change", "95% CI",
           "verdict"]


def notes(result: Diary, limit: float | None,
          failures: list[tuple[GroupDiff, Change]]) -> list[str]:
    """The lines under the table: method, clocks, one-sided groups, the gate's outcome."""
    lines = [f"change = AFTER / BEFORE - 1; {result.confidence:.0%} bootstrap interval over the "
             f"calls in each file (not over runs); a verdict needs the interval to exclude 0 and "
             f"|change| >= {result.min_change:.0%}. Time: timed calls (profiled calls left out); "
             "memory peak: the calls that measured it."]
    for g in result.groups:
        if g.clock_before != g.clock_after:
            lines.append(f"warning: {group_label((g.module, g.phase))}: BEFORE timed by "
                         f"{g.clock_before} clock, AFTER by {g.clock_after}: not comparable")
    for label, only in (("BEFORE", result.only_before), ("AFTER", result.only_after)):
        for key, n in only:
            lines.append(f"only in {label}: {group_label(key)}, {n} calls")
    if limit is not None:
        if failures:
            lines += [f"FAIL: {group_label((g.module, g.phase))} p50 {signed_percent(c.change)} "
                      f"(interval {interval(c)}) is slower by more than {limit:g}% beyond noise"
                      for g, c in failures]
        else:
            lines.append(f"gate passed: no p50 slower by more than {limit:g}% beyond noise")
        unjudged = [g for g in result.groups for c in g.changes
                    if c.metric.name == "p50" and c.verdict == FEW]
        if unjudged:
            lines.append(f"not judged by the gate (too few timed calls for a p50 verdict): "
                         f"{names([((g.module, g.phase), 0) for g in unjudged])}")
    return lines
