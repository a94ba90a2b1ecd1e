"""OTLP/JSON text of spans written directly, each attribute's text kept: the exporter's line,
faster.

:mod:`.otlp_json` writes one ``ExportTraceServiceRequest`` per line: the SDK's ``encode_spans``,
then protobuf's ``json_format.MessageToDict``, then the ids turned to hex. That cost ~300 µs of
the export thread's CPU per span of ~30 attributes, most of it holding the GIL: with every call
of a tiny Llama's ``generate()`` traced, 1.61x its plain time on average. This writes the same
JSON text directly, fields in the order ``MessageToDict`` gives them (by field number), keeping
the text of each (key, value) it has written (:mod:`.kept`).

It is used only after :func:`matches_reference` found its line equal to the reference's on the
probe spans of :mod:`.otlp_encode` (in the variant the installed SDK writes). Any span it cannot
write exactly makes it return None for the whole line, which is then made the reference way.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Sequence
from typing import Any

from .kept import Kept
from .otlp_encode import Unencodable, dropped, groups

__all__ = ["JsonEncoder", "matches_reference"]

_dumps = json.dumps  # ensure_ascii, as the reference's json.dumps: the same escapes
_INT64 = range(-(1 << 63), 1 << 63)
_HAS_IS_REMOTE, _IS_REMOTE = 0x100, 0x200


def _double(value: float) -> str:
    if math.isnan(value):
        return '"NaN"'
    if math.isinf(value):
        return '"Infinity"' if value > 0 else '"-Infinity"'
    return float.__repr__(value)


def _value(value: Any, top: bool = True) -> str:
    """An ``AnyValue``'s JSON, as ``MessageToDict`` makes it (64-bit ints as strings), for the
    value types :func:`.otlp_encode._value` writes; anything else is left to the reference."""
    if isinstance(value, bool):
        return '{"boolValue":true}' if value else '{"boolValue":false}'
    if isinstance(value, str):
        return '{"stringValue":' + _dumps(value) + "}"
    if isinstance(value, int):
        if value not in _INT64:
            raise Unencodable("int beyond 64 bits")
        return '{"intValue":"' + str(int(value)) + '"}'
    if isinstance(value, float):
        return '{"doubleValue":' + _double(value) + "}"
    if top and isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        if not value:
            return '{"arrayValue":{}}'
        return ('{"arrayValue":{"values":[' + ",".join([_value(v, False) for v in value])
                + "]}}")
    raise Unencodable(f"a value of type {type(value).__name__}")


def _key_value(key: str, value: Any) -> str:
    return ('{"key":' + _dumps(key) + ',"value":' if key else '{"value":') + _value(value) + "}"


def _attributes(attributes: Any) -> str:
    """``"attributes":[...]`` and a comma before it, or nothing when there are none."""
    if not attributes:
        return ""
    return ',"attributes":[' + ",".join([_key_value(k, v) for k, v in attributes.items()]) + "]"


def _fields(*pairs: tuple[str, str | None]) -> str:
    """``{"name":text,...}`` of the pairs whose text is not None."""
    return "{" + ",".join([f'"{name}":{text}' for name, text in pairs if text is not None]) + "}"


class JsonEncoder:
    """One line of OTLP/JSON (an ``ExportTraceServiceRequest``, ids in hex, enums as numbers).

    ``flags``, ``scope_schema``: as for :class:`.otlp_encode.Encoder`."""

    def __init__(self, flags: bool = True, scope_schema: bool = True) -> None:
        self.flags = flags
        self.scope_schema = scope_schema
        self._kept = Kept(_key_value)  # one attribute's text

    def line(self, spans: Sequence[Any]) -> str | None:
        """The line, newline-terminated; None when a span holds something only the reference
        path writes exactly."""
        try:
            return self._request(spans) + "\n"
        # (a span of a shape it does not know, too: the probe finds a systematic one)
        except (Unencodable, OverflowError, ValueError, AttributeError, TypeError):
            return None

    def _request(self, spans: Sequence[Any]) -> str:
        out = []
        for resource, by_scope in groups(spans):
            scopes = []
            for scope, members in by_scope:
                scopes.append(_fields(
                    ("scope", _scope(scope)),
                    ("spans", "[" + ",".join([self._span(s) for s in members]) + "]"),
                    ("schemaUrl", _dumps(scope.schema_url)
                     if self.scope_schema and scope is not None and scope.schema_url
                     else None)))
            out.append(_fields(
                ("resource", _joined("{}", _attributes(resource.attributes))),
                ("scopeSpans", "[" + ",".join(scopes) + "]"),
                ("schemaUrl", _dumps(resource.schema_url) if resource.schema_url else None)))
        return '{"resourceSpans":[' + ",".join(out) + "]}"

    def _span(self, span: Any) -> str:
        ctx = span.context
        parent = span.parent
        parts = ['{"traceId":"', f"{ctx.trace_id:032x}", '","spanId":"', f"{ctx.span_id:016x}",
                 '"']
        state = ctx.trace_state
        if state:
            parts.append(',"traceState":' + _dumps(",".join([f"{k}={v}"
                                                             for k, v in state.items()])))
        if parent is not None:
            parts.append(f',"parentSpanId":"{parent.span_id:016x}"')
        if span.name:
            parts.append(',"name":' + _dumps(span.name))
        parts.append(f',"kind":{span.kind.value + 1}')
        if span.start_time:
            parts.append(f',"startTimeUnixNano":"{span.start_time}"')
        if span.end_time:
            parts.append(f',"endTimeUnixNano":"{span.end_time}"')
        attributes = span.attributes
        if attributes:
            texts = self._kept.encode(attributes)
            parts.append(',"attributes":[' + ",".join(texts) + "]")
            if span.dropped_attributes:
                parts.append(f',"droppedAttributesCount":{span.dropped_attributes}')
        events = span.events
        if events:
            parts.append(',"events":[' + ",".join([_event(e) for e in events]) + "]")
            if span.dropped_events:
                parts.append(f',"droppedEventsCount":{span.dropped_events}')
        links = span.links
        if links:
            parts.append(',"links":[' + ",".join([self._link(link) for link in links]) + "]")
            if span.dropped_links:
                parts.append(f',"droppedLinksCount":{span.dropped_links}')
        parts.append(',"status":' + _status(span.status))
        if self.flags:
            remote = parent is not None and parent.is_remote
            parts.append(f',"flags":{_HAS_IS_REMOTE | (_IS_REMOTE if remote else 0)}')
        parts.append("}")
        return "".join(parts)

    def _link(self, link: Any) -> str:
        ctx = link.context
        text = (f'{{"traceId":"{ctx.trace_id:032x}","spanId":"{ctx.span_id:016x}"'
                + _attributes(link.attributes))
        if dropped(link):
            text += f',"droppedAttributesCount":{dropped(link)}'
        if self.flags:
            text += f',"flags":{_HAS_IS_REMOTE | (_IS_REMOTE if ctx.is_remote else 0)}'
        return text + "}"


def _joined(text: str, more: str) -> str:
    """``more`` (fields, each after a comma) added to the JSON object ``text``."""
    if not more:
        return text
    return text[:-1] + (more if text != "{}" else more[1:]) + "}"


def _scope(scope: Any) -> str:
    if scope is None:
        return "{}"
    return _joined(_fields(("name", _dumps(scope.name) if scope.name else None),
                           ("version", _dumps(scope.version) if scope.version else None)),
                   _attributes(getattr(scope, "attributes", None)))


def _event(event: Any) -> str:
    more = _attributes(event.attributes)
    if dropped(event):
        more += f',"droppedAttributesCount":{dropped(event)}'
    return _joined(_fields(("timeUnixNano", f'"{event.timestamp}"' if event.timestamp else None),
                           ("name", _dumps(event.name) if event.name else None)), more)


def _status(status: Any) -> str:
    if status is None:
        return "{}"
    code = status.status_code.value
    return _fields(("message", _dumps(status.description) if status.description else None),
                   ("code", str(code) if code else None))


def matches_reference(encoder: JsonEncoder, reference: Callable[[Sequence[Any]], str]) -> bool:
    """Whether ``encoder`` writes the probe spans' line exactly as ``reference`` does."""
    from .otlp_encode import probe_spans

    spans = probe_spans()
    return encoder.line(spans) == reference(spans)
