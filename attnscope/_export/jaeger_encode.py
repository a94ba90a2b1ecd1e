"""Jaeger JSON encoding of OpenTelemetry spans, for :mod:`attnscope._export.jaeger_json`.

Each span becomes the JSON text of one entry of a trace's ``spans``; each resource one entry of
its ``processes``. The text is built once per span, so rewriting a document only joins strings.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanKind, Status, StatusCode

from .kept import Kept

__all__ = ["EMPTY_DOCUMENT_BYTES", "TRACE_OVERHEAD_BYTES", "SpanWriter", "Trace", "document_chunks",
           "dumps", "parts_of_fields", "process_json", "span_fields_rest", "trace_chunks"]

_UNKNOWN_SERVICE = "unknown_service"
_UNNAMED = "(unnamed)"


# Compact output keeps files small. ensure_ascii (the default) makes len(text) equal the encoded
# byte count, which the size accounting relies on. allow_nan=False because the UI's JSON.parse
# rejects NaN/Infinity; _tag already turns non-finite floats into strings. One encoder, made
# once: json.dumps with these arguments makes a new one per call.
_encode = json.JSONEncoder(separators=(",", ":"), allow_nan=False).encode
_quote = json.encoder.encode_basestring_ascii  # a str as JSON, as that encoder writes it


def dumps(obj: object) -> str:
    return _encode(obj)


def _tag(key: str, value: object) -> dict[str, object]:
    """One Jaeger typed tag. Sequences become a JSON string, as Jaeger's own translator does."""
    if isinstance(value, bool):  # before int: bool is an int subclass
        return {"key": key, "type": "bool", "value": value}
    if isinstance(value, int):
        return {"key": key, "type": "int64", "value": value}
    if isinstance(value, float):
        if math.isfinite(value):
            return {"key": key, "type": "float64", "value": value}
        return {"key": key, "type": "string", "value": repr(value)}
    if isinstance(value, str):
        return {"key": key, "type": "string", "value": value}
    if isinstance(value, (list, tuple)):
        # The list lives inside a string, so NaN in it cannot break the outer document.
        return {"key": key, "type": "string", "value": json.dumps(list(value), default=str)}
    return {"key": key, "type": "string", "value": str(value)}


def process_json(resource: Resource, service_name: str | None) -> str:
    attrs = resource.attributes
    if service_name is None:
        service_name = str(attrs.get("service.name", ""))
    # The UI rejects the whole file if any process has an empty serviceName.
    service_name = service_name or _UNKNOWN_SERVICE
    tags = [_tag(k, v) for k, v in attrs.items() if k != "service.name"]
    return dumps({"serviceName": service_name, "tags": tags})


def _references(span: ReadableSpan) -> list[dict[str, str]]:
    # The UI takes the first reference as the parent, so the parent goes first.
    refs = [(span.parent, "CHILD_OF")] if span.parent is not None else []
    refs += [(link.context, "FOLLOWS_FROM") for link in span.links]
    return [{"refType": kind, "traceID": f"{ctx.trace_id:032x}", "spanID": f"{ctx.span_id:016x}"}
            for ctx, kind in refs]


def _scope_tags(scope: InstrumentationScope | None) -> list[dict[str, object]]:
    if scope is None:
        return []
    tags = [_tag("otel.scope.name", scope.name)]
    if scope.version:
        tags.append(_tag("otel.scope.version", scope.version))
    return tags


def _kind_tags(kind: SpanKind) -> list[dict[str, object]]:
    return [_tag("span.kind", kind.name.lower())]


def _status_tags(status: Status) -> list[dict[str, object]]:
    if status.status_code is StatusCode.ERROR:
        tags = [_tag("otel.status_code", "ERROR"), _tag("error", True)]
        if status.description:
            tags.append(_tag("otel.status_description", status.description))
        return tags
    if status.status_code is StatusCode.OK:
        return [_tag("otel.status_code", "OK")]
    return []


def span_fields_rest(span: ReadableSpan) -> dict[str, object]:
    """The span's ``logs`` and ``warnings``."""
    logs = [
        {
            "timestamp": event.timestamp // 1000,
            "fields": [_tag("event", event.name)]
            + [_tag(k, v) for k, v in (event.attributes or {}).items()],
        }
        for event in span.events
    ]
    warnings = [
        f"{count} {what} dropped by the SDK's span limits"
        for count, what in (
            (span.dropped_attributes, "attributes"),
            (span.dropped_events, "events"),
            (span.dropped_links, "links"),
        )
        if count
    ]
    return {"logs": logs, "warnings": warnings or None}


# (tags of a part, the part of a span): the tags after the attributes, kept per part object
_FIXED_TAGS: tuple[tuple[Callable[[Any], list[dict[str, object]]], Callable[[Any], Any]], ...] = (
    (_scope_tags, lambda span: span.instrumentation_scope),
    (_kind_tags, lambda span: span.kind),
    (_status_tags, lambda span: span.status))


