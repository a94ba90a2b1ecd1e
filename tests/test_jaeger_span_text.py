"""A span's Jaeger JSON text as the exporter writes it (``SpanWriter``, each tag's text kept) is
``dumps`` of a dict of its fields (``span_fields``, the exporter's way before, kept here as the
reference), character for character."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from attnscope._export import kept
from attnscope._export.jaeger_encode import (
    _UNNAMED,
    SpanWriter,
    _kind_tags,
    _references,
    _scope_tags,
    _status_tags,
    _tag,
    dumps,
    parts_of_fields,
    span_fields_rest,
)
from tests.test_otlp_encode import _model_spans, _random_spans, equal_values_of_other_types


def span_fields(span: ReadableSpan) -> dict[str, object]:
    """Everything about ``span`` as a dict of JSON values, one dict per tag."""
    ctx = span.context
    rest = span_fields_rest(span)
    start_ns = span.start_time or 0
    end_ns = span.end_time or start_ns
    tags = ([_tag(k, v) for k, v in (span.attributes or {}).items()]
            + _scope_tags(span.instrumentation_scope) + _kind_tags(span.kind)
            + _status_tags(span.status))
    return {"traceID": f"{ctx.trace_id:032x}", "spanID": f"{ctx.span_id:016x}",
            "operationName": span.name or _UNNAMED, "references": _references(span),
            "startTime": start_ns // 1000, "duration": max(0, end_ns - start_ns) // 1000,
            "tags": tags, "logs": rest["logs"], "processID": "", "warnings": rest["warnings"]}


def _reference(span: ReadableSpan, pid: str) -> str:
    fields = span_fields(span)
    fields["processID"] = pid
    return dumps(fields)


def _written(writer: SpanWriter, span: ReadableSpan, pid: str) -> str:
    head, tail = writer.parts(span)
    return head + pid + tail


@pytest.mark.parametrize("seed", range(12))
def test_random_spans_are_written_as_their_fields_dump(seed: int) -> None:
    spans = _random_spans(seed, 60)
    writer = SpanWriter()
    for pid in ("p1", "p12"):  # twice: the second time from the kept tag texts
        for span in spans:
            assert _written(writer, span, pid) == _reference(span, pid)


def test_equal_values_of_other_types_are_never_taken_for_each_other() -> None:
    writer = SpanWriter()
    for spans in equal_values_of_other_types():
        for span in spans:
            assert _written(writer, span, "p1") == _reference(span, "p1")


def test_attnscope_spans_are_written_as_their_fields_dump() -> None:
    writer = SpanWriter()
    for span in _model_spans():
        assert _written(writer, span, "p1") == _reference(span, "p1")


def test_kept_tag_texts_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept, "MAX", 20)
    writer = SpanWriter()
    for i in range(100):
        span = ReadableSpan(name="s", context=SpanContext(1, i + 1, False),
                            attributes={"i": i, "s": str(i)}, resource=Resource({}))
        assert _written(writer, span, "p1") == _reference(span, "p1")
    assert len(writer._tags.entries) <= 20


def test_fields_read_back_make_the_same_text() -> None:
    import json

    for span in _random_spans(3, 40):
        text = _reference(span, "p3")
        head, tail = parts_of_fields(json.loads(text))
        assert head + "p3" + tail == text


@pytest.mark.parametrize("value", [None, b"\x00bytes", {"k": 1}, ((1, 2),), (1, None),
                                   float("nan"), -float("inf")])
def test_other_values_are_written_as_their_fields_dump(value: object) -> None:
    writer = SpanWriter()
    span = ReadableSpan(name="s", context=SpanContext(1, 2, False), attributes={"v": value},
                        resource=Resource({}))
    for _ in range(2):
        assert _written(writer, span, "p1") == _reference(span, "p1")
