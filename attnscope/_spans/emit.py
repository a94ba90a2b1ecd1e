"""How a finished span reaches the span processors: through the SDK's tracer, or directly.

Spans are built after the call, complete: name, times, attributes, status and events are all known
at once. The SDK's ``Tracer.start_span`` / ``Span.end`` path exists for spans that are still
running (a mutable span, its lock, attribute limits re-checked per value) and costs most of the
worker's time per span. So:

- :class:`SdkEmitter` goes through ``tracer.start_span`` — used for any provider attnscope does not
  own (``tracer_provider=``, the application's global provider), whose span processors and hooks
  are the application's business;
- :class:`DirectEmitter` — used for the provider attnscope creates itself — asks that provider's
  sampler, makes the ids with its id generator, and hands a finished ``ReadableSpan`` (the public
  type every span processor and exporter receives) straight to attnscope's own processor.
  Attribute values are already bounded by attnscope (strings to 256 characters, sequences to 64).

Both take the span name through :func:`span_name`: always a ``str`` of at most 128 characters. One
span an exporter cannot encode (a name that is not a string) would fail its whole batch.

Every span handed to attnscope's own export pipeline is counted here, as it is handed
(``Delivery.to_export``, ``stats()["spans_to_export"]``): call spans, kernel and operator child
spans, step and request spans alike. The pipeline counts the same spans as they end
(``exported``, ``export_failed``, ``export_dropped``, ``export_in_flight``), so the two sides agree
span for span (docs/sampling.md); ``emitted`` counts call spans only (one per capture).
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, StaticSampler
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

from .._export.destinations import config_attributes
from .._export.ids import Ids
from .._record.capture import MAX_NAME, MAX_VALUE, ErrorInfo
from .._runtime import runtime

__all__ = ["Emitter", "SdkEmitter", "DirectEmitter", "NowhereEmitter", "OpenSpan",
           "for_pipeline", "error_status", "span_name"]

MAX_STRING = MAX_VALUE  # attribute string values and status descriptions
_INTERNAL = SpanKind.INTERNAL
_EMPTY = Context()
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_DEFAULT = TraceFlags(TraceFlags.DEFAULT)
_UNSET = Status(StatusCode.UNSET)  # immutable: one for every span without an error


def error_status(err: ErrorInfo) -> Status:
    return Status(StatusCode.ERROR,
                  f"{err.type_name.rpartition('.')[2]}: {err.message}"[:MAX_STRING])


def span_name(name: Any) -> str:
    """``name`` as a span name: a ``str`` (anything else through ``str()``), at most ``MAX_NAME``
    characters, never empty."""
    if type(name) is not str:
        try:
            name = str(name)
        except Exception:
            name = ""
    return name[:MAX_NAME] or "attnscope.span"


def _parent_context(parent: SpanContext | None) -> Context:
    return otel_trace.set_span_in_context(NonRecordingSpan(parent), _EMPTY) if parent else _EMPTY


class Emitter:
    """``emit`` one finished span; returns its context (for children), or None if not recorded."""

    def emit(self, name: str, parent: SpanContext | None, attrs: dict[str, Any], start_ns: int,
             end_ns: int, links: Sequence[Link] | None = None,
             error: ErrorInfo | None = None) -> SpanContext | None:
        raise NotImplementedError

    def context_with(self, trace_id: int, span_id: int, name: str,
                     parent: SpanContext | None) -> SpanContext:
        """The context a span with these ids would have (a step's spans, docs/live.md): sampled,
        unless the provider's sampler (when attnscope asks it) says otherwise."""
        return SpanContext(trace_id, span_id, is_remote=True, trace_flags=_SAMPLED)

    def open_span(self, ctx: SpanContext, name: str, parent: SpanContext | None,
                  attrs: dict[str, Any], start_ns: int) -> OpenSpan | None:
        """A span whose children are emitted before it ends; None when this emitter cannot make
        one with ``ctx``'s trace id (no parent to take it from) or makes none at all."""
        return None


class OpenSpan:
    """A span that ends later (:meth:`close`); ``context`` is what its children hang under."""

    def __init__(self, context: SpanContext, close: Any) -> None:
        self.context = context
        self._close = close

    def close(self, start_ns: int, end_ns: int, attrs: dict[str, Any] | None = None) -> None:
        """End the span; ``attrs``: attributes known only now, added to those it opened with."""
        self._close(start_ns, end_ns, attrs or {})


def _count_handed(delivery: Any) -> None:
    """One span handed to attnscope's own pipeline (its processor counts the same span)."""
    with delivery.lock:  # retiring and new workers may emit at once
        delivery.to_export += 1


class SdkEmitter(Emitter):
    """Through ``tracer.start_span``: the application's provider, its sampler and processors.

    ``delivery``: given when the provider is attnscope's own, with its counting processor (its
    sampled spans are counted as handed to it)."""

    def __init__(self, tracer: Any, delivery: Any = None) -> None:
        self.tracer = tracer
        self.delivery = delivery

    def emit(self, name: str, parent: SpanContext | None, attrs: dict[str, Any], start_ns: int,
             end_ns: int, links: Sequence[Link] | None = None,
             error: ErrorInfo | None = None) -> SpanContext | None:
        span = self.tracer.start_span(span_name(name), context=_parent_context(parent),
                                      kind=_INTERNAL, attributes=attrs, start_time=start_ns,
                                      links=links)
        if error is not None:
            span.add_event("exception", _exception_attributes(error), timestamp=end_ns)
            span.set_status(error_status(error))
        sc: SpanContext = span.get_span_context()
        if self.delivery is not None and span.is_recording() and sc.trace_flags.sampled:
            _count_handed(self.delivery)
        span.end(end_time=end_ns)
        return sc

    def open_span(self, ctx: SpanContext, name: str, parent: SpanContext | None,
                  attrs: dict[str, Any], start_ns: int) -> OpenSpan | None:
        """A running span of the application's tracer (it picks the span id: ``ctx``'s trace id
        comes from ``parent``; without one there is no way to ask for it)."""
        if parent is None:
            return None
        span = self.tracer.start_span(span_name(name), context=_parent_context(parent),
                                      kind=_INTERNAL, attributes=attrs, start_time=start_ns)

        def close(start: int, end_ns: int, more: dict[str, Any]) -> None:
            if more:
                span.set_attributes(more)
            if self.delivery is not None and span.is_recording() \
                    and span.get_span_context().trace_flags.sampled:
                _count_handed(self.delivery)
            span.end(end_time=end_ns)

        return OpenSpan(span.get_span_context(), close)


class NowhereEmitter(Emitter):
    """No pipeline could be built: each span is counted as handed on and lost
    (``stats()["export_dropped"]``)."""

    def __init__(self, delivery: Any) -> None:
        self.delivery = delivery

    def emit(self, name: str, parent: SpanContext | None, attrs: dict[str, Any], start_ns: int,
             end_ns: int, links: Sequence[Link] | None = None,
             error: ErrorInfo | None = None) -> SpanContext | None:
        with self.delivery.lock:
            self.delivery.to_export += 1
            self.delivery.no_pipeline += 1
        return None


class DirectEmitter(Emitter):
    """Finished ``ReadableSpan``s straight to the processor of a provider attnscope owns."""

    def __init__(self, provider: Any, processor: Any, scope_name: str, version: str,
                 delivery: Any) -> None:
        self.delivery = delivery
        self.sampler = provider.sampler
        self.ids = provider.id_generator
        self.resource = provider.resource
        # The resource states the settings in force (attnscope.config.*), but configure() changes
        # them without building a new provider: each span takes the resource of the configuration
        # in force when it is emitted (one new Resource per change, not per span).
        self._built_resource = provider.resource
        self._resource_cfg: Any = runtime.config.current
        self.processor = processor
        self.scope = InstrumentationScope(scope_name, version)
        # the SDK's own fixed-decision samplers, asked here once per kind of parent (else per span)
        self._fixed = _fixed_decisions(self.sampler)
        # attnscope's own generator (export.ids), its draw made here (two Python calls a span
        # fewer); any other (the SDK's, the application's own) is asked per span
        self._bits = self.ids.bits if type(self.ids) is Ids else None

    def emit(self, name: str, parent: SpanContext | None, attrs: dict[str, Any], start_ns: int,
             end_ns: int, links: Sequence[Link] | None = None,
             error: ErrorInfo | None = None) -> SpanContext | None:
        name = span_name(name)
        ids, bits = self.ids, self._bits
        # export.ids' draws, from the same generator (0 is no id: its own loop draws again)
        if parent is not None:
            trace_id = parent.trace_id
        else:
            trace_id = (bits is not None and bits(128)) or ids.generate_trace_id()
        links = links or ()
        fixed = self._fixed
        if fixed is not None:
            sampled, recording, trace_state = _decide(fixed, parent)
        else:
            result = self.sampler.should_sample(_parent_context(parent), trace_id, name,
                                                _INTERNAL, attrs, links)
            sampled = result.decision.is_sampled()
            recording = result.decision.is_recording()
            trace_state = result.trace_state
            if recording and result.attributes and result.attributes is not attrs:
                attrs = {**attrs, **result.attributes}
        span_id = (bits is not None and bits(64)) or ids.generate_span_id()
        sc = SpanContext(trace_id, span_id, is_remote=False,
                         trace_flags=_SAMPLED if sampled else _DEFAULT, trace_state=trace_state)
        if not recording:
            return sc
        self._end(sc, name, parent, attrs, start_ns, end_ns, links, error)
        return sc

    def _end(self, sc: SpanContext, name: str, parent: SpanContext | None, attrs: dict[str, Any],
             start_ns: int, end_ns: int, links: Sequence[Link] = (),
             error: ErrorInfo | None = None) -> None:
        events: tuple[Event, ...] = ()
        status = _UNSET
        if error is not None:
            events = (_exception_event(error, end_ns),)
            status = error_status(error)
        if sc.trace_flags.sampled:  # the batch processor takes (and counts) sampled spans only
            _count_handed(self.delivery)
        if runtime.config.current is not self._resource_cfg:
            self._follow_config()
        self.processor.on_end(ReadableSpan(
            name=name, context=sc, parent=parent, resource=self.resource, attributes=attrs,
            events=events, links=_bounded_links(links) if links else links, kind=_INTERNAL,
            status=status, start_time=start_ns,
            end_time=end_ns, instrumentation_scope=self.scope))

    def _follow_config(self) -> None:
        """The resource for the configuration in force: the built one while its settings are
        unchanged (one Jaeger process), else the built one with the settings of now."""
        cfg = self._resource_cfg = runtime.config.current
        built = self._built_resource
        if cfg is None or not isinstance(built, Resource):
            return
        now = config_attributes(cfg)
        if all(built.attributes.get(k) == v for k, v in now.items()):
            self.resource = built
        elif any(self.resource.attributes.get(k) != v for k, v in now.items()):
            self.resource = built.merge(Resource(now, built.schema_url))

    def context_with(self, trace_id: int, span_id: int, name: str,
                     parent: SpanContext | None) -> SpanContext:
        """These ids, with the provider's sampler's decision (a ratio sampler decides on the trace
        id: the same on every rank)."""
        result = self.sampler.should_sample(_parent_context(parent), trace_id, span_name(name),
                                            _INTERNAL)
        flags = TraceFlags.SAMPLED if result.decision.is_sampled() else TraceFlags.DEFAULT
        return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags),
                           trace_state=result.trace_state)

    def open_span(self, ctx: SpanContext, name: str, parent: SpanContext | None,
                  attrs: dict[str, Any], start_ns: int) -> OpenSpan | None:
        """A span with exactly ``ctx`` (ids chosen by the caller), handed to the processor when
        it is closed, with the times given then."""
        name = span_name(name)

        def close(start: int, end_ns: int, more: dict[str, Any]) -> None:
            if ctx.trace_flags.sampled:
                self._end(ctx, name, parent, {**attrs, **more} if more else attrs, start, end_ns)

        return OpenSpan(ctx, close)


