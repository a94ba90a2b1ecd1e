"""Results → OpenTelemetry spans, on the worker thread.

Spans are built after the calls they describe, with explicit timestamps. A nested capture ends
before its parent, so the builder holds children until their parent capture arrives, builds the
parent, then the children under it. Attribute names come from :mod:`attnscope._schema`.
What the builder holds is a :class:`Result` (the worker's own object, made by :mod:`.calls`),
never the Capture, so tensors and handles the calling thread recorded are let go as soon as the
worker has read them. Every span leaves through :meth:`SpanBuilder.emit` (or, for spans that end
later, :meth:`SpanBuilder.open_span`): call spans, their operator children, step and request spans.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from opentelemetry.trace import INVALID_SPAN_CONTEXT, Link, SpanContext, TraceFlags

from .. import _dist, _log
from .. import _schema as schema
from .._profiles.kernels import KIND_CPU_OP, KIND_CUDA_KERNEL, detect_backend
from .._profiles.optree import Children, hand_down
from .._record.capture import ErrorInfo
from .calls import Result, capture_attributes, implementation_of, result_of, site_attributes
from .emit import DirectEmitter, Emitter, OpenSpan
from .steps import StepTraces, configured_run_id
from .summary import Summaries, op_summary

__all__ = ["SpanBuilder", "Result", "result_of", "capture_attributes", "implementation_of",
           "site_attributes", "BuildStats", "backend_of_spans", "is_attention_call"]

# Built span contexts kept so late children (other threads) still find their parent.
BUILT_KEEP = 4096
# Captures dropped on a full queue, remembered apart from the built ones: a child can reach the
# builder long after its parent's drop notice (behind a queue of up to queue_size captures), by
# when thousands of built spans would have pushed the notice out of the built ones' bound.
_LOST_KEEP = 65_536
# Children wait at most this long for a parent that never arrives (dropped, or a very long call),
# with an emitter that cannot choose span ids (the application's provider): then they go up a level.
STASH_MAX_AGE_S = 600.0
# Children waiting for their parents, in all, before the parents with most of them are released.
STASH_MAX_ITEMS = 8192
# With attnscope's own provider a parent is opened instead (its ids reserved, its children emitted
# under them at once, the parent with those ids when it ends) once its first child has waited this
# long: a long-lived call (an epoch, a served request loop) shows its children while it runs.
OPEN_AFTER_S = 60.0
# Parents opened and not arrived yet; past it the oldest is given up (its children so far orphaned).
_OPEN_KEEP = 4096

# attribute names read or written per span, built once
_TIER, _FLOPS, _LINK = schema.TIER.name, schema.FLOPS.name, schema.LINK.name
_RANK = schema.RANK.name
_MODULE, _SUMMARY = schema.MODULE.name, schema.SUMMARY.name
_LAYERS_CALLS, _LAYERS_FLOPS, _LAYERS_BYTES = (schema.LAYERS_CALLS.name, schema.LAYERS_FLOPS.name,
                                               schema.LAYERS_BYTES.name)
_BYTES, _SEQ_Q = schema.BYTES.name, schema.SEQ_LEN_Q.name
_NUM_HEADS, _NUM_KV_HEADS = schema.NUM_HEADS.name, schema.NUM_KV_HEADS.name
_KV_REPEATED_FROM, _PROFILED_BY = schema.KV_REPEATED_FROM.name, schema.PROFILED_BY.name
_FALLBACK = schema.BACKEND_FALLBACK.name
_VERDICT = (_FALLBACK, schema.BACKEND_EXPECTED.name, schema.BACKEND_REASON.name)
_BACKEND = schema.BACKEND.name


class BuildStats:
    """Counters the builder keeps (read by attnscope.stats())."""

    def __init__(self) -> None:
        self.emitted = 0
        self.dropped_trace_cap = 0
        self.orphaned = 0
        self.errors = 0  # waiting children whose span could not be built (each logged)


class _Opened:
    """A parent whose span's ids were reserved before it arrived (see ``OPEN_AFTER_S``)."""

    __slots__ = ("context", "emitted")

    def __init__(self, context: SpanContext) -> None:
        self.context = context
        self.emitted = 0  # children emitted under it: orphans if it never arrives


