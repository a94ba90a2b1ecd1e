"""JaegerJSONFileExporter: the document Jaeger UI's upload tab reads, written atomically."""

from __future__ import annotations

import json
import os
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode

import attnscope.exporters
from attnscope.exporters import JaegerJSONFileExporter

HEX32 = re.compile(r"^[0-9a-f]{32}$")
HEX16 = re.compile(r"^[0-9a-f]{16}$")
SPAN_KEYS = {
    "traceID",
    "spanID",
    "operationName",
    "references",
    "startTime",
    "duration",
    "tags",
    "logs",
    "processID",
    "warnings",
}
T0 = 1_700_000_000_123_456_789  # ns; not a multiple of 1000, so unit slips show


def make_provider(
    *exporters: Any, attrs: dict[str, Any] | None = None
) -> tuple[TracerProvider, InMemorySpanExporter]:
    resource = Resource.create(
        attrs or {"service.name": "svc-test", "deployment.environment": "test", "host.gpus": 2}
    )
    provider = TracerProvider(resource=resource, shutdown_on_exit=False)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for exporter in exporters:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider, memory


def emit_two_traces(provider: TracerProvider) -> None:
    """request -> attention (error, event) -> kernel; plus a separate second trace."""
    tracer = provider.get_tracer("attnscope.test", "1.2.3")
    root = tracer.start_span("request", kind=SpanKind.SERVER, start_time=T0)
    root.set_attributes(
        {
            "s": "text",
            "b": True,
            "i": 7,
            "f": 1.5,
            "ls": ["a", "b"],
            "lf": [0.5, 2.0],
        }
    )
    root_ctx = trace_api.set_span_in_context(root)
    att = tracer.start_span("attention", context=root_ctx, start_time=T0 + 1_000_999)
    att.add_event("kernel.launch", {"kernel": "flash_fwd", "blocks": 3}, timestamp=T0 + 1_500_000)
    kernel = tracer.start_span(
        "kernel",
        context=trace_api.set_span_in_context(att),
        kind=SpanKind.CLIENT,
        start_time=T0 + 2_000_000,
    )
    kernel.end(end_time=T0 + 2_345_678)
    att.set_status(Status(StatusCode.ERROR, "boom"))
    att.end(end_time=T0 + 3_000_000)
    root.end(end_time=T0 + 4_000_000)
    with tracer.start_as_current_span("second", kind=SpanKind.CLIENT):
        pass


def load(path: Path) -> dict[str, Any]:
    # parse_constant rejects NaN/Infinity, which the UI's JSON.parse would too.
    def reject(name: str) -> None:
        raise ValueError(f"non-standard JSON constant {name}")

    with open(path, encoding="utf-8") as f:
        doc: dict[str, Any] = json.load(f, parse_constant=reject)
    assert ui_accepts(doc)
    return doc


def ui_accepts(doc: dict[str, Any]) -> bool:
    """The checks jaeger-ui's upload (utils/readJsonFile.ts) makes before it shows a file."""

    def span_ok(span: dict[str, Any]) -> bool:
        return bool(
            span.get("traceID")
            and span.get("spanID")
            and span.get("operationName")
            and type(span.get("startTime")) in (int, float)
            and type(span.get("duration")) in (int, float)
            and isinstance(span.get("processID"), str)
            and span["processID"]
        )

    def trace_ok(trace: dict[str, Any]) -> bool:
        processes = trace.get("processes")
        return bool(
            trace.get("traceID")
            and isinstance(trace.get("spans"), list)
            and isinstance(processes, dict)
            and all(span_ok(s) for s in trace["spans"])
            and all(
                isinstance(p, dict) and isinstance(p.get("serviceName"), str) and p["serviceName"]
                for p in processes.values()
            )
            and all(s["processID"] in processes for s in trace["spans"])
        )

    return isinstance(doc.get("data"), list) and all(trace_ok(t) for t in doc["data"])


