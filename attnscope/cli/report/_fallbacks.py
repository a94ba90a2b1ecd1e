"""The report's ``Fallback:`` lines: per report row, the calls named a silent fallback, counted
per reason, from the call spans' own ``attnscope.backend.*`` attributes.

A row's calls can fall back for different reasons (dropout on some, a transposed key on others):
each (expected backend, reason) gets its own count, most calls first, at most ``MAX_REASONS`` of
them and then one "N more" line, so that no count is put under a reason it is not of. The
terminal and the HTML page print the same lines.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ... import _schema as schema
from ..render.units import MISSING
from ..summary import GroupStats, Summary
from ..traces import SpanRow, group_key

__all__ = ["MAX_REASONS", "fallback_lines"]

MAX_REASONS = 3
_FALLBACK, _EXPECTED, _REASON = (schema.BACKEND_FALLBACK.name, schema.BACKEND_EXPECTED.name,
                                 schema.BACKEND_REASON.name)
Reasons = Counter[tuple[str, str]]


def fallback_lines(summary: Summary, calls: Sequence[SpanRow] | None) -> list[str]:
    """The lines for every row with fallbacks; ``calls``: the report's call spans (None: only
    the rows' totals and most frequent reason are known, and the lines say so)."""
    per_row: dict[tuple[str, str | None], Reasons] = {}
    for row in calls or ():
        a = row.attributes
        if a.get(_FALLBACK) is True:
            key = (summary.label_of(row), group_key(row)[1])
            per_row.setdefault(key, Counter())[
                (str(a.get(_EXPECTED, "")), str(a.get(_REASON, "")))] += 1
    lines: list[str] = []
    for g in summary.groups:
        if g.fallbacks is None:
            continue
        head = f"Fallback: {g.label} ({g.phase or MISSING}): {g.fallbacks.calls} call(s) ran " \
               "the math kernel"
        reasons = per_row.get((g.label, g.phase))
        if reasons is None:  # no call spans given: the row's most frequent reason, as that
            lines.append(head + _most_frequent(g))
        elif len(reasons) == 1:
            ((expected, reason),) = reasons
            lines.append(head + _why(expected, reason))
        else:
            lines.append(head + f", for {len(reasons)} reasons:")
            lines.extend(_reason_lines(reasons))
    return lines


def _why(expected: str, reason: str) -> str:
    """", flash was eligible — reason", without saying "flash was eligible" twice (the worker's
    reason for an eligible backend starts with it); "none": no fused kernel was."""
    named = expected and expected != "none" and not reason.startswith(f"{expected} was eligible")
    return (f", {expected} was eligible" if named else "") + (f" — {reason}" if reason else "")


def _most_frequent(g: GroupStats) -> str:
    f = g.fallbacks
    if f is None or not f.reason:
        return ""
    return f" (the most frequent reason: {f.reason})"


def _reason_lines(reasons: Reasons) -> list[str]:
    ranked = sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))
    lines = [f"  {n} call(s){_why(expected, reason) or ', no reason recorded'}"
             for (expected, reason), n in ranked[:MAX_REASONS]]
    rest = ranked[MAX_REASONS:]
    if rest:
        lines.append(f"  {sum(n for _, n in rest)} call(s) for {len(rest)} more reason(s)")
    return lines
