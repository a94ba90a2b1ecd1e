"""``diff --html``'s p50-change chart (issue 38 §2): one +14,994% interval must not squash every
other point and the ±5% no-change band onto zero. Checked on the SVG the page carries (the
coordinates matplotlib wrote for each named element) and on the figure's axis, never on pixels."""

from __future__ import annotations

import re

import pytest

from attnscope.cli.diff import _html
from attnscope.cli.diff._groups import Diary, GroupDiff
from attnscope.cli.diff._stats import METRICS, Change

P50 = METRICS[0]

# (change, low, high) of each group's p50, as fractions; the first is the issue's
HUGE = (149.94, 40.0, 300.0)
SMALL = [(0.03, -0.02, 0.08), (0.20, 0.10, 0.30), (-0.30, -0.50, -0.10), (0.60, 0.40, 0.80)]


def _diary(rows: list[tuple[float, float, float]], min_change: float = 0.05) -> Diary:
    groups = [GroupDiff(f"layer{i}", None, 120, 120, "wall", "wall",
                        [Change(P50, 1.0, 1.0 + c, c, lo, hi, "slower", 120, 120)], 3, 3)
              for i, (c, lo, hi) in enumerate(rows)]
    return Diary(groups, [], [], min_change, 0.95, 3, 3)


def _section(svg: str, gid: str) -> str:
    start = svg.index(f'id="{gid}"')
    return svg[start:]


def _path_xs(svg: str, gid: str) -> list[float]:
    """The x coordinates of the first path drawn in the element ``gid``."""
    match = re.search(r'<path d="([^"]*)"', _section(svg, gid))
    assert match, gid
    numbers = [float(n) for n in re.findall(r"-?[\d.]+", match.group(1))]
    return numbers[0::2]


def _marker_x(svg: str, gid: str) -> float:
    match = re.search(r'<use [^>]*\bx="(-?[\d.]+)"', _section(svg, gid))
    assert match, gid
    return float(match.group(1))


def _width(svg: str) -> float:
    match = re.search(r'viewBox="0 0 ([\d.]+) ([\d.]+)"', svg)
    assert match
    return float(match.group(1))


def test_one_huge_interval_leaves_the_band_and_every_other_point_readable() -> None:
    rows = [HUGE, *SMALL]
    page = _html.render(_diary(rows), "before", "after", 25.0)
    [svg] = re.findall(r"<svg.*?</svg>", page, flags=re.S)
    width = _width(svg)
    band = _path_xs(svg, "no-change-band")
    band_lo, band_hi = min(band), max(band)
    # linear axis: 10 points of a ~30,000-point range, 0.03% of the width
    assert band_hi - band_lo >= 0.10 * width
    xs = {c: _marker_x(svg, f"change-{i}") for i, (c, _, _) in enumerate(rows)}
    ordered = [xs[c] for c in sorted(xs)]
    gaps = [b - a for a, b in zip(ordered, ordered[1:], strict=False)]
    assert min(gaps) >= 0.03 * width, (ordered, width)  # every estimate apart from the others
    # the +3% estimate inside the band, the others outside it
    assert [band_lo < xs[c] < band_hi for c, _, _ in SMALL] == [True, False, False, False]
    [gate] = set(_path_xs(svg, "gate"))
    assert xs[0.20] < gate < xs[0.60]  # 25% between +20% and +60%
    # each interval drawn around its estimate, the huge one to the right of everything else
    for i, (c, _, _) in enumerate(rows):
        lo, hi = sorted(_path_xs(svg, f"interval-{i}"))
        assert lo < xs[c] < hi
    assert min(_path_xs(svg, "interval-0")) > max(xs[c] for c, _, _ in SMALL)


def test_the_axis_is_symmetric_log_linear_within_the_band_with_percent_ticks() -> None:
    fig = _html.figure(_diary([HUGE, *SMALL]), 25.0)
    fig.draw_without_rendering()
    ax = fig.axes[0]
    assert ax.get_xscale() == "symlog"
    low, high = ax.get_xlim()
    assert low <= -50.0 and high >= 30000.0  # every interval end in view
    shown = [t.get_text() for t in ax.get_xticklabels() if low <= t.get_position()[0] <= high]
    assert {"0", "+5%", "-5%", "+100%", "+10,000%"} <= set(shown), shown
    assert "logarithmic beyond" in ax.get_xlabel()
    # linear within ±5%: equal steps there are equal distances
    x = [ax.transData.transform((v, 0.0))[0] for v in (-5.0, 0.0, 5.0)]
    assert x[1] - x[0] == pytest.approx(x[2] - x[1])


def test_small_changes_alone_and_a_zero_min_change_still_draw() -> None:
    fig = _html.figure(_diary(SMALL), 5.0)
    fig.draw_without_rendering()
    ax = fig.axes[0]
    x = [ax.transData.transform((v, 0.0))[0] for v in (-5.0, 5.0)]
    assert x[1] - x[0] >= 0.10 * ax.bbox.width
    zero = _html.render(_diary(SMALL, min_change=0.0), "b", "a", None)
    assert zero.count("<svg") == 1 and 'id="change-3"' in zero


@pytest.mark.parametrize("values, linear, ticks", [
    ([30.0], 5.0, [-100.0, -10.0, -5.0, 0.0, 5.0, 10.0, 100.0]),
    ([2.0], 5.0, [-10.0, -5.0, 0.0, 5.0, 10.0]),
    ([250.0, float("inf")], 10.0, [-100.0, -10.0, 0.0, 10.0, 100.0, 1000.0]),
])
def test_ticks_are_zero_the_bands_edge_and_powers_of_ten(values: list[float], linear: float,
                                                         ticks: list[float]) -> None:
    assert _html._ticks(values, linear) == ticks
