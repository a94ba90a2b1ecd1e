"""The ``attnscope.request`` spans a ``batch`` block ends with: one per request of its rows.

Each sums, over the block's split calls (:mod:`attnscope._worker.apportion`), the request's rows'
tokens, useful and padding FLOPs, estimated time and KV bytes, per phase, links to the batched
calls it shared, and goes out through the span builder's emitter, as every span does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import Link, SpanContext

from .. import _log
from .. import _schema as schema
from .._record.batches import BatchRecord

if TYPE_CHECKING:
    from .spans import SpanBuilder

__all__ = ["RowCall", "BlockCalls", "emit_block", "SPAN_NAME"]

SPAN_NAME = schema.REQUEST_SPAN
_MAX_LINKS = 32  # links from a request span to the batched calls it shared (the first ones)
_LINK = schema.LINK.name
_PREFILL = (schema.REQUEST_PREFILL_CALLS.name, schema.REQUEST_PREFILL_FLOPS.name,
            schema.REQUEST_PREFILL_NS.name)
_DECODE = (schema.REQUEST_DECODE_CALLS.name, schema.REQUEST_DECODE_FLOPS.name,
           schema.REQUEST_DECODE_NS.name)


class RowCall:
    """One call's figures per row (lists indexed by row), or why it was not split."""

    __slots__ = ("capture_id", "parent_id", "phase", "weight", "tokens", "useful", "padding",
                 "time_ns", "kv_bytes", "exact", "reason")

    def __init__(self, capture_id: int, parent_id: int | None, reason: str | None = None) -> None:
        self.capture_id = capture_id
        self.parent_id = parent_id
        self.phase: str | None = None
        self.weight = 1.0  # in the estimate of all calls: 1/sample rate (0: attnscope.extra)
        self.tokens: list[int] = []
        self.useful: list[int] = []
        self.padding: list[int] = []
        self.time_ns: list[float] = []
        self.kv_bytes: list[int] | None = None
        self.exact = True
        self.reason = reason  # None: split


class BlockCalls:
    """The split calls a ``batch`` block gathered, and the ids of its attention calls."""

    __slots__ = ("calls", "attention_ids")

    def __init__(self) -> None:
        self.calls: list[RowCall] = []
        self.attention_ids: set[int] = set()


class _Request:
    __slots__ = ("row", "calls", "tokens", "useful", "padding", "time_ns", "kv_bytes",
                 "all_flops", "all_time_ns", "phases", "inexact", "links", "timed")

    def __init__(self, row: int) -> None:
        self.row = row
        self.calls = self.tokens = self.useful = self.padding = self.kv_bytes = 0
        self.time_ns = self.all_flops = self.all_time_ns = 0.0
        self.phases: dict[str, list[float]] = {}  # phase -> [calls, flops, time_ns]
        self.inexact = False
        self.links: list[int] = []
        self.timed = True


