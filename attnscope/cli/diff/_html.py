"""``attnscope diff --html``: the diary as one self-contained page (:mod:`..render.html`): the
p50 changes with their intervals as a plot, the full table, the notes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..render import html as _html
from ..render.writer import write_text
from ._groups import Diary, Noise
from ._text import (
    HEADERS,
    NOISE_HEADERS,
    group_label,
    layer_cell,
    noise_cells,
    noise_note,
    notes,
    row_cells,
)

__all__ = ["write_html", "render", "figure"]


def _ticks(values: Sequence[float], linear: float) -> list[float]:
    """Ticks of the symmetric-log axis (percent): 0, ±``linear`` (the edge of its linear part)
    and every power of ten beyond it up to the decade above the largest |value| (never past
    -100%: a time cannot fall by more)."""
    top = max([abs(v) for v in values if math.isfinite(v)] + [linear])
    ticks = [0.0, linear, -linear]
    power = 10.0 ** math.ceil(math.log10(linear * 1.0001))
    while power <= top * 10:
        ticks.append(power)
        if power <= 100:
            ticks.append(-power)
        power *= 10
    return sorted(set(ticks))


def _percent(value: float, _: object = None) -> str:
    return "0" if value == 0 else f"{value:+,.0f}%" if abs(value) >= 10 else f"{value:+g}%"


def figure(result: Diary, limit: float | None) -> Any:
    """p50 time change per group: the estimate, its interval, the no-change band, the gate;
    None when no group has a finite change. The x axis is symmetric-log, linear within the
    band (±``min_change``, at least ±1%): on a linear axis one +14,994% interval put every
    other point and the band onto zero (issue 38 §2)."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    rows = [(group_label((g.module, g.phase)), c) for g in result.groups for c in g.changes
            if c.metric.name == "p50" and math.isfinite(c.change)]
    if not rows:
        return None
    fig = _html.figure(8, 0.9 + 0.35 * len(rows))
    ax = fig.subplots()
    band = result.min_change * 100
    linear = max(band, 1.0)
    ax.set_xscale("symlog", linthresh=linear, linscale=1.0)
    ax.axvspan(-band, band, color="#e8ebf0", label=f"|change| < {band:g}%", gid="no-change-band")
    ax.axvline(0, color="#5b6475", linewidth=0.8)
    values = [band, -band]
    if limit is not None:
        ax.axvline(limit, color=_html.PALETTE[3], linestyle="--", label=f"gate {limit:g}%",
                   gid="gate")
        values.append(limit)
    for y, (_, c) in enumerate(rows):
        colour = (_html.PALETTE[3] if c.verdict == "slower" else _html.PALETTE[2]
                  if c.verdict == "faster" else _html.PALETTE[0])
        if math.isfinite(c.low) and math.isfinite(c.high):
            ax.plot([c.low * 100, c.high * 100], [y, y], color=colour, linewidth=2,
                    gid=f"interval-{y}")
            values += [c.low * 100, c.high * 100]
        ax.plot([c.change * 100], [y], "o", color=colour if math.isfinite(c.low) else "#9aa1ad",
                gid=f"change-{y}")
        values.append(c.change * 100)
    ax.xaxis.set_major_locator(FixedLocator(_ticks(values, linear)))
    ax.xaxis.set_major_formatter(FuncFormatter(_percent))
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yticks(range(len(rows)), [label for label, _ in rows])
    ax.invert_yaxis()
    ax.set_xlabel("p50 time change, AFTER vs BEFORE (%), with its "
                  f"{result.confidence:.0%} interval; linear within ±{linear:g}%, "
                  "logarithmic beyond")
    fig.legend(loc="outside right upper", fontsize=8)
    return fig


def _plot(result: Diary, limit: float | None) -> str:
    fig = figure(result, limit)
    return "" if fig is None else _html.svg(fig)


def render(result: Diary, before: str, after: str, limit: float | None, judged: bool = True,
           floors: Sequence[list[Noise]] = (), replayed: Sequence[str] = ()) -> str:
    """The page's HTML text; ``replayed``: the terminal's ``⟳`` lines (CUDA graph replays)."""
    rows = [[layer_cell(g, i), *row_cells(g, c)]
            for g in result.groups for i, c in enumerate(g.changes)]
    failures = result.gate_failures(limit / 100) if limit is not None and judged else []
    said = notes(result, limit, failures, judged) + list(replayed)
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
               judged: bool = True, floors: Sequence[list[Noise]] = (),
               replayed: Sequence[str] = ()) -> None:
    write_text(path, render(result, before, after, limit, judged, floors, replayed), "--html")
