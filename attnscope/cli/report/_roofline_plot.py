"""The HTML report's roofline: a log–log plot of each report row's calls under their roofs, and
the table of the points it draws.

- x: arithmetic intensity (FLOP/byte), y: achieved TFLOP/s, both log scale.
- Roofs: one per distinct pair of peaks the calls carried (:func:`..roofline.roofs_of`),
  ``min(peak_tflops, intensity × peak_gbps / 1000)``; nothing is assumed about the device.
- Points: one per report row (layer × phase, × backend where a layer ran several) with a
  roofline: the medians of its calls' ``arithmetic_intensity`` and ``roofline.achieved_tflops``
  (:func:`..roofline.roofline_of`, the table's figures), taken separately; the area grows with
  the row's share of the summed time of the plotted calls.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from matplotlib.lines import Line2D

from ... import _schema as schema
from ..render.html import PALETTE, PHASE_COLOUR, PHASES, escape, figure, svg, table
from ..render.units import MISSING, si
from ..roofline import Roof, RooflineStats, roofline_of, roofs_of
from ..summary import Summary, time_ns
from ..traces import SpanRow, group_key

__all__ = ["RooflinePoint", "roofline_points", "roofline_figure", "roofline_section"]

_ROOF_STYLES = ("-", "--", ":", "-.")
# above this many points the plot labels them by number, the table below names them
_NAMED_POINTS = 12


@dataclass(frozen=True, slots=True)
class RooflinePoint:
    """One report row on the plot: its roofline medians and its share of the plotted time."""

    label: str
    phase: str | None
    stats: RooflineStats
    share: float


def _has_roofline(row: SpanRow) -> bool:
    return roofline_of([row]) is not None


def roofline_points(summary: Summary, calls: Sequence[SpanRow]) -> list[RooflinePoint]:
    """The points of the plot, in the order of the report's rows."""
    by_row: dict[tuple[str, str | None], list[SpanRow]] = {}
    for r in calls:
        if _has_roofline(r):
            by_row.setdefault((summary.label_of(r), group_key(r)[1]), []).append(r)
    total = sum(time_ns(r) for rows in by_row.values() for r in rows)
    points = []
    for g in summary.groups:
        rows = by_row.get((g.label, g.phase))
        stats = roofline_of(rows) if rows else None
        if rows and stats is not None:
            share = sum(time_ns(r) for r in rows) / total if total > 0 else 1 / len(by_row)
            points.append(RooflinePoint(g.label, g.phase, stats, share))
    return points


def _plottable(p: RooflinePoint) -> bool:
    """Whether the point has a place on log axes (a call of 0 FLOPs or 0 bytes has none)."""
    return all(math.isfinite(v) and v > 0 for v in (p.stats.intensity, p.stats.achieved_tflops))


def _name(p: RooflinePoint) -> str:
    text = f"{p.label} · {p.phase}" if p.phase else p.label
    return text if len(text) <= 40 else "…" + text[-39:]


def _roof_label(roof: Roof) -> str:
    # "989 TFLOP/s, 4.8 TB/s": the prefix joined to the unit, as on a datasheet
    return (f"roof: {si(roof.peak_tflops * 1e12)}FLOP/s, {si(roof.peak_gbps * 1e9)}B/s "
            f"({roof.peak_source or 'source unknown'}; {roof.calls} calls)")


