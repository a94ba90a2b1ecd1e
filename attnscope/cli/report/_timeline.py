"""The HTML report's "Timeline of one profiled call": every span under the call, as it ran.

Every span under the call is drawn: its operators, and the spans nested in it (the attention
function a layer calls, SDPA traced inside a transformers layer) with their own operators below
them. One lane per nesting level; a span that overlaps one already in its lane moves down to the
next free lane, so no two bars of a lane overlap.

Drawn as SVG here rather than by matplotlib so that the geometry is exact: labels are monospace
with a fixed ``textLength`` (a browser fits the glyphs to it), so each label covers exactly
``[x, x + textLength]``, and one is drawn only where it fits inside its own bar and clear of any
label already placed in its lane. What does not fit is in the bar's tooltip (``<title>``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ... import _schema as schema
from ..render.html import PALETTE, escape
from ..traces import SpanRow

__all__ = ["Bar", "Label", "layout", "spans_under", "timeline_svg"]

WIDTH = 1080.0  # viewBox units: pixels at 100%
_LANE_H, _BAR_H = 22.0, 18.0
_FONT = 11.0
CHAR_W = 0.6 * _FONT  # a monospace advance; ``textLength`` holds every label to it
_PAD = 3.0  # between a bar's edge and its label
_AXIS_H = 30.0
_MAX_SPANS = 400  # the longest ones, when a call has more (a bound on the page's size)
_FAMILY = "ui-monospace,SFMono-Regular,Menlo,Consolas,'DejaVu Sans Mono',monospace"
_DARK = "#1d2330"
# fills a white label reads on; the call itself in the page's dark, nested spans in blue
_OP_FILLS = (PALETTE[3], PALETTE[2], PALETTE[4], "#7A5195", "#8C6D31", "#3F7F93")
_NESTED_FILL = PALETTE[0]


@dataclass(frozen=True, slots=True)
class Label:
    text: str
    x: float  # left end; the label covers [x, x + width]
    width: float


@dataclass(frozen=True, slots=True)
class Bar:
    row: SpanRow
    lane: int
    x: float
    width: float
    kind: str  # "call", "nested" (a span that is not an operator) or "op"
    label: Label | None


def spans_under(rows: Sequence[SpanRow], call: SpanRow) -> list[SpanRow]:
    """Every span under ``call``, at any depth (operators and nested spans alike), by start
    time, a parent before its children; at most ``_MAX_SPANS`` (the longest)."""
    children: dict[str, list[SpanRow]] = defaultdict(list)
    for r in rows:
        if r.parent_id:
            children[r.parent_id].append(r)
    out: list[SpanRow] = []
    todo, seen = [call.span_id], {call.span_id}
    while todo:
        for kid in children.get(todo.pop(), ()):
            if kid.span_id not in seen:  # a malformed file's cycle is walked once
                seen.add(kid.span_id)
                out.append(kid)
                todo.append(kid.span_id)
    if len(out) > _MAX_SPANS:
        out = sorted(out, key=lambda r: -r.duration_ns)[:_MAX_SPANS]
    return sorted(out, key=lambda r: (r.start_ns, -r.duration_ns))


def _name(row: SpanRow) -> str:
    return row.name.removeprefix("aten::")


def _kind(row: SpanRow) -> str:
    return "op" if schema.KERNEL_KIND.name in row.attributes else "nested"


def layout(call: SpanRow, spans: Sequence[SpanRow], call_label: str,
           duration: Callable[[float | None], str], width: float = WIDTH) -> list[Bar]:
    """The bars of ``call`` (lane 0) and ``spans`` (:func:`spans_under`), with their labels."""
    total = max(call.duration_ns, 1)
    scale = width / total

    def x_of(ns: int) -> float:
        return min(max((ns - call.start_ns) * scale, 0.0), width)

    taken: list[list[tuple[int, int]]] = [[(call.start_ns, call.end_ns)]]  # ns, per lane
    labelled: list[list[tuple[float, float]]] = [[]]  # label extents, per lane
    lane_of = {call.span_id: 0}
    bars = []
    for row, kind in [(call, "call"), *((s, _kind(s)) for s in spans)]:
        if row is call:
            lane = 0
        else:
            lane = lane_of.get(row.parent_id or "", 0) + 1
            while lane < len(taken) and any(row.start_ns < end and start < row.end_ns
                                            for start, end in taken[lane]):
                lane += 1
            if lane == len(taken):
                taken.append([])
                labelled.append([])
            taken[lane].append((row.start_ns, row.end_ns))
            lane_of[row.span_id] = lane
        x0, x1 = x_of(row.start_ns), x_of(row.end_ns)
        share = row.duration_ns / total
        head = call_label if row is call else _name(row)
        texts = [f"{head} {duration(row.duration_ns)}"
                 + (f" ({share:.0%})" if kind == "nested" else ""), head]
        label = _fit(texts, x0, x1, labelled[lane])
        if label is not None:
            labelled[lane].append((label.x, label.x + label.width))
        bars.append(Bar(row, lane, x0, x1 - x0, kind, label))
    return bars


def _fit(texts: Sequence[str], x0: float, x1: float,
         placed: Sequence[tuple[float, float]]) -> Label | None:
    """The first of ``texts`` (else the last cut short with "…", 4 characters at least) that
    fits inside ``[x0, x1]`` with its padding and clear of the ``placed`` extents."""
    room = x1 - x0 - 2 * _PAD
    chars = math.floor(room / CHAR_W + 1e-9)
    if chars < 4:
        return None
    text = next((t for t in texts if len(t) <= chars), None)
    if text is None:
        text = texts[-1][:chars - 1] + "…"
    label = Label(text, x0 + _PAD, len(text) * CHAR_W)
    if any(label.x < end and start < label.x + label.width for start, end in placed):
        return None
    return label


def _ticks(total_ns: int, duration: Callable[[float | None], str],
           width: float) -> list[tuple[float, Label]]:
    """Axis ticks at a 1-2-5 step whose labels are clear of one another (and of the ends)."""
    widest = (len(duration(total_ns)) + 2) * CHAR_W
    fit = max(1, int(width // (widest + 2 * CHAR_W)))
    raw = total_ns / fit
    step = next(m * 10 ** e for e in range(0, 19) for m in (1, 2, 5) if m * 10 ** e >= raw)
    out: list[tuple[float, Label]] = []
    for i in range(int(total_ns // step) + 1):
        x = i * step * width / max(total_ns, 1)
        text = duration(i * step) if i else "0"
        w = len(text) * CHAR_W
        left = min(max(x - w / 2, 0.0), width - w)
        if out and left < out[-1][1].x + out[-1][1].width + CHAR_W:
            continue
        out.append((x, Label(text, left, w)))
    return out


def _text(label: Label, y: float, cls: str, fill: str) -> str:
    return (f'<text class="{cls}" x="{label.x:.2f}" y="{y:.2f}" textLength="{label.width:.2f}" '
            f'lengthAdjust="spacingAndGlyphs" fill="{fill}">{escape(label.text)}</text>')


def timeline_svg(call: SpanRow, spans: Sequence[SpanRow], call_label: str,
                 duration: Callable[[float | None], str]) -> str:
    """The timeline as an inline ``<svg>`` (in a ``<figure>``)."""
    bars = layout(call, spans, call_label, duration)
    lanes = max(b.lane for b in bars) + 1
    colours: dict[str, str] = {}
    for b in bars:
        if b.kind == "op" and _name(b.row) not in colours:
            colours[_name(b.row)] = _OP_FILLS[len(colours) % len(_OP_FILLS)]
    parts = []
    for b in bars:
        fill = {"call": _DARK, "nested": _NESTED_FILL}.get(b.kind) or colours[_name(b.row)]
        y = b.lane * _LANE_H
        tip = (f"{b.row.name} · {duration(b.row.duration_ns)} · from "
               f"{duration(b.row.start_ns - call.start_ns)}")
        # a sub-pixel operator is still a visible sliver
        parts.append(f'<rect class="{b.kind}" x="{b.x:.2f}" y="{y:.2f}" '
                     f'width="{max(b.width, 0.75):.2f}" height="{_BAR_H:.2f}" fill="{fill}" '
                     f'stroke="#fff" stroke-width="0.5"><title>{escape(tip)}</title></rect>')
        if b.label is not None:
            parts.append(_text(b.label, y + _BAR_H / 2 + _FONT * 0.35, "label", "#fff"))
    axis_y = lanes * _LANE_H + 2
    parts.append(f'<line x1="0" y1="{axis_y}" x2="{WIDTH}" y2="{axis_y}" stroke="#9aa1ad"/>')
    for x, label in _ticks(call.duration_ns, duration, WIDTH):
        parts.append(f'<line x1="{x:.2f}" y1="{axis_y}" x2="{x:.2f}" y2="{axis_y + 4}" '
                     'stroke="#9aa1ad"/>')
        parts.append(_text(label, axis_y + 4 + _FONT + 2, "tick", "#5b6475"))
    height = axis_y + _AXIS_H
    return (f'<figure><svg xmlns="http://www.w3.org/2000/svg" class="timeline" '
            f'viewBox="0 0 {WIDTH:.0f} {height:.0f}" width="{WIDTH:.0f}" height="{height:.0f}" '
            f'font-family="{_FAMILY}" font-size="{_FONT:.0f}" role="img" '
            f'aria-label="{escape("timeline of " + call_label)}">{"".join(parts)}</svg></figure>')
