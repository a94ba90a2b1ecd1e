"""OTLPJSONFileExporter: OTLP/JSON lines that parse back into the spans the SDK produced."""

from __future__ import annotations

import base64
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import json_format
from opentelemetry import trace as trace_api
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PBSpan
from opentelemetry.proto.trace.v1.trace_pb2 import Status as PBStatus
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

from attnscope.exporters import OTLPJSONFileExporter, read_otlp_json_lines

HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")


def make_provider(*exporters: Any) -> tuple[TracerProvider, InMemorySpanExporter]:
    resource = Resource.create({"service.name": "svc-test"})
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, memory


def emit_two_traces(provider: TracerProvider) -> None:
    """request -> attention (error, event) -> kernel; plus a separate second trace."""
    tracer = provider.get_tracer("attnscope.test", "1.2.3")
    with tracer.start_as_current_span("request", kind=SpanKind.SERVER) as root:
        root.set_attributes(
            {"s": "text", "b": True, "i": 7, "f": 1.5, "ls": ["a", "b"], "lf": [0.5, 2.0]}
        )
        with tracer.start_as_current_span("attention") as att:
            att.add_event("kernel.launch", {"kernel": "flash_fwd", "blocks": 3})
            with tracer.start_as_current_span("kernel", kind=SpanKind.CLIENT):
                pass
            att.set_status(Status(StatusCode.ERROR, "boom"))
    with tracer.start_as_current_span("second", kind=SpanKind.CLIENT):
        pass


def plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [plain(v) for v in value.array_value.values]
    assert kind is not None
    return getattr(value, kind)


def pb_spans(requests: list[ExportTraceServiceRequest]) -> list[PBSpan]:
    return [
        span
        for request in requests
        for rs in request.resource_spans
        for ss in rs.scope_spans
        for span in ss.spans
    ]


def assert_same_spans(requests: list[ExportTraceServiceRequest], sdk: list[ReadableSpan]) -> None:
    by_id = {span.span_id.hex(): span for span in pb_spans(requests)}
    assert len(by_id) == len(sdk)
    for source in sdk:
        span = by_id[f"{source.context.span_id:016x}"]
        assert span.name == source.name
        assert span.trace_id.hex() == f"{source.context.trace_id:032x}"
        expected_parent = f"{source.parent.span_id:016x}" if source.parent else ""
        assert span.parent_span_id.hex() == expected_parent
        assert span.start_time_unix_nano == source.start_time
        assert span.end_time_unix_nano == source.end_time
        attrs = {kv.key: plain(kv.value) for kv in span.attributes}
        assert attrs == {
            k: list(v) if isinstance(v, tuple) else v for k, v in (source.attributes or {}).items()
        }