def _tag_text(key: str, value: object) -> str:
    """``dumps(_tag(key, value))``, written directly for the usual types."""
    if type(key) is str:
        if isinstance(value, str) and type(value) is str:
            return '{"key":' + _quote(key) + ',"type":"string","value":' + _quote(value) + "}"
        if isinstance(value, int) and type(value) is int:
            return '{"key":' + _quote(key) + ',"type":"int64","value":' + int.__repr__(value) + "}"
        if isinstance(value, float) and type(value) is float and math.isfinite(value):
            return ('{"key":' + _quote(key) + ',"type":"float64","value":'
                    + float.__repr__(value) + "}")
    return dumps(_tag(key, value))


class SpanWriter:
    """A span's JSON text, as ``dumps`` of a dict of its fields (processID included) writes
    it, with the text of each attribute's tag kept (:mod:`.kept`): attnscope's spans repeat most
    of theirs, and building and dumping a dict per tag was most of the export thread's time per
    span (``tests/test_jaeger_span_text.py`` compares the two)."""

    def __init__(self) -> None:
        self._tags = Kept(_tag_text)
        self._kept: dict[int, tuple[object, str]] = {}  # scope, kind, status -> their tags

    def parts(self, span: ReadableSpan) -> tuple[str, str]:
        """The span's text before and after its processID's value (which the document picks)."""
        ctx = span.context
        refs = _references(span)
        start_ns = span.start_time or 0
        end_ns = span.end_time or start_ns
        head = ('{"traceID":"' + f"{ctx.trace_id:032x}" + '","spanID":"' + f"{ctx.span_id:016x}"
                + '","operationName":' + dumps(span.name or _UNNAMED)
                + ',"references":' + (dumps(refs) if refs else "[]")
                + ',"startTime":' + str(start_ns // 1000)
                + ',"duration":' + str(max(0, end_ns - start_ns) // 1000)
                + ',"tags":[' + self._tags_text(span) + ']')
        if not span.events and not (span.dropped_attributes or span.dropped_events
                                    or span.dropped_links):
            return head + ',"logs":[],"processID":"', '","warnings":null}'
        fields = span_fields_rest(span)
        return (head + ',"logs":' + dumps(fields["logs"]) + ',"processID":"',
                '","warnings":' + dumps(fields["warnings"]) + "}")

    def _tags_text(self, span: ReadableSpan) -> str:
        texts = self._tags.encode(span.attributes or {})
        add = texts.append
        for tags_of, part_of in _FIXED_TAGS:
            part = part_of(span)
            kept = self._kept.get(id(part))
            if kept is None or kept[0] is not part:
                if len(self._kept) >= 64:
                    self._kept.clear()
                kept = self._kept[id(part)] = (part, ",".join(map(dumps, tags_of(part))))
            if kept[1]:
                add(kept[1])
        return ",".join(texts)


def parts_of_fields(fields: dict[str, object]) -> tuple[str, str]:
    """:meth:`SpanWriter.parts` of a span's fields as read back from a document (processID and
    warnings last, as this module writes them)."""
    rest = {k: v for k, v in fields.items() if k not in ("processID", "warnings")}
    return (dumps(rest)[:-1] + ',"processID":"',
            '","warnings":' + dumps(fields.get("warnings")) + "}")


@dataclass
class Trace:
    """One trace of the document being built: its spans' JSON text (ASCII, comma-separated, as
    bytes: written to the file as they are, never joined into one document), its process
    table."""

    body: bytearray = field(default_factory=bytearray)
    processes: dict[str, str] = field(default_factory=dict)  # process JSON -> processID

    def add(self, text: str) -> None:
        if self.body:
            self.body += b","
        self.body += text.encode("ascii")


def trace_chunks(trace_id: str, trace: Trace) -> list[bytes | bytearray]:
    """The trace's entry of the document's ``data``, in pieces (the spans' text not copied)."""
    procs = ",".join(f'"{pid}":{proc}' for proc, pid in trace.processes.items())
    return [f'{{"traceID":"{trace_id}","spans":['.encode("ascii"), trace.body,
            f'],"processes":{{{procs}}}}}'.encode("ascii")]


def document_chunks(traces: dict[str, Trace]) -> list[bytes | bytearray]:
    """The whole document, ``{"data":[...]}``, in pieces."""
    chunks: list[bytes | bytearray] = [b'{"data":[']
    for i, (trace_id, trace) in enumerate(traces.items()):
        if i:
            chunks.append(b",")
        chunks.extend(trace_chunks(trace_id, trace))
    chunks.append(b"]}")
    return chunks


EMPTY_DOCUMENT_BYTES = len('{"data":[]}')
# Upper bounds, counting one separator comma each, so the estimate never undershoots the file.
TRACE_OVERHEAD_BYTES = sum(map(len, trace_chunks("0" * 32, Trace()))) + 1