def is_attention_call(attrs: dict[str, Any]) -> bool:
    """A call span's attributes name an attention call (its FLOPs or heads), not a decoder
    layer, a model forward or a block around one."""
    return _FLOPS in attrs or _NUM_HEADS in attrs


def _tell_nested(parent: dict[str, Any], nested: list[Result]) -> None:
    """What the calls nested in ``parent``'s call say that their own figures cannot: a call
    timed inside a profiled one (at any depth) has its ops from that profile (``profiled_by``:
    the nested call found attnscope's profiler running, ``profile_skipped_nested``), and a kernel
    that got K/V repeated to more heads than its layer has names the layer's count
    (``kv_repeated_from``: ``num_kv_heads`` stays what the kernel received). The one attention
    call timed inside a profiled call takes its fallback verdict: judged on the SDPA call in it
    (:mod:`attnscope._capture.inner_sdpa`), which is this call's."""
    own = parent.get(_TIER) == "profile"
    # not "nested": a call holding a profiled one; its other calls ran without the profiler
    profiled = own or parent.get(_PROFILED_BY) == "enclosing"
    heads, kv = parent.get(_NUM_HEADS), parent.get(_NUM_KV_HEADS)
    kv_heads = kv if _MODULE in parent and type(heads) is int and type(kv) is int and kv > 0 \
        else 0
    if own and _FALLBACK in parent and not is_attention_call(parent):
        calls = [c for c in nested if is_attention_call(c.attrs)]
        if len(calls) == 1 and _FALLBACK not in calls[0].attrs:
            calls[0].attrs.update({k: parent[k] for k in _VERDICT if k in parent})
    for child in nested:
        attrs = child.attrs
        if profiled and attrs.get(_TIER) == "timing":
            attrs[_PROFILED_BY] = "enclosing"
        if kv_heads and _MODULE not in attrs and attrs.get(_NUM_HEADS) == heads:
            got = attrs.get(_NUM_KV_HEADS)
            if type(got) is int and got > kv_heads and got % kv_heads == 0:
                attrs[_KV_REPEATED_FROM] = kv_heads


def _layer_sums(parent: dict[str, Any], stash: dict[int, list[Result]], capture_id: int) -> None:
    """A model forward's sampled attention calls, summed: its descendants with FLOPs, all still
    waiting for it here (a call inside an attention call, SDPA in a layer, is the outer one's)."""
    calls: list[dict[str, Any]] = []
    todo = list(stash.get(capture_id, ()))
    while todo and len(calls) < 100_000:
        item = todo.pop()
        if type(item.attrs.get(_FLOPS)) is int:
            calls.append(item.attrs)
        else:
            todo.extend(stash.get(item.capture_id, ()))
    if not calls:
        return
    parent[_LAYERS_CALLS] = len(calls)
    parent[_LAYERS_FLOPS] = sum(a[_FLOPS] for a in calls)
    moved = [a.get(_BYTES) for a in calls]
    if all(type(b) is int for b in moved):
        parent[_LAYERS_BYTES] = sum(moved)


_CUT = "cut"  # the capture's span was not emitted (per-trace cap): its subtree is cut too
_LOST = "lost"  # the capture never reached the worker (queue full): children go up a level
_SPAN_ID_MASK = (1 << 64) - 1


def _packed(fate: Any) -> Any:
    """A fate as kept: a local span context with no trace state as one int. The builder keeps
    the last ``BUILT_KEEP`` (seconds of spans when every call is traced), long enough for the
    cyclic GC to move them to its oldest generation, and a SpanContext and its TraceFlags are
    two objects it tracks: 1.5 of the 1.9 objects a capture moved there, each move bringing the
    next full collection (a pause of the whole process, every thread) closer. An int is none."""
    if type(fate) is SpanContext and not fate.is_remote and not fate.trace_state:
        return (fate.trace_id << 72) | (fate.span_id << 8) | int(fate.trace_flags)
    return fate


