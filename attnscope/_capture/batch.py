"""``batch(rows=...)``: which request each batch row belongs to, for the calls inside the block.

The block is a :class:`BatchRecord` in a context variable; each sampled call reads it once onto
its Capture (``Capture.batch``) and counts itself in it as it is handed over. The worker splits
each such call's figures by row into ``BatchRecord.acc`` (:mod:`attnscope._worker.apportion`);
when the block ends the calling thread stamps its end and hands the block over
(``runtime.worker.end_block``), and the worker emits one ``attnscope.request`` span per request
row once every call counted has arrived. A block in which no call was sampled costs nothing at its
end.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from .. import _interrupt_safe, _log
from .._record.batches import BatchRecord, rows_for
from .._runtime import runtime

__all__ = ["Row", "BatchRecord", "batch", "current_rows", "rows_for"]

# One request's identity: the span context of its request span, or a plain request id. None is a
# padding row. The span context (not the span) is kept: it is immutable and enough to parent to.
Row = otel_trace.SpanContext | str | None

_MAX_ROWS = 65_536  # bounds what a block holds; a larger batch proceeds unapportioned
_MAX_ID = 256  # request-id strings are attributes later: the attribute length bound

# A context variable, like span()'s: each thread and each asyncio task sees its own block, and
# nesting restores the outer block on exit.
rows_var: contextvars.ContextVar[BatchRecord | None] = contextvars.ContextVar(
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
    block = BatchRecord(declared) if declared is not None else None
    token: list[Any] = []  # filled from C: a Ctrl-C as set() returns cannot lose the token
    try:
        _interrupt_safe.call_into(token, rows_var.set, block)
        yield
    finally:
        if token:
            rows_var.reset(token[0])
        if block is not None:
            block.end_epoch_ns = time.time_ns()
            if block.sampled:  # else nothing reached the worker: nothing to emit
                try:
                    runtime.worker.end_block(block)
                except Exception as exc:  # never out of the user's block
                    _log.internal_error("batch-end", exc)


def current_rows() -> tuple[Row, ...] | None:
    """The rows of the innermost ``batch`` block on this thread or task, or None."""
    block = rows_var.get()
    return None if block is None else block.rows
