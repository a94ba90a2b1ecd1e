"""Results → OpenTelemetry spans, on the worker thread.

Spans are built after the calls they describe, with explicit timestamps. A nested capture ends
before its parent, so the builder holds children until their parent capture arrives, builds the
parent, then the children under it. Attribute names are the schema in docs/attributes.md.
What the builder holds is a :class:`Result` (the worker's own object), never the Capture, so
tensors and handles the calling thread recorded are let go as soon as the worker has read them.
"""

from __future__ import annotations

import functools
import time
from collections import OrderedDict
from collections.abc import Callable
from math import floor, isfinite, log10
from typing import Any

from opentelemetry.trace import INVALID_SPAN_CONTEXT, Link, SpanContext

from ..capture.record import TIER_NAMES, Capture
from .emit import MAX_STRING, Emitter, span_name
from .optree import ChildSpan, hand_down
from .steps import StepTraces, configured_run_id

__all__ = ["SpanBuilder", "Result", "result_of", "capture_attributes", "derived_attributes",
           "site_attributes", "BuildStats"]

P = "attnscope."
# Built span contexts kept so late children (other threads) still find their parent.
_BUILT_KEEP = 4096
# Children wait at most this long for a parent that never arrives (dropped, or a very long call).
STASH_MAX_AGE_S = 600.0


def site_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """A call site's own attributes (names as given), cleaned once per site, not per span."""
    return {key: _clean(value) for key, value in attributes.items()}


@functools.lru_cache(maxsize=1024)
def _name(key: str) -> str:
    return key if key.startswith("gen_ai.") else P + key


_PLAIN = frozenset((int, float, bool))
# attribute names read or written per span, built once
_TIER, _SAMPLE_RATE, _WALL_NS = P + "tier", P + "sample_rate", P + "wall_ns"
_FLOPS, _TFLOPS, _TOKENS, _TOKENS_PER_S = (P + "flops", P + "tflops", P + "tokens",
                                           P + "tokens_per_s")


def capture_attributes(cap: Capture, derived: dict[str, Any],
                       site_attrs: dict[str, Any] | None = None,
                       shared: tuple[dict[str, Any], dict[str, Any]] | None = None,
                       ) -> dict[str, Any]:
    """The span attributes of one capture (derived: what the worker found, unprefixed).

    ``site_attrs``: :func:`site_attributes` of the capture's site, when the caller keeps them.
    ``shared``: what derive found for the call's summary, kept by the worker (:mod:`.shapecache`),
    and its :func:`derived_attributes`; ``derived`` then holds only what this one call adds. The
    attributes, and their order, are those of both dicts merged and given as ``derived``.
    """
    attrs = dict(site_attrs if site_attrs is not None else site_attributes(cap.site.attributes))
    attrs[_TIER] = TIER_NAMES.get(cap.tier, "timing")
    attrs[_SAMPLE_RATE] = float(cap.sample_rate)
    if shared is None:
        _add_derived(attrs, derived)
    elif shared[0].keys().isdisjoint(derived):
        attrs.update(shared[1])
        _add_derived(attrs, derived)
    else:  # the call sets a name derive found: merged first, as one dict would have it
        _add_derived(attrs, {**shared[0], **derived})
    if cap.extra:  # span() attributes, already under their final names
        for key, value in cap.extra.items():
            if value is not None:
                attrs[key] = _clean(value)
    wall = cap.wall_ns
    attrs[_WALL_NS] = wall
    device_ns = derived.get("device_ns")
    if shared is not None and "device_ns" not in derived:
        device_ns = shared[0].get("device_ns")
    busy = device_ns if isinstance(device_ns, int) and device_ns > 0 else wall
    flops = attrs.get(_FLOPS)
    if isinstance(flops, int) and busy > 0:
        attrs[_TFLOPS] = _sig4(flops / busy / 1e3)  # FLOP/ns = 1e9 FLOP/s; TFLOP/s = /1e3
    tokens = attrs.get(_TOKENS)
    if isinstance(tokens, int) and busy > 0:
        attrs[_TOKENS_PER_S] = _sig4(tokens * 1e9 / busy)
    return attrs