def _unpacked(kept: Any) -> Any:
    if type(kept) is not int:
        return kept  # None, _CUT, _LOST, or a span context kept whole
    return SpanContext(kept >> 72, (kept >> 8) & _SPAN_ID_MASK, is_remote=False,
                       trace_flags=TraceFlags(kept & 0xFF))


class SpanBuilder:
    """Builds spans parents-first with at most ``max_spans_per_trace`` per trace.

    Every result handed to :meth:`add` ends in exactly one place: emitted (``stats.emitted``, of
    them ``stats.orphaned`` without their parent's span), cut by the per-trace cap
    (``stats.dropped_trace_cap``), failed (``stats.errors``), or waiting for its parent
    (:meth:`pending`) — waiting until built, even while the builder works through a released
    parent's children, so a count read from another thread meanwhile misses none.
    """

    def __init__(self, emitter: Emitter, max_spans_per_trace: int,
                 on_span: Callable[[Result, SpanContext], None] | None = None) -> None:
        self.emitter = emitter
        self.max_per_trace = max_spans_per_trace
        self.stats = BuildStats()
        self._on_span = on_span
        # capture id -> its SpanContext (_packed), _CUT or _LOST (bounded, oldest forgotten first)
        self._fate: OrderedDict[int, Any] = OrderedDict()
        self._stash: dict[int, list[Result]] = {}
        self._waiting = 0  # results in the stash, or taken out of it and not built yet
        # parents opened before they arrived (OPEN_AFTER_S): only an emitter that lets attnscope
        # choose a span's ids can emit the parent later under the ids its children went out with
        self._opened: OrderedDict[int, _Opened] = OrderedDict()
        self._reserves = isinstance(emitter, DirectEmitter)
        self._lost: OrderedDict[int, None] = OrderedDict()  # dropped captures (see _LOST_KEEP)
        self._per_trace: OrderedDict[int, int] = OrderedDict()
        self.steps: StepTraces | None = None  # made by the first call under attnscope.step()
        self._summaries = Summaries()  # the attnscope.summary texts kept per shape
        # A rank of a job puts its rank on every span (Jaeger groups its statistics by span tags,
        # and a process tag is not one): read once, as the worker starts under torchrun's RANK.
        self._rank = _dist.rank() if _dist.world_size() > 1 else None

    def add(self, item: Result) -> None:
        """Build now if the parent is settled; otherwise wait for it."""
        self._place(item)

    def waiting_under(self, capture_id: int) -> list[Result]:
        """The results waiting here for ``capture_id``'s span, at any depth (not built yet:
        their attributes can still change)."""
        out: list[Result] = []
        todo = list(self._stash.get(capture_id, ()))
        while todo and len(out) < 100_000:
            item = todo.pop()
            out.append(item)
            todo.extend(self._stash.get(item.capture_id, ()))
        return out

    def _place(self, item: Result) -> None:
        parent_id = item.parent_id
        if parent_id is None:
            self._build(item, None)
            return
        fate = _unpacked(self._fate.get(parent_id))
        if fate is None:
            opened = self._opened.get(parent_id) if self._opened else None
            if opened is not None:  # a long-lived parent, still running: under its ids
                if self._build(item, opened.context):
                    opened.emitted += 1
                return
            if parent_id not in self._lost:
                self._stash.setdefault(parent_id, []).append(item)
                self._waiting += 1
                return
            fate = _LOST  # its notice came long before it would have
        self._decide(item, fate)

    def _decide(self, item: Result, fate: Any) -> None:
        """Build (or cut) a child whose parent's fate is known."""
        if fate is _CUT:
            self._cut(item)
        elif fate is _LOST:
            if self._build(item, None):
                self.stats.orphaned += 1
        else:
            self._build(item, fate)

    def parent_dropped(self, capture_id: int) -> None:
        """A capture will never arrive (dropped on a full queue): its children go up a level."""
        self._lost[capture_id] = None
        if len(self._lost) > _LOST_KEEP:
            self._lost.popitem(last=False)
        opened = self._opened.pop(capture_id, None)
        if opened is not None:  # its children so far went out under ids it will never have
            self.stats.orphaned += opened.emitted
        self._settle(capture_id, _LOST)

    def expire(self, max_age_s: float | None = None, max_items: int | None = None) -> None:
        """Release the parents waited on too long (``OPEN_AFTER_S``, or ``STASH_MAX_AGE_S``
        when they cannot be opened), then, while over ``STASH_MAX_ITEMS`` children wait, those
        with the most: opened, or given up on (their children go up a level)."""
        if not self._stash:
            return
        reserve = self._reserves
        if max_age_s is None:
            max_age_s = OPEN_AFTER_S if reserve else STASH_MAX_AGE_S
        if max_items is None:
            max_items = STASH_MAX_ITEMS
        now = time.monotonic()
        # the oldest child of each parent is its first: children are only ever appended
        overdue = [p for p, items in self._stash.items() if now - items[0].added > max_age_s]
        for parent_id in overdue:
            self._give_way(parent_id, reserve)
        if self._waiting > max_items:
            stash = self._stash
            for parent_id in sorted(stash, key=lambda p: len(stash[p]), reverse=True):
                if self._waiting <= max_items:
                    break
                self._give_way(parent_id, reserve)

    def _give_way(self, parent_id: int, reserve: bool) -> None:
        waiting = self._stash.get(parent_id)
        if not waiting:
            return
        opened = None
        if reserve:
            try:
                opened = self._open(waiting[0])
            except Exception as exc:  # the provider's own sampler raised: they go up a level
                _log.internal_error("worker", exc)
        if opened is None:
            self._settle(parent_id, _LOST)
            return
        del self._stash[parent_id]
        self._opened[parent_id] = opened
        if len(self._opened) > _OPEN_KEEP:
            self.stats.orphaned += self._opened.popitem(last=False)[1].emitted
        self._release(waiting, opened)

    def _open(self, first: Result) -> _Opened:
        """Reserve a parent's span context: in the trace of its first waiting child's
        application span (where the parent most likely is; a trace that span's sampler left
        unrecorded is not one), else in a new trace. Its place in that trace is taken now."""
        emitter = self.emitter
        ids = emitter.ids if isinstance(emitter, DirectEmitter) else None
        guess = first.otel_parent
        if guess is None or not guess.is_valid or not guess.trace_flags.sampled:
            guess = None
        if ids is None:  # only attnscope's own provider is opened (see _reserves)
            raise RuntimeError("this emitter cannot choose span ids")
        trace_id = guess.trace_id if guess is not None else ids.generate_trace_id()
        context = emitter.context_with(trace_id, ids.generate_span_id(), "", guess)
        self._over_cap(trace_id)
        return _Opened(context)

    def give_up(self, final: bool = True) -> None:
        """Children still waiting for a parent are built under the app's span: the worker is
        stopping (their parent may go to the next one) or lost track of dropped parents.
        ``final``: stopping, so parents opened and never arrived leave their children orphaned."""
        for parent_id in list(self._stash):
            self._settle(parent_id, _LOST)
        if final:
            for opened in self._opened.values():
                self.stats.orphaned += opened.emitted
            self._opened.clear()
        if self.steps is not None:
            self.steps.close()

    def pending(self) -> int:
        return self._waiting

    # The one way out: every span attnscope makes leaves through these three — call spans and
    # their operator children (``_build``), step spans (``.steps``), request spans
    # (``.requests``), a graph replay's (as call spans) — onto this builder's emitter.

    def emit(self, name: str, parent: SpanContext | None, attrs: dict[str, Any], start_ns: int,
             end_ns: int, links: Sequence[Link] | None = None,
             error: ErrorInfo | None = None) -> SpanContext | None:
        """One finished span; its context (for children), or None when it is not recorded."""
        return self.emitter.emit(name, parent, attrs, start_ns, end_ns, links, error)

    def context_with(self, trace_id: int, span_id: int, name: str,
                     parent: SpanContext | None) -> SpanContext:
        """The context a span with these ids would have (a step's): :meth:`Emitter.context_with`."""
        return self.emitter.context_with(trace_id, span_id, name, parent)

    def open_span(self, ctx: SpanContext, name: str, parent: SpanContext | None,
                  attrs: dict[str, Any], start_ns: int) -> OpenSpan | None:
        """A span that ends later, its children emitted first (a step's rank and root spans)."""
        return self.emitter.open_span(ctx, name, parent, attrs, start_ns)

    def context_of(self, capture_id: int) -> SpanContext | None:
        """The span context a capture's span was emitted with, while it is remembered."""
        fate = _unpacked(self._fate.get(capture_id))
        return fate if isinstance(fate, SpanContext) else None

    def _build(self, item: Result, parent: SpanContext | None) -> bool:
        """Emit ``item`` under ``parent`` (None: its application span, or its step's); False
        when the per-trace cap cut it instead."""
        # before the step's sums read them: what the calls waiting for this one say of it
        nested = self._stash.get(item.capture_id)
        if nested:
            _tell_nested(item.attrs, nested)
            if _SEQ_Q in item.attrs and _FLOPS not in item.attrs and _MODULE in item.attrs:
                _layer_sums(item.attrs, self._stash, item.capture_id)  # a model forward
        target = parent if parent is not None else item.otel_parent
        in_step = target is None and (item.step_no is not None or self.steps is not None)
        if in_step:
            target = self._step_parent(item)
        links = None
        if target is not None and not target.trace_flags.sampled and not in_step:
            # A forced capture inside a trace the app chose not to record: the app's sampler would
            # drop a child, so this span starts its own trace and links to the app's span.
            links = [Link(target)]
            target = None
        slow = _unpacked(self._fate.get(item.link_id)) if item.link_id is not None else None
        if isinstance(slow, SpanContext) and slow.is_valid:
            links = [*(links or ()), Link(slow, {_LINK: "slow_call"})]
        opened = self._opened.pop(item.capture_id, None) if self._opened else None
        if opened is None and target is not None and self._over_cap(target.trace_id):
            self._cut(item)
            return False
        if self._rank is not None:
            item.attrs[_RANK] = self._rank
        try:
            item.attrs[_SUMMARY] = self._summaries.call(item.attrs, item.kept)
        except Exception as exc:  # the span goes out without it
            _log.internal_error("summary", exc)
        if opened is not None:
            sc: SpanContext | None = self._emit_opened(item, opened.context, target, links)
        else:
            sc = self.emit(item.name, target, item.attrs, item.start_ns, item.end_ns, links,
                           item.error)
        if sc is None:
            sc = INVALID_SPAN_CONTEXT
        elif target is None and opened is None:
            self._over_cap(sc.trace_id)  # a new trace: count its root
        if item.children and sc.is_valid and sc.trace_flags.sampled:
            self._children(item, sc)
        self.stats.emitted += 1
        if self._on_span is not None:
            self._on_span(item, sc)
        self._settle(item.capture_id, sc)
        return True

    def _emit_opened(self, item: Result, context: SpanContext, target: SpanContext | None,
                     links: list[Link] | None) -> SpanContext:
        """An opened parent, at last, with the ids its children went out under. One whose own
        parent is in another trace than the one reserved is that trace's root, linked to it."""
        parent = target
        if target is not None and target.trace_id != context.trace_id:
            links = [*(links or ()), Link(target)]
            parent = None
        emitter = self.emitter
        if context.trace_flags.sampled and isinstance(emitter, DirectEmitter):
            emitter._end(context, item.name, parent, item.attrs, item.start_ns, item.end_ns,
                         links or (), item.error)
        return context

    def _step_parent(self, item: Result) -> SpanContext | None:
        """A top-level call outside any application span: under its step's rank span
        (docs/live.md); a call of no step closes the open step."""
        steps = self.steps
        if steps is None:
            steps = self.steps = StepTraces(self, configured_run_id)
        return steps.parent_for(item.step_no, item.start_ns, item.end_ns, item.attrs)

    def _children(self, item: Result, sc: SpanContext) -> None:
        """Kernel/op spans, each under its parent op (parents come first). Ops that ran inside a
        nested capture still waiting here go to it, and are built under its span."""
        nested = self._stash.get(item.capture_id, ())
        children = hand_down(item.children, nested)
        for res in nested:  # a call timed inside this profile: the backend its ops name
            _name_backend(res)
        item.children = []
        built: list[SpanContext] = []
        for child in children:
            parent = built[child.parent] if 0 <= child.parent < len(built) else sc
            attrs = child.attributes
            try:
                attrs[_SUMMARY] = op_summary(attrs, child.end_ns - child.start_ns)
            except Exception as exc:  # the span goes out without it
                _log.internal_error("summary", exc)
            if self._rank is not None:
                attrs = {**attrs, _RANK: self._rank}
            built.append(self.emit(child.name, parent, attrs, child.start_ns, child.end_ns)
                         or parent)

    def _cut(self, item: Result) -> None:
        self.stats.dropped_trace_cap += 1
        self._settle(item.capture_id, _CUT)

    def _settle(self, capture_id: int, fate: Any) -> None:
        self._fate[capture_id] = _packed(fate)
        if len(self._fate) > BUILT_KEEP:
            self._fate.popitem(last=False)
        waiting = self._stash.pop(capture_id, None)
        if waiting:
            self._release(waiting, fate)

    def _release(self, waiting: list[Result], fate: Any) -> None:
        """Build children taken out of the stash with their parent's fate as given, not looked
        up again: building thousands of them pushes the parent out of the fates kept (they were
        stashed again, and lost). Each still counts as waiting until it is built; one that fails
        is counted (``stats.errors``) and the rest are built."""
        for child in waiting:
            try:
                if type(fate) is _Opened:
                    if self._build(child, fate.context):
                        fate.emitted += 1
                else:
                    self._decide(child, fate)
            except Exception as exc:
                self.stats.errors += 1
                _log.internal_error("worker", exc)
            finally:
                self._waiting -= 1

    def _over_cap(self, trace_id: int) -> bool:
        count = self._per_trace.get(trace_id, 0)
        if count >= self.max_per_trace:
            return True
        self._per_trace[trace_id] = count + 1
        self._per_trace.move_to_end(trace_id)
        if len(self._per_trace) > 4096:
            self._per_trace.popitem(last=False)
        return False