def roofline_figure(points: Sequence[RooflinePoint], roofs: Sequence[Roof]) -> Any:
    """The matplotlib figure: the roofs as lines, the points as labelled dots."""
    fig = figure(11, 5.4)
    ax = fig.subplots()
    xs = [p.stats.intensity for p in points if _plottable(p)] + [r.ridge for r in roofs]
    x_lo, x_hi = min(xs) / 4, max(xs) * 4
    grid = [x_lo * (x_hi / x_lo) ** (i / 240) for i in range(241)]
    for i, roof in enumerate(roofs):
        line = sorted({*grid, roof.ridge})  # the ridge exactly: the corner stays sharp
        ax.plot(line, [roof.at(x) for x in line], color="#1d2330", linewidth=1.4,
                linestyle=_ROOF_STYLES[i % len(_ROOF_STYLES)], label=_roof_label(roof),
                zorder=2)
        ax.annotate(f"ridge {roof.ridge:.3g} FLOP/B", (roof.ridge, roof.peak_tflops),
                    xytext=(4, 4), textcoords="offset points", fontsize=8, color="#5b6475")
    plotted = [(number, p) for number, p in enumerate(points, 1) if _plottable(p)]
    for _, p in plotted:
        ax.scatter([p.stats.intensity], [p.stats.achieved_tflops], s=_area(p),
                   color=PHASE_COLOUR.get(p.phase, PALETTE[2]), alpha=0.8,
                   edgecolors="#1d2330", linewidths=0.5, zorder=3)
    _limits(ax, points, roofs, x_lo, x_hi)
    ax.set_xlabel("arithmetic intensity (FLOP/byte, log scale)")
    ax.set_ylabel("achieved TFLOP/s (log scale)")
    ax.grid(color="#e6e8ec", which="both")
    ax.set_axisbelow(True)
    handles, _ = ax.get_legend_handles_labels()
    phases = [ph for ph in PHASES if any(p.phase == ph for p in points)]
    handles += [Line2D([], [], marker="o", linestyle="", color=PHASE_COLOUR[ph], alpha=0.8,
                       label=ph or "no phase") for ph in phases]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8,
              frameon=False)
    named = len(points) <= _NAMED_POINTS
    _label_points(fig, ax, [((p.stats.intensity, p.stats.achieved_tflops), _area(p),
                             _name(p) if named else str(number)) for number, p in plotted])
    return fig


def _area(p: RooflinePoint) -> float:
    """The dot's area in points², growing with the point's time share."""
    return 24 + 400 * p.share


def _limits(ax: Any, points: Sequence[RooflinePoint], roofs: Sequence[Roof], x_lo: float,
            x_hi: float) -> None:
    ys = [p.stats.achieved_tflops for p in points if _plottable(p)]
    top = max(r.peak_tflops for r in roofs)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(x_lo, x_hi)
    ax.set_ylim(min([*ys, top]) / 4, top * 3)


_FONT = 8  # points
_STEP = _FONT * 1.35  # one label line, in points


def _label_points(fig: Any, ax: Any,
                  labels: Sequence[tuple[tuple[float, float], float, str]]) -> None:
    """Each label (point, dot area, text) beside its point (on the left in the right part of
    the plot, so that it stays inside), moved down (else up) with a leader line where it
    would cover a dot or a label: the points of one phase sit in a cluster."""
    fig.draw_without_rendering()  # the layout is done: data -> display is final
    scale = 72 / fig.dpi  # display pixels -> points
    extent = ax.get_window_extent()
    right, bottom, top = extent.x1 * scale, extent.y0 * scale, extent.y1 * scale
    at = [(tuple(v * scale for v in ax.transData.transform(xy)), xy, area ** 0.5 / 2, text)
          for xy, area, text in labels]
    dots = [(x - r, y - r, x + r, y + r) for (x, y), _, r, _ in at]
    texts: list[tuple[float, float, float, float]] = []
    # from the top down, each label first tries its own height, then below, and never goes
    # above a label placed before it that it shares a column with: within a cluster the
    # labels stack in the points' order
    for (px, py), xy, radius, text in sorted(at, key=lambda a: -a[0][1]):
        width, gap = 0.62 * _FONT * len(text), radius + 3  # clear of its own dot
        side = -1 if px + gap + width > right else 1
        x0 = px + gap if side > 0 else px - gap - width
        def fits(shift: float, in_order: bool, x0: float = x0, py: float = py,
                 width: float = width) -> bool:
            # 3 pt clear on each side: "1" and "3" side by side must not read as "13"
            box = (x0 - 3, py + shift - _STEP / 2, x0 + width + 3, py + shift + _STEP / 2)
            return bottom <= box[1] and box[3] <= top and not any(
                _overlap(box, b) for b in dots) and not any(
                _overlap(box, b) or (in_order and box[0] < b[2] and b[0] < box[2]
                                     and box[1] > b[1]) for b in texts)

        shifts = [0.0, *(k * _STEP * sign for sign in (-1, 1) for k in range(1, 80))]
        shift = next((sh for sh in shifts if fits(sh, True)),
                     next((sh for sh in shifts if fits(sh, False)), 0.0))
        box = (x0 - 3, py + shift - _STEP / 2, x0 + width + 3, py + shift + _STEP / 2)
        texts.append(box)
        ax.annotate(text, xy, xytext=(gap * side, shift), textcoords="offset points",
                    fontsize=_FONT, va="center", ha="left" if side > 0 else "right",
                    color="#1d2330", zorder=4, arrowprops=None if shift == 0 else {
                        "arrowstyle": "-", "color": "#9aa1ad", "linewidth": 0.6,
                        "shrinkA": 0, "shrinkB": 3})


