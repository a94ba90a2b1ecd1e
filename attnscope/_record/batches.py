"""One ``attnscope.batch()`` block as both sides see it: its rows, its times, its counts.

The calling side (``_capture.batch``) makes it, counts its sampled and lost calls and stamps its
end; each sampled call of the block refers to it (``Capture.batch``). The worker only reads it:
what it keeps of a block (calls split by row, calls seen) is its own, keyed weakly by the record
(``_worker.apportion.Ledger``, ``_worker.loop``), and it emits the request spans once the block
has ended. (A ``span()`` block is another thing: ``_capture.block``.)
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from opentelemetry import trace as otel_trace

from .. import _log

__all__ = ["BatchRecord", "rows_for"]

_next_block = itertools.count(1).__next__  # atomic under the GIL


class BatchRecord:
    """One ``batch`` block: its rows, its times, and how many of its calls were handed over.

    Written by the calling thread only (``sampled``: a call handed over, ``lost``: a call the
    full queue dropped); the worker reads it."""

    # __weakref__: the worker keys what it keeps of a block by the record, weakly (a block whose
    # end never reached the worker takes the worker's entries with it)
    __slots__ = ("rows", "block_id", "parent", "start_epoch_ns", "end_epoch_ns", "sampled",
                 "lost", "__weakref__")

    def __init__(self, rows: tuple[Any, ...]) -> None:
        self.rows = rows
        self.block_id = _next_block()
        # the application's span around the block: the parent of a plain request id's span
        parent = otel_trace.get_current_span().get_span_context()
        self.parent = parent if parent.is_valid else None
        self.start_epoch_ns = time.time_ns()
        self.end_epoch_ns: int | None = None
        self.sampled = 0
        self.lost = 0


def rows_for(rows: tuple[Any, ...] | None, batch_size: int) -> tuple[Any, ...] | None:
    """``rows`` when they match a call's batch size; a mismatch is logged once and None."""
    if rows is None or len(rows) == batch_size:
        return rows
    _log.warn_once("batch-size", "attnscope.batch: the block declares a different number of rows "
                   "than the call's batch; the call is not apportioned",
                   rows=len(rows), batch=batch_size)
    return None