def derived_attributes(derived: dict[str, Any]) -> dict[str, Any]:
    """What derive found, under attribute names, with the values a span carries."""
    attrs: dict[str, Any] = {}
    _add_derived(attrs, derived)
    return attrs


def _add_derived(attrs: dict[str, Any], derived: dict[str, Any]) -> None:
    for key, value in derived.items():
        if value is not None:
            if type(value) is float:
                value = _sig4(value)
            attrs[_name(key)] = value if type(value) in _PLAIN else _clean(value)


def _sig4(x: float) -> float:
    """``x`` to 4 significant digits: what a measured rate means (not 17 digits of noise).
    The same value as ``float(f"{x:.4g}")``, in half the time (it runs twice per span)."""
    if not x or not isfinite(x):
        return x
    return round(x, 3 - floor(log10(abs(x))))


def _clean(value: Any) -> Any:
    if isinstance(value, (bool, int, float)):
        return value
    if isinstance(value, str):
        return value[:MAX_STRING]
    if isinstance(value, (list, tuple)):
        items = list(value)[:64]
        if all(isinstance(v, str) for v in items):
            return [v[:MAX_STRING] for v in items]
        if all(isinstance(v, bool) for v in items) or all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in items
        ):
            return items
        return [str(v)[:MAX_STRING] for v in items]
    return str(value)[:MAX_STRING]


class BuildStats:
    """Counters the builder keeps (read by attnscope.stats())."""

    def __init__(self) -> None:
        self.emitted = 0
        self.dropped_trace_cap = 0
        self.orphaned = 0




class Result:
    """What the worker made of one capture: all its span needs, and no live handle."""

    __slots__ = ("capture_id", "parent_id", "name", "otel_parent", "start_ns", "end_ns", "attrs",
                 "children", "error", "added", "link_id", "step_no")

    def __init__(self, cap: Capture, attrs: dict[str, Any], children: list[ChildSpan]) -> None:
        self.capture_id = cap.capture_id
        self.parent_id = cap.parent_id
        self.name = span_name(cap.name)  # a str, capped: an exporter could refuse the batch
        self.otel_parent = cap.otel_parent
        self.start_ns = cap.start_epoch_ns
        self.end_ns = cap.end_epoch_ns
        self.attrs = attrs
        self.children = children
        self.error = cap.error
        self.added = time.monotonic()
        # a call profiled after a slow one links to the slow call's span (capture.grants)
        self.link_id = cap.grant.link if cap.grant is not None else None
        self.step_no = cap.step_no


def result_of(cap: Capture, derived: dict[str, Any], children: list[ChildSpan],
              site_attrs: dict[str, Any] | None = None,
              shared: tuple[dict[str, Any], dict[str, Any]] | None = None) -> Result:
    return Result(cap, capture_attributes(cap, derived, site_attrs, shared), children)


_CUT = "cut"  # the capture's span was not emitted (per-trace cap): its subtree is cut too
_LOST = "lost"  # the capture never reached the worker (queue full): children go up a level


