"""Self-contained HTML pages for the reports: inline CSS, plots as inline SVG, nothing fetched.

The small API the HTML reports share (``report --html``, ``diff --html``)::

    fig = figure(8, 3)                 # a matplotlib Figure, no pyplot, no display needed
    ax = fig.subplots()
    ...
    body = svg(fig) + table(["layer", "p50"], [["model.layers.0", "1.2 ms"]])
    text = page("attnscope report", [("Latency", body)], subtitle="trace.json")

Glyphs are drawn as paths and
the SVG metadata is left out, so a page references no font, script, style sheet or URL.
"""

from __future__ import annotations

import html
import io
from collections.abc import Sequence
from typing import Any

import matplotlib
from matplotlib.figure import Figure

__all__ = ["page", "svg", "figure", "table", "escape", "PALETTE", "PHASE_COLOUR", "PHASES"]

# Colour-blind safe (Okabe-Ito), used in this order by every plot.
PALETTE = ("#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
# the report's phases in their legends' order (``recompute``: checkpointing's forwards in backward)
PHASES: tuple[str | None, ...] = ("prefill", "decode", None, "recompute")
PHASE_COLOUR: dict[str | None, str] = dict(zip(PHASES, (PALETTE[0], PALETTE[1], PALETTE[2],
                                                        PALETTE[4]), strict=True))

_CSS = """
body{font-family:system-ui,-apple-system,'Segoe UI',Roboto,sans-serif;margin:0;color:#1d2330;
background:#f6f7f9;line-height:1.45}
header{background:#1d2330;color:#fff;padding:18px 32px}
header h1{margin:0;font-size:22px;font-weight:600}
header p{margin:4px 0 0;color:#c6ccd8;font-size:13px}
main{max-width:1180px;margin:0 auto;padding:16px 32px 48px}
section{background:#fff;border:1px solid #e1e4ea;border-radius:8px;margin:18px 0;padding:14px 20px}
section h2{font-size:17px;margin:2px 0 10px;font-weight:600}
section h3{font-size:14px;margin:14px 0 4px;font-weight:600}
p.note{color:#5b6475;font-size:13px;margin:6px 0}
div.wide{overflow-x:auto}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0;width:100%}
th,td{padding:4px 6px;border-bottom:1px solid #eceef2;text-align:right;white-space:nowrap}
th{background:#f0f2f5;font-weight:600}
th:first-child,td:first-child{text-align:left}
td.l,th.l{text-align:left}
tr:hover td{background:#f8f9fb}
figure{margin:6px 0}
svg{max-width:100%;height:auto}
"""


def escape(text: object) -> str:
    """Text for HTML (element content or a quoted attribute)."""
    return html.escape(str(text), quote=True)


def figure(width_in: float, height_in: float) -> Any:
    """A matplotlib ``Figure`` of that size (inches), detached from pyplot."""
    fig = Figure(figsize=(width_in, height_in), dpi=96, layout="constrained")
    return fig


def svg(fig: Any) -> str:
    """``fig`` as an inline ``<svg>`` element (no XML prolog, no metadata, text as paths)."""
    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "attnscope"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None, "Creator": None,
                                                    "Format": None, "Type": None})
    text = buffer.getvalue()
    start = text.find("<svg")
    return "<figure>" + text[start:] + "</figure>" if start >= 0 else ""


def table(headers: Sequence[str], rows: Sequence[Sequence[object]],
          left: Sequence[int] = (0,)) -> str:
    """An HTML table; cells are escaped; columns in ``left`` are left-aligned."""
    def cell(tag: str, i: int, value: object) -> str:
        cls = ' class="l"' if i in left else ""
        return f"<{tag}{cls}>{escape(value)}</{tag}>"

    head = "".join(cell("th", i, h) for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(cell("td", i, v) for i, v in enumerate(row)) + "</tr>"
                   for row in rows)
    # a wide table scrolls inside its section instead of running past the card's edge
    return (f"<div class=\"wide\"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody>"
            "</table></div>")


def page(title: str, sections: Sequence[tuple[str, str]], subtitle: str = "") -> str:
    """One HTML document: a header, then one ``<section>`` per (heading, HTML body).

    Headings are escaped; bodies are HTML as given (build them with :func:`svg`,
    :func:`table` and :func:`escape`).
    """
    parts = [f"<section><h2>{escape(heading)}</h2>{body}</section>" for heading, body in sections]
    sub = f"<p>{escape(subtitle)}</p>" if subtitle else ""
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>{escape(title)}</title><style>{_CSS}</style></head><body>"
            f"<header><h1>{escape(title)}</h1>{sub}</header><main>{''.join(parts)}</main>"
            "</body></html>\n")