def _exception_attributes(err: ErrorInfo) -> dict[str, str]:
    """The attributes ``Span.record_exception(escaped=True)`` records, message and trace capped."""
    return {"exception.type": err.type_name, "exception.message": err.message,
            "exception.stacktrace": err.stacktrace(), "exception.escaped": "True"}


def _exception_event(err: ErrorInfo, timestamp: int) -> Event:
    # attributes held as the SDK's own spans hold them: the OTLP encoder of SDKs before 1.26
    # reads an event's and a link's dropped count from them (a plain dict failed the whole batch)
    return Event("exception", BoundedAttributes(attributes=_exception_attributes(err)),
                 timestamp=timestamp)


def _bounded_links(links: Sequence[Link]) -> tuple[Link, ...]:
    """``links`` with their attributes held as the SDK's own spans hold them (above)."""
    return tuple(link if isinstance(link.attributes, BoundedAttributes)
                 else Link(link.context, BoundedAttributes(attributes=link.attributes))
                 for link in links)


# (root, remote parent sampled, remote parent not sampled, local parent sampled, local not sampled)
_Fixed = tuple[tuple[bool, bool], ...]

# One parent of each kind _decide tells apart, in _Fixed's order (None: no parent). Their trace
# state is one object, so a sampler that passes on its parent's shows it by returning this one.
_PROBE_STATE = TraceState([("attnscope", "probe")])
_PROBE_PARENTS: tuple[SpanContext | None, ...] = (None, *(
    SpanContext(1, 1, is_remote=remote, trace_flags=flags, trace_state=_PROBE_STATE)
    for remote in (True, False) for flags in (_SAMPLED, _DEFAULT)))