def emit_block(builder: SpanBuilder, block: BatchRecord, acc: BlockCalls | None,
               on_request: Callable[[float, SpanContext | None], None]) -> int:
    """One ``attnscope.request`` span per request of an ended block, through ``builder``; returns
    how many. ``acc``: the block's calls split by row (None: none was). ``on_request``: each
    timed request's estimated attention time (s) and span."""
    calls = acc.calls if acc is not None else []
    nested = acc.attention_ids if acc is not None else set()
    # an attention call inside another of the block's (SDPA in a layer) is the outer one's work
    calls = [c for c in calls if c.parent_id is None or c.parent_id not in nested]
    unsplit = sum(1 for c in calls if c.reason is not None)
    # a request's identity: its id string, or its span's ids (a SpanContext's trace state is
    # not hashable); the same request in several rows is one request
    requests: dict[Any, _Request] = {}
    indices: dict[Any, list[int]] = {}
    parents: dict[Any, SpanContext | None] = {}
    for i, row in enumerate(block.rows):
        if row is None:
            continue
        key = row if isinstance(row, str) else (row.trace_id, row.span_id)
        if key not in requests:
            requests[key] = _Request(i)
            parents[key] = block.parent if isinstance(row, str) else row
        indices.setdefault(key, []).append(i)
    for call in calls:
        if call.reason is not None:
            continue
        for key, req in requests.items():
            _add(req, call, indices[key])
    end = block.end_epoch_ns or block.start_epoch_ns
    made = 0
    for key, req in requests.items():
        attrs = _attributes(block, req, len(calls), unsplit, block.lost)
        parent = parents[key]
        if isinstance(key, str):
            attrs[schema.REQUEST_ID.name] = key
        links = []
        for capture_id in req.links:
            sc = builder.context_of(capture_id)
            if isinstance(sc, SpanContext) and sc.is_valid:
                links.append(Link(sc, {_LINK: "batched_call"}))
        try:
            sc = builder.emit(SPAN_NAME, parent, attrs, block.start_epoch_ns, end, links)
            made += 1
        except Exception as exc:
            _log.internal_error("request-span", exc)
            continue
        if req.timed and req.calls:
            on_request(req.all_time_ns / 1e9, sc)
    return made


def _add(req: _Request, call: RowCall, indices: list[int]) -> None:
    req.calls += 1
    if len(req.links) < _MAX_LINKS:
        req.links.append(call.capture_id)
    tokens = sum(call.tokens[i] for i in indices)
    useful = sum(call.useful[i] for i in indices)
    padding = sum(call.padding[i] for i in indices)
    req.tokens += tokens
    req.useful += useful
    req.padding += padding
    req.all_flops += (useful + padding) * call.weight
    t = 0.0
    if call.time_ns:
        t = sum(call.time_ns[i] for i in indices)
        req.time_ns += t
        req.all_time_ns += t * call.weight
    else:
        req.timed = False
    if call.kv_bytes is not None:
        req.kv_bytes += sum(call.kv_bytes[i] for i in indices)
    if not call.exact:
        req.inexact = True
    if call.phase in ("prefill", "decode"):
        phase = req.phases.setdefault(call.phase, [0, 0, 0.0])
        phase[0] += 1
        phase[1] += useful + padding
        phase[2] += t


def _attributes(block: BatchRecord, req: _Request, calls: int, unsplit: int,
                lost: int) -> dict[str, Any]:
    s = schema
    attrs: dict[str, Any] = {
        s.REQUEST_BATCH.name: block.block_id,
        s.REQUEST_BATCH_SIZE.name: len(block.rows),
        s.REQUEST_ROW.name: req.row,
        s.REQUEST_SAMPLED_CALLS.name: req.calls,
        s.REQUEST_CALLS_UNAPPORTIONED.name: unsplit,
        s.REQUEST_TOKENS.name: req.tokens,
        s.REQUEST_FLOPS.name: req.useful + req.padding,
        s.REQUEST_USEFUL_FLOPS.name: req.useful,
        s.REQUEST_PADDING_FLOPS.name: req.padding,
        s.REQUEST_ALL_FLOPS.name: round(req.all_flops),
    }
    if lost:
        attrs[s.REQUEST_CALLS_LOST.name] = lost
    if req.kv_bytes:
        attrs[s.REQUEST_KV_BYTES_READ.name] = req.kv_bytes
    if req.calls and req.timed:
        attrs[s.REQUEST_ATTENTION_NS.name] = round(req.time_ns)
        attrs[s.REQUEST_ALL_ATTENTION_NS.name] = round(req.all_time_ns)
    for phase, names in (("prefill", _PREFILL), ("decode", _DECODE)):
        if phase in req.phases:
            n, flops, t = req.phases[phase]
            attrs[names[0]], attrs[names[1]] = int(n), int(flops)
            if req.timed:
                attrs[names[2]] = round(t)
    if req.inexact:
        attrs[s.REQUEST_EXACT.name] = False
    return attrs
