"""The report's ``⟳`` lines: per report row, the calls that ran in a sampled CUDA graph replay.

Such a call is summarised like any (its FLOPs, device time and rates are its own); its span
carries ``attnscope.replayed`` and its wall time is its device time, as no host call ran
(docs/attributes.md#cuda-graph-replays). The terminal, the HTML page and the JSON say how many.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ... import _schema as schema
from ..render.units import MISSING
from ..summary import Summary
from ..traces import SpanRow, group_key

__all__ = ["REPLAYED_MARK", "replayed_counts", "replayed_lines"]

REPLAYED_MARK = "⟳"
_REPLAYED = schema.REPLAYED.name


def replayed_counts(summary: Summary, calls: Sequence[SpanRow] | None
                    ) -> Counter[tuple[str, str | None]]:
    """Replayed calls per report row, (label, phase)."""
    counts: Counter[tuple[str, str | None]] = Counter()
    for row in calls or ():
        if row.attributes.get(_REPLAYED) is True:
            counts[(summary.label_of(row), group_key(row)[1])] += 1
    return counts


def replayed_lines(summary: Summary, calls: Sequence[SpanRow] | None) -> list[str]:
    """One line per row with calls timed in CUDA graph replays (none: no line)."""
    counts = replayed_counts(summary, calls)
    lines = []
    for g in summary.groups:
        n = counts.get((g.label, g.phase), 0)
        if n:
            lines.append(f"{REPLAYED_MARK} {g.label} {g.phase or MISSING}: {n} of {g.calls} "
                         "calls ran in a CUDA graph replay (device time from the event pair "
                         "captured around the call; wall time is that device time)")
    return lines
