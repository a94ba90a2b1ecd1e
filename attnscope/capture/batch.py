"""``batch(rows=...)``: which request each batch row belongs to, for the calls inside the block.

Only the declaration exists so far: the rows live in a context variable that each sampled call
reads once onto its Capture (``Capture.rows``). The worker does not use them yet (issue 26, §2
and §3 are not built), so this is not public.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from .. import _log

__all__ = ["Row", "batch", "current_rows", "rows_for"]

# One request's identity: the span context of its request span, or a plain request id. None is a
# padding row. The span context (not the span) is kept: it is immutable and enough to parent to.
Row = otel_trace.SpanContext | str | None

_MAX_ROWS = 65_536  # bounds what a block holds; a larger batch proceeds unapportioned
_MAX_ID = 256  # request-id strings are attributes later: the attribute length bound

# A context variable, like span()'s: each thread and each asyncio task sees its own block, and
# nesting restores the outer rows on exit.
rows_var: contextvars.ContextVar[tuple[Row, ...] | None] = contextvars.ContextVar(
    "attnscope_batch_rows", default=None)


def _row(entry: object) -> Row:
    if entry is None:
        return None
    if isinstance(entry, str):
        return entry[:_MAX_ID]
    if isinstance(entry, otel_trace.Span):
        ctx = entry.get_span_context()
    elif isinstance(entry, otel_trace.SpanContext):
        ctx = entry
    elif isinstance(entry, otel_context.Context):
        ctx = otel_trace.get_current_span(entry).get_span_context()
    else:
        raise TypeError(type(entry).__name__)
    if not ctx.is_valid:
        raise TypeError("an invalid span context")
    return ctx


def _rows(rows: Sequence[object]) -> tuple[Row, ...] | None:
    if isinstance(rows, (str, bytes)) or len(rows) > _MAX_ROWS:
        _log.warn_once("batch-rows", "attnscope.batch: rows must be a sequence of at most "
                       f"{_MAX_ROWS} entries; this block is not apportioned")
        return None
    try:
        return tuple(_row(entry) for entry in rows)
    except TypeError as exc:
        _log.warn_once("batch-rows", "attnscope.batch: a row must be an OpenTelemetry span, a "
                       "context, a request-id string or None; this block is not apportioned",
                       got=str(exc))
        return None


@contextmanager
def batch(rows: Sequence[object]) -> Iterator[None]:
    """Declare, for the calls inside the block, which request each batch row belongs to.

    Misuse is logged once and the block runs unapportioned; the block itself never raises.
    """
    try:
        declared = _rows(rows)
    except Exception as exc:  # the caller's sequence failed len() or iteration: misuse, not ours
        _log.warn_once("batch-rows", "attnscope.batch: the rows could not be read; this block "
                       "is not apportioned", got=type(exc).__name__)
        declared = None
    token = rows_var.set(declared)
    try:
        yield
    finally:
        rows_var.reset(token)


def current_rows() -> tuple[Row, ...] | None:
    """The rows of the innermost ``batch`` block on this thread or task, or None."""
    return rows_var.get()


def rows_for(batch_size: int) -> tuple[Row, ...] | None:
    """The current rows when they match a call's batch size; a mismatch is logged once and None."""
    rows = rows_var.get()
    if rows is None or len(rows) == batch_size:
        return rows
    _log.warn_once("batch-size", "attnscope.batch: the block declares a different number of rows "
                   "than the call's batch; the call is not apportioned",
                   rows=len(rows), batch=batch_size)
    return None