class SpanBuilder:
    """Builds spans parents-first with at most ``max_spans_per_trace`` per trace."""

    def __init__(self, emitter: Emitter, max_spans_per_trace: int,
                 on_span: Callable[[Result, SpanContext], None] | None = None) -> None:
        self.emitter = emitter
        self.max_per_trace = max_spans_per_trace
        self.stats = BuildStats()
        self._on_span = on_span
        # capture id -> its SpanContext, _CUT or _LOST (bounded, oldest forgotten first)
        self._fate: OrderedDict[int, Any] = OrderedDict()
        self._stash: dict[int, list[Result]] = {}
        self._per_trace: OrderedDict[int, int] = OrderedDict()
        self.steps: StepTraces | None = None  # made by the first call under attnscope.step()

    def add(self, item: Result) -> None:
        """Build now if the parent is settled; otherwise wait for it."""
        self._place(item)

    def _place(self, item: Result) -> None:
        parent_id = item.parent_id
        if parent_id is None:
            self._build(item, None)
            return
        fate = self._fate.get(parent_id)
        if fate is None:
            self._stash.setdefault(parent_id, []).append(item)
        elif fate is _CUT:
            self._cut(item)
        elif fate is _LOST:
            self.stats.orphaned += 1
            self._build(item, None)
        else:
            self._build(item, fate)

    def parent_dropped(self, capture_id: int) -> None:
        """A capture will never arrive (dropped on a full queue): its children go up a level."""
        self._settle(capture_id, _LOST)

    def expire(self, max_age_s: float = STASH_MAX_AGE_S, max_items: int = 8192) -> None:
        """Give up on overdue parents: their children are built under the app's span."""
        now = time.monotonic()
        total = self.pending()
        for parent_id in list(self._stash):
            items = self._stash.get(parent_id, [])
            if total > max_items or any(now - it.added > max_age_s for it in items):
                total -= len(items)
                self._settle(parent_id, _LOST)

    def give_up(self) -> None:
        """Children still waiting for a parent are built under the app's span: the worker is
        stopping (their parent may go to the next one) or lost track of dropped parents."""
        for parent_id in list(self._stash):
            self._settle(parent_id, _LOST)
        if self.steps is not None:
            self.steps.close()

    def pending(self) -> int:
        return sum(len(v) for v in self._stash.values())

    def _build(self, item: Result, parent: SpanContext | None) -> None:
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
        slow = self._fate.get(item.link_id) if item.link_id is not None else None
        if isinstance(slow, SpanContext) and slow.is_valid:
            links = [*(links or ()), Link(slow, {P + "link": "slow_call"})]
        if target is not None and self._over_cap(target.trace_id):
            self._cut(item)
            return
        emit = self.emitter.emit
        sc = emit(item.name, target, item.attrs, item.start_ns, item.end_ns, links, item.error)
        if sc is None:
            sc = INVALID_SPAN_CONTEXT
        elif target is None:
            self._over_cap(sc.trace_id)  # a new trace: count its root
        if item.children and sc.is_valid and sc.trace_flags.sampled:
            self._children(item, sc)
        self.stats.emitted += 1
        if self._on_span is not None:
            self._on_span(item, sc)
        self._settle(item.capture_id, sc)

    def _step_parent(self, item: Result) -> SpanContext | None:
        """A top-level call outside any application span: under its step's rank span
        (docs/live.md); a call of no step closes the open step."""
        steps = self.steps
        if steps is None:
            steps = self.steps = StepTraces(self.emitter, configured_run_id)
        return steps.parent_for(item.step_no, item.start_ns, item.end_ns)

    def _children(self, item: Result, sc: SpanContext) -> None:
        """Kernel/op spans, each under its parent op (parents come first). Ops that ran inside a
        nested capture still waiting here go to it, and are built under its span."""
        children = hand_down(item.children, self._stash.get(item.capture_id, ()))
        item.children = []
        built: list[SpanContext] = []
        for child in children:
            parent = built[child.parent] if 0 <= child.parent < len(built) else sc
            built.append(self.emitter.emit(child.name, parent, child.attributes, child.start_ns,
                                           child.end_ns) or parent)

    def _cut(self, item: Result) -> None:
        self.stats.dropped_trace_cap += 1
        self._settle(item.capture_id, _CUT)

    def _settle(self, capture_id: int, fate: Any) -> None:
        self._fate[capture_id] = fate
        if len(self._fate) > _BUILT_KEEP:
            self._fate.popitem(last=False)
        for child in self._stash.pop(capture_id, ()):
            self._place(child)

    def _over_cap(self, trace_id: int) -> bool:
        count = self._per_trace.get(trace_id, 0)
        if count >= self.max_per_trace:
            return True
        self._per_trace[trace_id] = count + 1
        self._per_trace.move_to_end(trace_id)
        if len(self._per_trace) > 4096:
            self._per_trace.popitem(last=False)
        return False