def spans_by_id(doc: dict[str, Any]) -> dict[str, tuple[dict[str, Any], dict[str, Any]]]:
    """spanID -> (span, its trace entry)."""
    return {s["spanID"]: (s, t) for t in doc["data"] for s in t["spans"]}


def tags(items: list[dict[str, Any]]) -> dict[str, tuple[str, Any]]:
    return {t["key"]: (t["type"], t["value"]) for t in items}


def sdk_by_id(memory: InMemorySpanExporter) -> dict[str, ReadableSpan]:
    return {f"{s.context.span_id:016x}": s for s in memory.get_finished_spans()}


@pytest.fixture
def written(tmp_path: Path) -> tuple[dict[str, Any], dict[str, ReadableSpan]]:
    exporter = JaegerJSONFileExporter(tmp_path / "trace.json", flush_interval_s=None)
    provider, memory = make_provider(exporter)
    emit_two_traces(provider)
    assert exporter.force_flush()
    return load(tmp_path / "trace.json"), sdk_by_id(memory)


def test_public_names_are_pinned() -> None:
    assert attnscope.exporters.__all__ == [
        "JaegerJSONFileExporter",
        "OTLPJSONFileExporter",
        "merge_jaeger_json",
        "otlp_span_exporter",
        "read_otlp_json_lines",
    ]


def test_one_data_entry_and_process_table_per_trace(
    written: tuple[dict[str, Any], dict[str, ReadableSpan]],
) -> None:
    doc, sdk = written
    assert set(doc) == {"data"}
    assert len(doc["data"]) == 2
    trace_ids = {f"{s.context.trace_id:032x}" for s in sdk.values()}
    assert {t["traceID"] for t in doc["data"]} == trace_ids
    for entry in doc["data"]:
        assert set(entry) == {"traceID", "spans", "processes"}
        assert HEX32.match(entry["traceID"])
        assert list(entry["processes"]) == ["p1"]
        process = entry["processes"]["p1"]
        assert process["serviceName"] == "svc-test"
        ptags = tags(process["tags"])
        assert "service.name" not in ptags
        assert ptags["deployment.environment"] == ("string", "test")
        assert ptags["host.gpus"] == ("int64", 2)
        for span in entry["spans"]:
            assert span["traceID"] == entry["traceID"]
            assert span["processID"] in entry["processes"]
    assert sorted(len(t["spans"]) for t in doc["data"]) == [1, 3]


def test_span_fields_types_and_microsecond_units(
    written: tuple[dict[str, Any], dict[str, ReadableSpan]],
) -> None:
    doc, sdk = written
    found = spans_by_id(doc)
    assert set(found) == set(sdk)
    for span_id, (span, _) in found.items():
        source = sdk[span_id]
        assert set(span) == SPAN_KEYS
        assert HEX16.match(span["spanID"]) and HEX32.match(span["traceID"])
        assert span["operationName"] == source.name
        assert source.start_time is not None and source.end_time is not None
        assert type(span["startTime"]) is int and type(span["duration"]) is int
        assert span["startTime"] == source.start_time // 1000
        assert span["duration"] == (source.end_time - source.start_time) // 1000
        assert span["warnings"] is None
        for tag in span["tags"]:
            assert set(tag) == {"key", "type", "value"}
            assert tag["type"] in {"string", "bool", "int64", "float64"}
    kernel = next(s for s, _ in found.values() if s["operationName"] == "kernel")
    assert kernel["startTime"] == (T0 + 2_000_000) // 1000 == 1_700_000_000_125_456
    assert kernel["duration"] == 345


