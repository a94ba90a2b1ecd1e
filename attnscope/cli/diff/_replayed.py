"""``attnscope diff``'s ``⟳`` lines: per compared layer, how many calls of each side ran in a
sampled CUDA graph replay (``attnscope.replayed``). They are compared like any call; a side whose
calls were replayed and another's that ran eagerly time different things (a replay has no launch
gaps between the graph's kernels), which the line lets a reader see."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

from ... import _schema as schema
from ..traces import SpanRow, group_key
from ._groups import Diary
from ._text import group_label

__all__ = ["replayed_json", "replayed_lines"]

_REPLAYED = schema.REPLAYED.name


def _counts(runs: Sequence[Sequence[SpanRow]]) -> Counter[tuple[str, str | None]]:
    counts: Counter[tuple[str, str | None]] = Counter()
    for run in runs:
        for row in run:
            if row.attributes.get(_REPLAYED) is True:
                counts[group_key(row)] += 1
    return counts


def replayed_lines(result: Diary, before: Sequence[Sequence[SpanRow]],
                   after: Sequence[Sequence[SpanRow]]) -> list[str]:
    """One line per compared group with replayed calls on either side (none: no line)."""
    b, a = _counts(before), _counts(after)
    lines = []
    for g in result.groups:
        key = (g.module, g.phase)
        if b.get(key) or a.get(key):
            lines.append(f"⟳ {group_label(key)}: calls that ran in a CUDA graph replay: BEFORE "
                         f"{b.get(key, 0)} of {g.calls_before}, AFTER {a.get(key, 0)} of "
                         f"{g.calls_after}")
    return lines


def replayed_json(result: Diary, before: Sequence[Sequence[SpanRow]],
                  after: Sequence[Sequence[SpanRow]]) -> list[dict[str, Any]]:
    """Per compared group, its calls of each side that ran in a CUDA graph replay (every group,
    zeros included: a reader need not know which had any)."""
    b, a = _counts(before), _counts(after)
    return [{"module": g.module, "phase": g.phase, "before": b.get((g.module, g.phase), 0),
             "after": a.get((g.module, g.phase), 0)} for g in result.groups]
