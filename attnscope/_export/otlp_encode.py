"""OTLP trace requests in protobuf bytes, each attribute's bytes kept: the SDK's encoding, faster.

The SDK's encoder builds a protobuf message per attribute (a ``KeyValue`` and an ``AnyValue``,
through four Python calls): ~70 µs for one of attnscope's spans of ~30 attributes, on the export
thread, holding the GIL the application needs. With every call traced that was more than the
worker's whole span building, and the batch processor pays it 512 spans at a time (tens of
milliseconds in one go: a user's slow requests). attnscope's spans of one shape and site repeat
almost every attribute, so this encoder writes the request's wire bytes itself and keeps the
bytes of each (key, value) it has written (:mod:`.kept`).

It must produce what the installed SDK's ``encode_spans`` produces, byte for byte: an
:class:`Encoder` is used only after :func:`matches_sdk` found the two equal on probe spans that
use every field and value type it writes, in the variant the installed release writes
(:data:`VARIANTS`: releases differ). Any span it cannot write exactly (a value of a type
OpenTelemetry's attributes do not allow, an int beyond 64 bits, text that is not UTF-8) makes it
return None for the whole request, and the SDK's encoder is used for it.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from opentelemetry.trace import SpanKind

from .kept import Kept

__all__ = ["VARIANTS", "Encoder", "Unencodable", "dropped", "first_variant", "groups",
           "matches_sdk", "probe_spans"]

T = TypeVar("T")

_pack_d = struct.Struct("<d").pack
_pack_q = struct.Struct("<Q").pack
_pack_i = struct.Struct("<I").pack
_FLAGS_HAS_IS_REMOTE, _FLAGS_IS_REMOTE = 0x100, 0x200
# (flags, scope_schema) of :class:`Encoder`, the newest SDKs' first: one of them is the installed's
VARIANTS = ((True, True), (False, True), (True, False), (False, False))
# the span's kind field per API SpanKind (its value + 1: OTLP's 0 is "unspecified")
_KIND_FIELD = {kind: b"\x30" + bytes((kind.value + 1,)) for kind in SpanKind}
# the span's flags field (fixed32 16): the parent's remote flag is known, and whether it is set
_LOCAL_FLAGS = b"\x85\x01" + _pack_i(_FLAGS_HAS_IS_REMOTE)
_REMOTE_FLAGS = b"\x85\x01" + _pack_i(_FLAGS_HAS_IS_REMOTE | _FLAGS_IS_REMOTE)


class Unencodable(Exception):
    """A value this encoder does not write exactly as the SDK does: the SDK's encoder is used."""


def _varint(n: int) -> bytes:
    if n < 0x80:
        return bytes((n,))
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _len(tag: bytes, payload: bytes) -> bytes:
    """A length-delimited field."""
    n = len(payload)
    return tag + (bytes((n,)) if n < 0x80 else _varint(n)) + payload


def _int64(n: int) -> bytes:
    if not -(1 << 63) <= n < (1 << 63):
        raise Unencodable("int beyond 64 bits")
    return _varint(n & 0xFFFFFFFFFFFFFFFF)


