"""The one rich console set-up of every command, and tables that stay readable in a narrow
terminal: folded into several, never cut.

A rich table wider than the terminal shrinks its columns and cuts their cells (``model.…``,
``[-65.6…``): a figure cut is a figure lost. :func:`fold` instead splits the columns, in their
order, into as many tables as the width needs, each repeating the key columns (what a row is
about) so that every row of every table can be read on its own. A table that fits is one table,
as before.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any, TextIO

from rich.console import Console
from rich.measure import Measurement

__all__ = ["console", "fold", "natural_width", "width_for"]


def console(out: TextIO | None = None, *, width: int = 150) -> Console:
    """The console a command prints on (``out``, else stdout as it is when printing): a
    terminal's own width; a file or pipe gets ``$COLUMNS`` when set, else ``width`` columns
    (a whole line per row). No highlighting: figures keep the colours a table gives them."""
    terminal = out.isatty() if out is not None and hasattr(out, "isatty") else None
    made = Console(file=out, highlight=False)
    if terminal is None:
        terminal = made.is_terminal
    made.width = width_for(terminal, width) or made.width
    return made


def natural_width(console: Any, renderable: Any) -> int:
    """How wide ``renderable`` is when nothing limits it."""
    options = console.options.update(max_width=10_000)
    return int(Measurement.get(console, options, renderable).maximum)


def fold(console: Any, build: Callable[[Sequence[int]], Any], columns: int,
         keys: int = 1) -> list[Any]:
    """Tables showing columns ``0 .. columns-1`` between them, each within the console's width
    where it can be, each with the first ``keys`` columns. ``build(indices)`` makes the table of
    those columns (with every row)."""
    tables = []
    chosen = list(range(keys))
    for index in range(keys, columns):
        if len(chosen) > keys and \
                natural_width(console, build([*chosen, index])) > console.width:
            tables.append(build(chosen))
            chosen = list(range(keys))
        chosen.append(index)
    tables.append(build(chosen))
    return tables


def width_for(is_terminal: bool, default: int = 150) -> int | None:
    """The console width to ask for: the terminal's own (None), else ``$COLUMNS`` when set (None:
    rich reads it), else ``default`` (a file or pipe: a whole line per row)."""
    if is_terminal or os.environ.get("COLUMNS", "").strip().isdigit():
        return None
    return default