def test_parent_references_resolve_within_the_file(
    written: tuple[dict[str, Any], dict[str, ReadableSpan]],
) -> None:
    doc, sdk = written
    found = spans_by_id(doc)
    for span_id, (span, entry) in found.items():
        parent = sdk[span_id].parent
        if parent is None:
            assert span["references"] == []
            continue
        [ref] = span["references"]
        assert ref == {
            "refType": "CHILD_OF",
            "traceID": entry["traceID"],
            "spanID": f"{parent.span_id:016x}",
        }
        parent_span, parent_entry = found[ref["spanID"]]
        assert parent_entry is entry
    names = {s["operationName"]: s for s, _ in found.values()}
    assert names["kernel"]["references"][0]["spanID"] == names["attention"]["spanID"]
    assert names["attention"]["references"][0]["spanID"] == names["request"]["spanID"]


def test_typed_tags_kind_and_scope(
    written: tuple[dict[str, Any], dict[str, ReadableSpan]],
) -> None:
    doc, _ = written
    names = {s["operationName"]: s for s, _ in spans_by_id(doc).values()}
    root = tags(names["request"]["tags"])
    assert root["s"] == ("string", "text")
    assert root["b"] == ("bool", True)
    assert root["i"] == ("int64", 7)
    assert root["f"] == ("float64", 1.5)
    assert root["ls"] == ("string", '["a", "b"]')
    assert json.loads(root["lf"][1]) == [0.5, 2.0] and root["lf"][0] == "string"
    assert root["span.kind"] == ("string", "server")
    assert root["otel.scope.name"] == ("string", "attnscope.test")
    assert root["otel.scope.version"] == ("string", "1.2.3")
    assert "error" not in root
    assert tags(names["attention"]["tags"])["span.kind"] == ("string", "internal")
    assert tags(names["kernel"]["tags"])["span.kind"] == ("string", "client")


def test_error_status_and_event_logs(
    written: tuple[dict[str, Any], dict[str, ReadableSpan]],
) -> None:
    doc, _ = written
    names = {s["operationName"]: s for s, _ in spans_by_id(doc).values()}
    att = names["attention"]
    att_tags = tags(att["tags"])
    assert att_tags["error"] == ("bool", True)
    assert att_tags["otel.status_description"] == ("string", "boom")
    assert att_tags["otel.status_code"] == ("string", "ERROR")
    [log] = att["logs"]
    assert log["timestamp"] == (T0 + 1_500_000) // 1000
    assert tags(log["fields"]) == {
        "event": ("string", "kernel.launch"),
        "kernel": ("string", "flash_fwd"),
        "blocks": ("int64", 3),
    }
    assert names["kernel"]["logs"] == []


def test_parent_outside_the_file_keeps_its_reference(tmp_path: Path) -> None:
    exporter = JaegerJSONFileExporter(tmp_path / "t.json", flush_interval_s=None)
    provider, _ = make_provider(exporter)
    remote = trace_api.SpanContext(
        trace_id=0xABC, span_id=0xDEF, is_remote=True, trace_flags=trace_api.TraceFlags(1)
    )
    ctx = trace_api.set_span_in_context(trace_api.NonRecordingSpan(remote))
    provider.get_tracer("t").start_span("orphan", context=ctx).end()
    exporter.shutdown()
    [entry] = load(tmp_path / "t.json")["data"]
    [span] = entry["spans"]
    assert entry["traceID"] == f"{0xABC:032x}"
    assert span["references"] == [
        {"refType": "CHILD_OF", "traceID": f"{0xABC:032x}", "spanID": f"{0xDEF:016x}"}
    ]


def test_service_name_override_and_non_finite_floats(tmp_path: Path) -> None:
    exporter = JaegerJSONFileExporter(
        tmp_path / "t.json", service_name="override", flush_interval_s=None
    )
    provider, _ = make_provider(exporter)
    with provider.get_tracer("t").start_as_current_span("s") as span:
        span.set_attribute("nan", float("nan"))
        span.set_attribute("inf", float("inf"))
    exporter.shutdown()
    [entry] = load(tmp_path / "t.json")["data"]  # load() rejects NaN/Infinity literals
    assert entry["processes"]["p1"]["serviceName"] == "override"
    span_tags = tags(entry["spans"][0]["tags"])
    assert span_tags["nan"] == ("string", "nan")
    assert span_tags["inf"] == ("string", "inf")