def _value(value: Any, top: bool = True) -> bytes:
    """An ``AnyValue`` message's bytes, as the SDK's ``_encode_value`` makes it, for the value
    types OpenTelemetry's attributes allow: str, bool, int, float and a sequence of them. Anything
    else (None, bytes, a mapping, a nested sequence), which the SDK's releases encode differently
    (or drop), is left to the SDK's encoder."""
    if isinstance(value, bool):
        return b"\x10\x01" if value else b"\x10\x00"
    if isinstance(value, str):
        return _len(b"\x0a", value.encode())
    if isinstance(value, int):
        return b"\x18" + _int64(value)
    if isinstance(value, float):
        return b"\x21" + _pack_d(value)
    if top and isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        return _len(b"\x2a", b"".join([_len(b"\x0a", _value(v, False)) for v in value]))
    raise Unencodable(f"a value of type {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    """A ``KeyValue`` message's bytes (the value always present, as the SDK sets it)."""
    return (_len(b"\x0a", key.encode()) if key else b"") + _len(b"\x12", _value(value))


def _attribute_field(key: str, value: Any) -> bytes:
    """A span's ``attributes`` field (9) holding one ``KeyValue``."""
    return _len(b"\x4a", _key_value(key, value))


def _attributes(tag: bytes, attributes: Any) -> bytes:
    if not attributes:
        return b""
    return b"".join([_len(tag, _key_value(k, v)) for k, v in attributes.items()])


class Encoder:
    """Writes ``ExportTraceServiceRequest`` bytes for a batch of ``ReadableSpan``s.

    ``flags``, ``scope_schema``: whether the installed SDK writes the span and link ``flags``
    field, and a scope's schema URL in its ``ScopeSpans`` (releases differ: 1.24 writes neither,
    1.45 both; :data:`VARIANTS`). Shared by the exporters: its kept encodings change by single
    dict operations, so two export threads at once at worst write one encoding twice."""

    def __init__(self, flags: bool = True, scope_schema: bool = True) -> None:
        self.flags = flags
        self.scope_schema = scope_schema
        self._kept = Kept(_attribute_field)  # one attribute's field bytes
        self._held: dict[int, tuple[Any, bytes]] = {}  # resource / scope -> its message bytes

    def encode(self, spans: Sequence[Any]) -> bytes | None:
        """The request's bytes; None when a span holds something only the SDK writes exactly."""
        try:
            return self._request(spans)
        # (a span of a shape it does not know, too: the probe finds a systematic one)
        except (Unencodable, UnicodeEncodeError, struct.error, OverflowError, ValueError,
                AttributeError, TypeError):
            return None

    def _request(self, spans: Sequence[Any]) -> bytes:
        out = []
        span_bytes = self._span
        for resource, by_scope in groups(spans):
            parts = [_len(b"\x0a", self._resource(resource))]
            for scope, members in by_scope:
                body = (_len(b"\x0a", self._scope(scope))
                        + b"".join([_len(b"\x12", span_bytes(span)) for span in members]))
                if self.scope_schema and scope is not None and scope.schema_url:
                    body += _len(b"\x1a", scope.schema_url.encode())
                parts.append(_len(b"\x12", body))
            if resource.schema_url:
                parts.append(_len(b"\x1a", resource.schema_url.encode()))
            out.append(_len(b"\x0a", b"".join(parts)))
        return b"".join(out)

    def _resource(self, resource: Any) -> bytes:
        held = self._held.get(id(resource))
        if held is None or held[0] is not resource:
            held = self._keep(resource, _attributes(b"\x0a", resource.attributes))
        return held[1]

    def _scope(self, scope: Any) -> bytes:
        if scope is None:
            return b""
        held = self._held.get(id(scope))
        if held is None or held[0] is not scope:
            held = self._keep(scope, (_len(b"\x0a", scope.name.encode()) if scope.name else b"")
                              + (_len(b"\x12", scope.version.encode()) if scope.version else b"")
                              + _attributes(b"\x1a", getattr(scope, "attributes", None)))
        return held[1]

    def _keep(self, obj: Any, encoded: bytes) -> tuple[Any, bytes]:
        if len(self._held) >= 64:
            self._held.clear()
        held = self._held[id(obj)] = (obj, encoded)
        return held

    def _span(self, span: Any) -> bytes:
        ctx = span.context
        parent = span.parent
        parts = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"),
                 b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
        state = ctx.trace_state
        if state:
            parts.append(_len(b"\x1a", ",".join([f"{k}={v}" for k, v in state.items()]).encode()))
        if parent is not None:
            parts.append(b"\x22\x08")
            parts.append(parent.span_id.to_bytes(8, "big"))
        name = span.name
        if name:
            parts.append(_len(b"\x2a", name.encode()))
        parts.append(_KIND_FIELD[span.kind])
        start, end = span.start_time, span.end_time
        if start:
            parts.append(b"\x39" + _pack_q(start))
        if end:
            parts.append(b"\x41" + _pack_q(end))
        attributes = span.attributes
        if attributes:
            parts.extend(self._kept.encode(attributes))
            if span.dropped_attributes:
                parts.append(b"\x50" + _varint(span.dropped_attributes))
        events = span.events
        if events:
            parts.extend([_len(b"\x5a", self._event(event)) for event in events])
            if span.dropped_events:
                parts.append(b"\x60" + _varint(span.dropped_events))
        links = span.links
        if links:
            parts.extend([_len(b"\x6a", self._link(link)) for link in links])
            if span.dropped_links:
                parts.append(b"\x70" + _varint(span.dropped_links))
        parts.append(self._status(span.status))
        if self.flags:
            parts.append(_REMOTE_FLAGS if parent is not None and parent.is_remote
                         else _LOCAL_FLAGS)
        return b"".join(parts)

    def _status(self, status: Any) -> bytes:
        """The status field's bytes, kept per status object (one for every span without an
        error: the API's ``Status`` cannot be changed once made)."""
        held = self._held.get(id(status))
        if held is None or held[0] is not status:
            held = self._keep(status, _len(b"\x7a", _status(status)))
        return held[1]

    @staticmethod
    def _event(event: Any) -> bytes:
        return ((b"\x09" + _pack_q(event.timestamp) if event.timestamp else b"")
                + (_len(b"\x12", event.name.encode()) if event.name else b"")
                + _attributes(b"\x1a", event.attributes)
                + (b"\x20" + _varint(dropped(event)) if dropped(event)
                   else b""))

    def _link(self, link: Any) -> bytes:
        ctx = link.context
        flags = _FLAGS_HAS_IS_REMOTE | (_FLAGS_IS_REMOTE if ctx.is_remote else 0)
        encoded: bytes = (b"\x0a\x10" + ctx.trace_id.to_bytes(16, "big")
                          + b"\x12\x08" + ctx.span_id.to_bytes(8, "big")
                          + _attributes(b"\x22", link.attributes)
                          + (b"\x28" + _varint(dropped(link)) if dropped(link) else b"")
                          + (b"\x35" + _pack_i(flags) if self.flags else b""))
        return encoded


def dropped(obj: Any) -> int:
    """The attributes an event or a link dropped: its own count, or (SDKs before 1.26, whose
    encoder reads it there) its attributes' count; 0 for plain attributes."""
    found: Any = getattr(obj, "dropped_attributes", None)
    if found is None:
        found = getattr(obj.attributes, "dropped", 0)
    return int(found)


def _status(status: Any) -> bytes:
    if status is None:
        return b""
    message = status.description
    code = status.status_code.value
    return ((_len(b"\x12", message.encode()) if message else b"")
            + (b"\x18" + _varint(code) if code else b""))


def groups(spans: Sequence[Any]) -> list[tuple[Any, list[tuple[Any, list[Any]]]]]:
    """``spans`` by resource, then by instrumentation scope, as the SDK's encoder groups them:
    by equality, in order of first sight, spans in their order. Equal objects are found once per
    object, not by hashing per span (a ``Resource``'s hash is a JSON dump of its attributes: a
    sixth of this encoder's time when done per span)."""
    equal: dict[Any, Any] = {}
    first: dict[int, Any] = {}  # id -> the first object equal to it (the spans hold them)
    grouped: dict[int, dict[int, list[Any]]] = {}
    for span in spans:
        resource, scope = span.resource, span.instrumentation_scope or None
        r = first.get(id(resource))
        if r is None:
            r = first[id(resource)] = equal.setdefault(resource, resource)
        s = first.get(id(scope))
        if s is None:
            s = first[id(scope)] = equal.setdefault(("scope", scope), scope)
        by_scope = grouped.get(id(r))
        if by_scope is None:
            by_scope = grouped[id(r)] = {}
        found = by_scope.get(id(s))
        if found is None:
            found = by_scope[id(s)] = []
        found.append(span)
    return [(first[r], [(first[s], members) for s, members in by_scope.items()])
            for r, by_scope in grouped.items()]


def first_variant(make: Callable[[bool, bool], T], matches: Callable[[T], bool]) -> T | None:
    """``make(flags, scope_schema)`` for the first of :data:`VARIANTS` whose result ``matches``
    (writes what the installed SDK writes), else None."""
    for variant in VARIANTS:
        candidate = make(*variant)
        if matches(candidate):
            return candidate
    return None


def probe_spans() -> list[Any]:
    """Spans using every field :class:`Encoder` writes (parents remote and local, trace state,
    events, links, an error status, each value type), for :func:`matches_sdk`."""
    from opentelemetry.attributes import BoundedAttributes
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import Event, ReadableSpan
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    from opentelemetry.trace import (
        Link,
        SpanContext,
        SpanKind,
        Status,
        StatusCode,
        TraceFlags,
        TraceState,
    )

    # events' and links' attributes as the SDK's own spans hold them (an SDK before 1.26 reads
    # their dropped count there)
    def bounded(attributes: dict[str, Any]) -> Any:
        return BoundedAttributes(attributes=attributes)

    state = TraceState([("k", "v"), ("attnscope", "probe")])
    local = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(1), trace_state=state)
    remote = SpanContext(3, 4, is_remote=True, trace_flags=TraceFlags(1))
    values: dict[str, Any] = {
        "s": "text", "e": "", "é": "ünï", "i": 7, "z": 0, "n": -3, "big": 1 << 62,
        "min": -(1 << 63), "t": True, "f": False, "x": 1.5, "nz": -0.0, "inf": float("inf"),
        "ints": (1, 2), "strs": ["a", ""], "flts": (0.5,), "bools": (True,), "empty": ()}
    resource = Resource({"service.name": "probe", "n": 1}, "https://schema")
    scope = InstrumentationScope("attnscope", "1.0", "https://scope")
    spans = []
    for i, parent in enumerate((None, local, remote)):
        spans.append(ReadableSpan(
            name=f"probe.{i}", context=SpanContext(5, 6 + i, is_remote=False,
                                                   trace_flags=TraceFlags(1),
                                                   trace_state=state if i else None),
            parent=parent, resource=resource, attributes=values if i != 1 else {},
            events=(Event("exception", bounded({"exception.type": "E"}), timestamp=9),) if i
            else (),
            links=(Link(remote, bounded({"a": 1})), Link(local, bounded({}))) if i == 2 else (),
            kind=(SpanKind.INTERNAL, SpanKind.SERVER, SpanKind.CLIENT)[i],
            status=(Status(), Status(StatusCode.ERROR, "E: boom"), Status(StatusCode.OK))[i],
            start_time=10 + i, end_time=20 + i, instrumentation_scope=scope if i != 2 else None))
    return spans


def matches_sdk(encoder: Encoder) -> bool:
    """Whether ``encoder`` writes the probe spans exactly as the installed SDK's encoder does."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    spans = probe_spans()
    return bool(encoder.encode(spans) == encode_spans(spans).SerializeToString())
