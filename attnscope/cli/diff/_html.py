"""``attnscope diff --html``: the diary as one self-contained page (:mod:`..render.html`): the
p50 changes with their intervals as a plot, the full table, the notes."""

from __future__ import annotations

import math

from ..render import html as _html
from ..render.writer import write_text
from collections.abc import Sequence

from ._groups import Diary, Noise
from ._text import (HEADERS, NOISE_HEADERS, group_label, layer_cell, noise_cells, noise_note,
                    notes, row_cells)

__all__ = ["write_html", "render"]


def _plot(result: Diary, limit: float | None) -> str:
    """p50 time change per group: the estimate, its interval, the no-change band, the gate."""
    rows = [(group_label((g.module, g.phase)), c) for g in result.groups for c in g.changes
            if c.metric.name == "p50" and math.isfinite(c.change)]
    if not rows:
        return ""
    fig = _html.figure(8, 0.9 + 0.35 * len(rows))
    ax = fig.subplots()
    band = result.min_change * 100
    ax.axvspan(-band, band, color="#e8ebf0", label=f"|change| < {band:g}%")
    ax.axvline(0, color="#5b6475", linewidth=0.8)
    if limit is not None:
        ax.axvline(limit, color=_html.PALETTE[3], linestyle="--", label=f"gate {limit:g}%")
    for y, (_, c) in enumerate(rows):
        colour = (_html.PALETTE[3] if c.verdict == "slower" else _html.PALETTE[2]
                  if c.verdict == "faster" else _html.PALETTE[0])
        if math.isfinite(c.low) and math.isfinite(c.high):
            ax.plot([c.low * 100, c.high * 100], [y, y], color=colour, linewidth=2)
        ax.plot([c.change * 100], [y], "o", color=colour if math.isfinite(c.low) else "#9aa1ad")
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("p50 time change, AFTER vs BEFORE (%), with its "
                  f"{result.confidence:.0%} interval")
    fig.legend(loc="outside right upper", fontsize=8)
    return _html.svg(fig)


def render(result: Diary, before: str, after: str, limit: float | None, judged: bool = True,
           floors: Sequence[list[Noise]] = ()) -> str:
    """The page's HTML text."""
    rows = [[layer_cell(g, i), *row_cells(g, c)]
            for g in result.groups for i, c in enumerate(g.changes)]
    failures = result.gate_failures(limit / 100) if limit is not None and judged else []
    said = notes(result, limit, failures, judged)
    if floors:
        said.insert(0, noise_note([n for floor in floors for n in floor]))
    lines = "".join(f'<p class="note">{_html.escape(line)}</p>' for line in said)
    sections = [("p50 time", _plot(result, limit)),
                ("All metrics", _html.table(HEADERS, rows, left=(0, 1, 7)))]
    for side, floor in zip(("BEFORE", "AFTER"), floors, strict=False):
        sections.append((f"A/A noise floor of {side}", _html.table(
            NOISE_HEADERS, [noise_cells(n) for n in floor], left=(0, 3))))
    sections.append(("Notes", lines))
    return _html.page("attnscope diff", [(h, body) for h, body in sections if body],
                      subtitle=f"BEFORE {before} → AFTER {after}")


def write_html(path: str, result: Diary, before: str, after: str, limit: float | None,
               judged: bool = True, floors: Sequence[list[Noise]] = ()) -> None:
    write_text(path, render(result, before, after, limit, judged, floors), "--html")