def test_empty_names_still_pass_the_ui_checks(tmp_path: Path) -> None:
    exporter = JaegerJSONFileExporter(tmp_path / "t.json", flush_interval_s=None)
    # Resource() rather than Resource.create(), which would fill in a default service.name.
    provider = TracerProvider(resource=Resource({"service.name": ""}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    provider.get_tracer("t").start_span("").end()
    exporter.shutdown()
    [entry] = load(tmp_path / "t.json")["data"]  # load() applies the UI's checks
    assert entry["spans"][0]["operationName"] == "(unnamed)"
    assert entry["processes"]["p1"]["serviceName"] == "unknown_service"


def test_each_flush_rewrites_a_complete_file_atomically(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path, flush_interval_s=None)
    provider, _ = make_provider(exporter)
    tracer = provider.get_tracer("t")
    for n in range(1, 4):
        with tracer.start_as_current_span(f"s{n}"):
            pass
        if n == 1:
            assert not path.exists()  # flush_interval_s=None: export() alone writes nothing
        assert exporter.force_flush()
        doc = load(path)
        assert sum(len(t["spans"]) for t in doc["data"]) == n
        # No temp file left behind; the lock file lives as long as the exporter.
        assert sorted(os.listdir(tmp_path)) == ["t.json", "t.json.lock"]
    exporter.shutdown()
    assert os.listdir(tmp_path) == ["t.json"]


def test_export_writes_on_the_interval(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path, flush_interval_s=0)
    provider, _ = make_provider(exporter)
    with provider.get_tracer("t").start_as_current_span("s"):
        pass
    assert len(load(path)["data"]) == 1  # written by export(), no flush needed


def test_rotation_keeps_files_small_and_parseable(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path, max_bytes=4000, backups=2, flush_interval_s=None)
    provider, _ = make_provider(exporter)
    tracer = provider.get_tracer("t")
    total = 60
    for n in range(total):
        with tracer.start_as_current_span(f"span-{n}") as span:
            span.set_attribute("n", n)
    exporter.shutdown()
    files = sorted(os.listdir(tmp_path))
    assert files == ["t.json", "t.json.1", "t.json.2"]
    kept = 0
    for name in files:
        size = os.path.getsize(tmp_path / name)
        assert size <= 4000
        kept += sum(len(t["spans"]) for t in load(tmp_path / name)["data"])
    assert exporter.dropped_spans > 0  # more rotations than backups
    assert kept + exporter.dropped_spans == total
    # The newest spans are the ones kept.
    newest = {s["operationName"] for t in load(path)["data"] for s in t["spans"]}
    assert f"span-{total - 1}" in newest


def test_rotation_without_backups(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path, max_bytes=2000, backups=0, flush_interval_s=None)
    provider, _ = make_provider(exporter)
    for n in range(30):
        with provider.get_tracer("t").start_as_current_span(f"span-{n}"):
            pass
    exporter.shutdown()
    assert os.listdir(tmp_path) == ["t.json"]
    kept = sum(len(t["spans"]) for t in load(path)["data"])
    assert kept + exporter.dropped_spans == 30


def test_export_after_shutdown_fails_quietly(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path)
    provider, memory = make_provider()
    emit_two_traces(provider)
    spans = memory.get_finished_spans()
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    exporter.shutdown()
    exporter.shutdown()  # twice is fine
    before = path.read_bytes()
    assert exporter.export(spans) is SpanExportResult.FAILURE
    assert path.read_bytes() == before


@pytest.mark.internal_errors("exporter.jaeger_json")
def test_export_never_raises(tmp_path: Path) -> None:
    blocked = tmp_path / "dir-in-the-way"
    exporter = JaegerJSONFileExporter(blocked, flush_interval_s=0)
    blocked.mkdir()  # after the constructor's check, which refuses a directory
    provider, memory = make_provider()
    emit_two_traces(provider)
    assert exporter.export(memory.get_finished_spans()) is SpanExportResult.FAILURE
    assert exporter.force_flush() is False
    exporter.shutdown()
    assert exporter.dropped_spans == 4
    bad: Any = [object()]
    other = JaegerJSONFileExporter(tmp_path / "x.json")
    assert other.export(bad) is SpanExportResult.FAILURE
    other.shutdown()
    # the file a shutdown always leaves: the empty document, no trace of the bad span
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir-in-the-way", "x.json"]
    assert json.loads((tmp_path / "x.json").read_text()) == {"data": []}


def test_concurrent_exports_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path, flush_interval_s=0)
    provider, _ = make_provider(exporter)
    tracer = provider.get_tracer("t")

    def work() -> None:
        for _ in range(50):
            with tracer.start_as_current_span("outer"):
                with tracer.start_as_current_span("inner"):
                    pass

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    exporter.shutdown()
    doc = load(path)
    assert len(doc["data"]) == 200
    assert all(len(t["spans"]) == 2 for t in doc["data"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"max_bytes": 0},
        {"max_bytes": True},
        {"backups": -1},
        {"flush_interval_s": float("nan")},
        {"flush_interval_s": "5"},
    ],
)
def test_bad_configuration_raises_value_error(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        JaegerJSONFileExporter(tmp_path / "t.json", **kwargs)


# -- what attnscope's pipeline counts, and a file reopened in the same process (issue 20) -----

def _named(provider: TracerProvider, *names: str) -> None:
    for name in names:
        provider.get_tracer("t").start_span(name).end()


def test_bound_delivery_reports_spans_once_they_are_in_the_file(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path, flush_interval_s=None)
    provider, _ = make_provider(exporter)
    _named(provider, "before")  # taken before the pipeline bound it: not the pipeline's
    reports: list[tuple[int, int]] = []
    exporter.attnscope_bind_delivery(lambda written, lost: reports.append((written, lost)))
    _named(provider, "a", "b", "c")
    assert reports == []  # in memory only: not exported yet
    assert exporter.force_flush() is True
    assert reports == [(3, 0)]
    _named(provider, "d", "e")
    path.unlink()
    path.mkdir()  # every write fails from here on
    assert exporter.force_flush() is False
    assert reports == [(3, 0)]  # kept for the next write: neither exported nor lost
    exporter.shutdown()  # the final write fails: they never reach a file
    assert reports == [(3, 0), (0, 2)]
    assert exporter.export([]) is SpanExportResult.FAILURE  # refused after shutdown


def test_rotation_reports_what_it_writes_and_what_it_loses(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path, max_bytes=2000, backups=0, flush_interval_s=None)
    provider, _ = make_provider(exporter)
    reports: list[tuple[int, int]] = []
    exporter.attnscope_bind_delivery(lambda written, lost: reports.append((written, lost)))
    _named(provider, *(f"span-{n}" for n in range(30)))
    exporter.shutdown()
    # every span was in the file at some point (without backups a rotation writes, then starts
    # over), so all 30 count as exported; dropped_spans says how many are no longer there
    assert sum(w for w, _ in reports) == 30 and sum(lost for _, lost in reports) == 0
    kept = sum(len(t["spans"]) for t in load(path)["data"])
    assert kept + exporter.dropped_spans == 30


def test_reopened_in_this_process_keeps_what_the_file_holds(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    first = JaegerJSONFileExporter(path, flush_interval_s=None)
    provider, _ = make_provider(first)
    emit_two_traces(provider)
    first.shutdown()
    before = load(path)
    second = JaegerJSONFileExporter(path, flush_interval_s=None)  # a restarted worker
    provider2, _ = make_provider(second, attrs={"service.name": "other"})
    _named(provider2, "after-restart")
    second.shutdown()
    doc = load(path)  # still passes the UI's checks
    names = sorted(s["operationName"] for t in doc["data"] for s in t["spans"])
    assert names == ["after-restart", "attention", "kernel", "request", "second"]
    # the spans read back are the same, process tables included
    old = {s["spanID"]: (s, t["processes"][s["processID"]]) for t in before["data"]
           for s in t["spans"]}
    new = {s["spanID"]: (s, t["processes"][s["processID"]]) for t in doc["data"]
           for s in t["spans"]}
    assert all(new[k] == v for k, v in old.items())


def test_a_file_from_another_process_is_still_replaced(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    path.write_text('{"data":[{"traceID":"1","spans":[],"processes":{}}]}')  # a previous run's
    exporter = JaegerJSONFileExporter(path, flush_interval_s=None)
    provider, _ = make_provider(exporter)
    _named(provider, "new")
    exporter.shutdown()
    doc = load(path)
    assert [s["operationName"] for t in doc["data"] for s in t["spans"]] == ["new"]


def test_the_merge_widens_a_step_root_over_every_ranks_spans(tmp_path: Path) -> None:
    from attnscope.exporters import merge_jaeger_json

    def span(span_id: str, name: str, start: int, duration: int, parent: str | None,
             **tags: Any) -> dict[str, Any]:
        refs = [{"refType": "CHILD_OF", "traceID": "t", "spanID": parent}] if parent else []
        return {"traceID": "t", "spanID": span_id, "operationName": name, "references": refs,
                "startTime": start, "duration": duration, "processID": "p1",
                "tags": [{"key": k, "type": "int64", "value": v} for k, v in tags.items()]}

    process = {"p1": {"serviceName": "job", "tags": []}}
    rank0 = {"data": [{"traceID": "t", "processes": process, "spans": [
        span("r", "attnscope.step 3", 1000, 500, None, **{"attnscope.step": 3}),
        span("a", "attnscope.rank 0", 1000, 500, "r", **{"attnscope.rank": 0})]}]}
    rank1 = {"data": [{"traceID": "t", "processes": process, "spans": [  # a straggler
        span("b", "attnscope.rank 1", 900, 2000, "r", **{"attnscope.rank": 1}),
        span("c", "layer", 950, 100, "b", **{"attnscope.rank": 1})]}]}
    files = [tmp_path / "r0.json", tmp_path / "r1.json"]
    for path, doc in zip(files, (rank0, rank1), strict=True):
        path.write_text(json.dumps(doc))
    assert merge_jaeger_json(tmp_path / "m.json", files) == 1
    (trace,) = json.loads((tmp_path / "m.json").read_text())["data"]
    root = next(s for s in trace["spans"] if s["spanID"] == "r")
    assert (root["startTime"], root["duration"]) == (900, 2000)
    # the files themselves are left as written
    assert json.loads(files[0].read_text())["data"][0]["spans"][0]["startTime"] == 1000


def test_summaries_in_the_file_read_as_their_exact_attributes(tmp_path: Path) -> None:
    """Issue 24 §4: one attnscope.summary per span, in units, agreeing with the exact attributes
    beside it; kernel.top as "name: time"; shapes as one compact string."""
    pytest.importorskip("transformers")
    from tests.support.helpers import check_summary_trace, summary_trace

    rows, shape = summary_trace(tmp_path / "t.json", "jaeger-json")
    check_summary_trace(rows, shape)
    raw = json.loads((tmp_path / "t.json").read_text())
    tagged = [t for tr in raw["data"] for s in tr["spans"] for t in s["tags"]
              if t["key"] == "attnscope.summary"]
    spans = [s for tr in raw["data"] for s in tr["spans"]]
    assert len(tagged) == len(spans) and all(t["type"] == "string" for t in tagged)