def _overlap(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def _time_sources(calls: Sequence[SpanRow]) -> str:
    sources = Counter(str(r.attributes.get(schema.ROOFLINE_TIME_SOURCE.name, "unknown"))
                      for r in calls if _has_roofline(r))
    return ", ".join(f"{source} on {n}" for source, n in sorted(sources.items()))


def roofline_section(summary: Summary, calls: Sequence[SpanRow]) -> str:
    """The section's HTML: the plot and its table, or one line saying why there is none."""
    roofs = roofs_of(calls)
    points = roofline_points(summary, calls)
    if not roofs or not points:
        return ("<p class=\"note\">No call in this trace carries device peaks "
                "(<code>attnscope.roofline.peak_tflops</code> / <code>peak_gbps</code>), so "
                "there is no roofline: set <code>device_peaks</code> (or "
                "<code>ATTNSCOPE_PEAK_TFLOPS</code> and <code>ATTNSCOPE_PEAK_GBPS</code>), "
                "measure this machine's with <code>attnscope calibrate</code>, or run on a CUDA "
                "device attnscope knows by name.</p>")
    sources = ", ".join(sorted({r.peak_source or "unknown" for r in roofs}))
    note = (f"<p class=\"note\">One point per layer and phase (per backend where a layer ran "
            "several): the median arithmetic intensity and the median achieved TFLOP/s of its "
            "calls, taken separately; the dot's area grows with its share of the plotted calls' "
            f"time. Achieved: FLOPs ÷ the time each call names ({escape(_time_sources(calls))} "
            "calls). Roofs: min(peak TFLOP/s, intensity × peak GB/s ÷ 1000), from the peaks "
            f"the spans carry (source: {escape(sources)}); below the ridge a call is "
            "memory-bound, above it compute-bound.</p>")
    body = [[i, p.label, p.phase or MISSING, p.stats.calls, f"{p.stats.intensity:.3g}",
             si(p.stats.achieved_tflops * 1e12, "FLOP/s"),
             si(p.stats.roof_tflops * 1e12, "FLOP/s"), f"{p.stats.fraction:.1%}",
             p.stats.bound, f"{p.share:.1%}", p.stats.peak_source or MISSING]
            for i, p in enumerate(points, 1)]
    headers = ["#", "layer", "phase", "calls", "FLOP/B", "achieved", "roof", "fraction",
               "bound", "time share", "peaks"]
    left_out = [str(i) for i, p in enumerate(points, 1) if not _plottable(p)]
    if left_out:
        note += (f"<p class=\"note\">Not plotted (an intensity or achieved rate of 0 has no "
                 f"place on log axes): table row{'s' if len(left_out) > 1 else ''} "
                 f"{', '.join(left_out)}.</p>")
    plot = svg(roofline_figure(points, roofs)) if len(left_out) < len(points) else ""
    return note + plot + table(headers, body, left=(1, 2, 8, 10))
