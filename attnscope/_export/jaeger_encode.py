"""Jaeger JSON encoding of OpenTelemetry spans, for :mod:`attnscope._export.jaeger_json`.

Each span becomes the JSON text of one entry of a trace's ``spans``; each resource one entry of
its ``processes``. The text is built once per span, so rewriting a document only joins strings.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import StatusCode

__all__ = ["EMPTY_DOCUMENT_BYTES", "TRACE_OVERHEAD_BYTES", "Trace", "dumps", "process_json",
           "span_fields", "trace_json"]

_UNKNOWN_SERVICE = "unknown_service"
_UNNAMED = "(unnamed)"


def dumps(obj: object) -> str:
    # Compact output keeps files small. ensure_ascii (the default) makes len(text) equal the
    # encoded byte count, which the size accounting relies on. allow_nan=False because the UI's
    # JSON.parse rejects NaN/Infinity; _tag already turns non-finite floats into strings.
    return json.dumps(obj, separators=(",", ":"), allow_nan=False)


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


def _tags(span: ReadableSpan) -> list[dict[str, object]]:
    tags = [_tag(k, v) for k, v in (span.attributes or {}).items()]
    scope = span.instrumentation_scope
    if scope is not None:
        tags.append(_tag("otel.scope.name", scope.name))
        if scope.version:
            tags.append(_tag("otel.scope.version", scope.version))
    tags.append(_tag("span.kind", span.kind.name.lower()))
    status = span.status
    if status.status_code is StatusCode.ERROR:
        tags.append(_tag("otel.status_code", "ERROR"))
        tags.append(_tag("error", True))
        if status.description:
            tags.append(_tag("otel.status_description", status.description))
    elif status.status_code is StatusCode.OK:
        tags.append(_tag("otel.status_code", "OK"))
    return tags


def span_fields(span: ReadableSpan) -> dict[str, object]:
    """Everything about ``span`` except its processID, which depends on the document."""
    ctx = span.context
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
    start_ns = span.start_time or 0
    end_ns = span.end_time or start_ns
    return {
        "traceID": f"{ctx.trace_id:032x}",
        "spanID": f"{ctx.span_id:016x}",
        # The UI rejects the whole file if any operationName is empty.
        "operationName": span.name or _UNNAMED,
        "references": _references(span),
        "startTime": start_ns // 1000,
        "duration": max(0, end_ns - start_ns) // 1000,
        "tags": _tags(span),
        "logs": logs,
        "processID": "",
        "warnings": warnings or None,
    }


@dataclass
class Trace:
    """One trace of the document being built: its spans as JSON text, its process table."""

    spans: list[str] = field(default_factory=list)
    processes: dict[str, str] = field(default_factory=dict)  # process JSON -> processID


def trace_json(trace_id: str, trace: Trace) -> str:
    procs = ",".join(f'"{pid}":{proc}' for proc, pid in trace.processes.items())
    return f'{{"traceID":"{trace_id}","spans":[{",".join(trace.spans)}],"processes":{{{procs}}}}}'


EMPTY_DOCUMENT_BYTES = len('{"data":[]}')
# Upper bounds, counting one separator comma each, so the estimate never undershoots the file.
TRACE_OVERHEAD_BYTES = len(trace_json("0" * 32, Trace())) + 1