def _name_backend(res: Result) -> None:
    """The attention backend of a call timed inside a profiled one, from the ops handed down to
    it (what a profiled call's own span says, from its events): unless it says one already, and
    not when its ops name none (a layer without attention, a block)."""
    kids = res.children
    if not kids or _BACKEND in res.attrs:
        return
    try:
        backend = backend_of_spans(kids.uncapped if isinstance(kids, Children) else kids)
    except Exception as exc:  # the span goes out without it
        _log.internal_error("backend", exc)
        return
    if backend != "unknown":
        res.attrs[_BACKEND] = backend


def backend_of_spans(children: Iterable[Any]) -> str:
    """:func:`detect_backend` of a call's op and kernel spans (``name``, ``attributes``): those a
    profiled call handed down to a call timed inside it. An op's label (``aten::linear
    (q_proj)``) is left off; an op's folded inner ops count (the fused SDPA op is usually one)."""
    ops: list[str] = []
    kernels: list[str] = []
    inner_key = schema.KERNEL_INNER.name
    for child in children:
        kind = child.attributes.get(schema.KERNEL_KIND.name)
        if kind == KIND_CPU_OP:
            ops.append(child.name.split(" (", 1)[0])
            ops.extend(str(name) for name in child.attributes.get(inner_key) or ())
        elif kind == KIND_CUDA_KERNEL:
            kernels.append(child.name)
    return detect_backend(ops, kernels)