@functools.cache
def _fixed_descriptions() -> frozenset[str]:
    """What ``get_description()`` says for a ``ParentBased`` whose five delegates are each
    ``ALWAYS_ON`` or ``ALWAYS_OFF`` (the SDK's own words, whatever its release makes of them)."""
    return frozenset(ParentBased(*delegates).get_description()  # type: ignore[no-untyped-call]
                     for delegates in itertools.product((ALWAYS_ON, ALWAYS_OFF), repeat=5))


def _is_fixed(sampler: Any) -> bool:
    """Whether ``sampler``'s decision depends on nothing but the kind of parent: exactly the SDK's
    ``StaticSampler``, or exactly its ``ParentBased`` over static samplers only (told by the
    public description; its delegates are not public)."""
    if type(sampler) is StaticSampler:
        return True
    if type(sampler) is not ParentBased:
        return False
    try:
        return sampler.get_description() in _fixed_descriptions()  # type: ignore[no-untyped-call]
    except Exception:
        return False


def _fixed_decisions(sampler: Any) -> _Fixed | None:
    """(sampled, recording) per kind of parent when ``sampler`` is one of the SDK's samplers
    whose decision is fixed (``ALWAYS_ON``/``ALWAYS_OFF``, the default ``ParentBased`` over
    them): its own ``should_sample`` asked once per kind of parent, so spans need not ask it.
    Anything else (a ratio, a subclass, the application's own), or an answer that does not pass
    the parent's trace state on as :func:`_decide` would: None, asked per span."""
    if not _is_fixed(sampler):
        return None
    found = []
    for parent in _PROBE_PARENTS:
        try:
            result = sampler.should_sample(_parent_context(parent), 1, "attnscope.probe",
                                           _INTERNAL)
        except Exception:
            return None
        if result.trace_state is not (parent.trace_state if parent is not None else None):
            return None
        found.append((result.decision.is_sampled(), result.decision.is_recording()))
    return tuple(found)


def _decide(fixed: _Fixed, parent: SpanContext | None) -> tuple[bool, bool, Any]:
    """``ParentBased.should_sample`` over fixed samplers: the delegate by the parent's remote and
    sampled flags; a fixed sampler passes on a valid parent's trace state."""
    if parent is None or not parent.is_valid:
        return (*fixed[0], None)
    index = (1 if parent.is_remote else 3) + (0 if parent.trace_flags.sampled else 1)
    return (*fixed[index], parent.trace_state)


def for_pipeline(pipeline: Any, scope_name: str, version: str) -> Emitter:
    """The direct path for a provider attnscope owns and exports from, else the SDK's."""
    processor = getattr(pipeline, "processor", None)
    provider = pipeline.provider
    counted = pipeline.owned and processor is not None  # attnscope's counting processor
    if counted and all(hasattr(provider, a) for a in ("sampler", "id_generator", "resource")):
        return DirectEmitter(provider, processor, scope_name, version, pipeline.delivery)
    return SdkEmitter(pipeline.tracer, pipeline.delivery if counted else None)