def test_each_export_is_one_line_that_parses_back(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    exporter = OTLPJSONFileExporter(path)
    provider, memory = make_provider(exporter)
    emit_two_traces(provider)
    exporter.shutdown()
    lines = path.read_text().splitlines()
    assert len(lines) == 4  # SimpleSpanProcessor: one export() per span
    requests = read_otlp_json_lines(path)
    assert len(requests) == 4
    assert_same_spans(requests, list(memory.get_finished_spans()))
    resource = requests[0].resource_spans[0].resource
    assert {kv.key: plain(kv.value) for kv in resource.attributes}["service.name"] == "svc-test"
    assert requests[0].resource_spans[0].scope_spans[0].scope.name == "attnscope.test"


def test_batch_export_error_status_and_events(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    provider, memory = make_provider()
    emit_two_traces(provider)
    sdk = list(memory.get_finished_spans())
    exporter = OTLPJSONFileExporter(path)
    assert exporter.export(sdk) is SpanExportResult.SUCCESS
    exporter.shutdown()
    [request] = read_otlp_json_lines(path)
    assert_same_spans([request], sdk)
    names = {span.name: span for span in pb_spans([request])}
    att = names["attention"]
    assert att.status.code == PBStatus.STATUS_CODE_ERROR
    assert att.status.message == "boom"
    [event] = att.events
    assert event.name == "kernel.launch"
    assert {kv.key: plain(kv.value) for kv in event.attributes} == {
        "kernel": "flash_fwd",
        "blocks": 3,
    }
    assert names["kernel"].kind == PBSpan.SPAN_KIND_CLIENT
    assert names["request"].kind == PBSpan.SPAN_KIND_SERVER


def test_wire_format_follows_the_otlp_json_spec(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    provider, memory = make_provider()
    emit_two_traces(provider)
    exporter = OTLPJSONFileExporter(path)
    exporter.export(memory.get_finished_spans())
    exporter.shutdown()
    raw = json.loads(path.read_text())
    spans = [s for rs in raw["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    assert len(spans) == 4
    for span in spans:
        assert HEX32.match(span["traceId"]) and HEX16.match(span["spanId"])
        assert "parentSpanId" not in span or HEX16.match(span["parentSpanId"])
        assert isinstance(span["kind"], int)  # enums as integers
        assert isinstance(span["startTimeUnixNano"], str)  # int64 as decimal string
    error = next(s for s in spans if s["name"] == "attention")
    assert error["status"] == {"message": "boom", "code": 2}


def test_plain_protobuf_parse_after_converting_ids(tmp_path: Path) -> None:
    """The documented recipe: hex ids back to base64, then json_format.Parse."""
    path = tmp_path / "t.jsonl"
    exporter = OTLPJSONFileExporter(path)
    provider, memory = make_provider(exporter)
    emit_two_traces(provider)
    exporter.shutdown()
    requests = []
    for line in path.read_text().splitlines():
        data = json.loads(line)
        for rs in data["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    for key in ("traceId", "spanId", "parentSpanId"):
                        if key in span:
                            span[key] = base64.b64encode(bytes.fromhex(span[key])).decode()
        requests.append(json_format.Parse(json.dumps(data), ExportTraceServiceRequest()))
    assert_same_spans(requests, list(memory.get_finished_spans()))


def test_links_carry_hex_ids(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    exporter = OTLPJSONFileExporter(path)
    provider, _ = make_provider(exporter)
    target = trace_api.SpanContext(trace_id=0xABC, span_id=0xDEF, is_remote=True)
    provider.get_tracer("t").start_span("linked", links=[trace_api.Link(target)]).end()
    exporter.shutdown()
    raw = json.loads(path.read_text())
    [link] = raw["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["links"]
    assert link["traceId"] == f"{0xABC:032x}" and link["spanId"] == f"{0xDEF:016x}"
    [span] = pb_spans(read_otlp_json_lines(path))
    assert span.links[0].span_id.hex() == f"{0xDEF:016x}"


def test_rotation_by_size(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    exporter = OTLPJSONFileExporter(path, max_bytes=3000, backups=1)
    provider, memory = make_provider(exporter)
    for _ in range(5):
        emit_two_traces(provider)
    exporter.shutdown()
    assert sorted(os.listdir(tmp_path)) == ["t.jsonl", "t.jsonl.1"]
    for name in ("t.jsonl", "t.jsonl.1"):
        assert os.path.getsize(tmp_path / name) <= 3000
        assert read_otlp_json_lines(tmp_path / name)
    # Oldest lines are gone with the rotated-out file; the newest span is in the live file.
    newest = memory.get_finished_spans()[-1]
    live = {s.span_id.hex() for s in pb_spans(read_otlp_json_lines(path))}
    assert f"{newest.context.span_id:016x}" in live


def test_appends_to_an_existing_file(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    for _ in range(2):
        exporter = OTLPJSONFileExporter(path)
        provider, _ = make_provider(exporter)
        with provider.get_tracer("t").start_as_current_span("s"):
            pass
        exporter.shutdown()
    assert len(read_otlp_json_lines(path)) == 2


@pytest.mark.internal_errors("exporter.otlp_json")
def test_export_after_shutdown_and_unwritable_path_fail_quietly(tmp_path: Path) -> None:
    provider, memory = make_provider()
    emit_two_traces(provider)
    spans = memory.get_finished_spans()
    exporter = OTLPJSONFileExporter(tmp_path / "t.jsonl")
    exporter.shutdown()
    exporter.shutdown()
    assert exporter.export(spans) is SpanExportResult.FAILURE
    blocked = tmp_path / "dir-in-the-way"
    in_the_way = OTLPJSONFileExporter(blocked)
    blocked.mkdir()  # after the constructor's check, which refuses a directory
    assert in_the_way.export(spans) is SpanExportResult.FAILURE
    assert in_the_way.dropped_spans == len(spans)
    assert in_the_way.force_flush() is False
    in_the_way.shutdown()
    bad: Any = [object()]
    other = OTLPJSONFileExporter(tmp_path / "x.jsonl")
    assert other.export(bad) is SpanExportResult.FAILURE
    other.shutdown()
    # nothing written but the files a shutdown always leaves (empty: no line was written)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir-in-the-way", "t.jsonl", "x.jsonl"]
    assert (tmp_path / "t.jsonl").read_text() == (tmp_path / "x.jsonl").read_text() == ""


def test_reader_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    path.write_text('{"resourceSpans":[]}\n\nnot json\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:3:"):
        read_otlp_json_lines(path)


@pytest.mark.parametrize("kwargs", [{"max_bytes": 0}, {"backups": -1}, {"backups": 1.5}])
def test_bad_configuration_raises_value_error(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        OTLPJSONFileExporter(tmp_path / "t.jsonl", **kwargs)


def test_a_deleted_or_replaced_file_is_not_written_into(tmp_path: Path) -> None:
    """Lines go where the path points now: never into an unlinked file (issue 20)."""
    directory = tmp_path / "d"
    directory.mkdir()
    path = directory / "t.jsonl"
    exporter = OTLPJSONFileExporter(path)
    provider, _ = make_provider(exporter)
    tracer = provider.get_tracer("t")
    tracer.start_span("a").end()
    path.unlink()  # deleted: the next line starts a new file
    tracer.start_span("b").end()
    assert len(read_otlp_json_lines(path)) == 1
    other = directory / "new.jsonl"
    other.write_text("")
    os.replace(other, path)  # replaced by another file (a log rotation)
    tracer.start_span("c").end()
    assert exporter.force_flush() is True
    assert len(read_otlp_json_lines(path)) == 1 and exporter.dropped_spans == 0
    for name in os.listdir(directory):
        os.unlink(directory / name)
    directory.rmdir()  # the directory is gone: the line fails and says so
    tracer.start_span("d").end()
    assert exporter.dropped_spans == 1
    assert exporter.force_flush() is False
    exporter.shutdown()
    assert not directory.exists()


def test_summaries_in_the_file_read_as_their_exact_attributes(tmp_path: Path) -> None:
    """Issue 24 §4 in the OTLP/JSON path: the same summaries and kernel list as Jaeger JSON's."""
    pytest.importorskip("transformers")
    from tests.support.helpers import check_summary_trace, summary_trace

    rows, shape = summary_trace(tmp_path / "t.jsonl", "otlp-json")
    check_summary_trace(rows, shape)
    spans = [s for line in (tmp_path / "t.jsonl").read_text().splitlines() if line.strip()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    assert spans and all(any(a["key"] == "attnscope.summary" for a in s["attributes"])
                         for s in spans)
