"""The OTLP/JSON file exporter's lines, written directly (``_export/otlp_json_text.py``), are the
text the reference way writes (the SDK's ``encode_spans``, protobuf's ``MessageToDict``, ids to
hex), byte for byte."""

from __future__ import annotations

import logging
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext

from attnscope._export import otlp_json, otlp_json_text
from attnscope._export.otlp_encode import VARIANTS, probe_spans
from attnscope._export.otlp_json_text import JsonEncoder
from tests.test_otlp_encode import _model_spans, _random_spans, equal_values_of_other_types


def installed() -> JsonEncoder:
    """A new writer of the variant that matches the installed SDK."""
    found = otlp_json._fast()
    assert found is not None
    return JsonEncoder(found.flags, found.scope_schema)


@pytest.mark.parametrize("seed", range(12))
def test_random_spans_are_written_as_the_reference_writes_them(seed: int) -> None:
    spans = _random_spans(seed, 60)
    encoder = installed()
    assert encoder.line(spans) == otlp_json._reference_line(spans)
    again = spans[::-1]  # from the kept attribute texts
    assert encoder.line(again) == otlp_json._reference_line(again)


def test_equal_values_of_other_types_are_never_taken_for_each_other() -> None:
    encoder = installed()
    for spans in equal_values_of_other_types():
        assert encoder.line(spans) == otlp_json._reference_line(spans)


def test_attnscope_spans_are_written_as_the_reference_writes_them() -> None:
    spans = _model_spans()
    assert otlp_json._fast() is not None  # the installed SDK is matched: the fast way is used
    assert otlp_json._encode_line(spans) == otlp_json._reference_line(spans)
    assert installed().line(spans) == otlp_json._reference_line(spans)


def test_a_span_it_cannot_write_exactly_leaves_the_line_to_the_reference(
        caplog: pytest.LogCaptureFixture) -> None:
    huge = ReadableSpan(name="s", context=SpanContext(1, 2, False),
                        attributes={"big": 1 << 64, "ok": 1}, resource=Resource({}))
    assert installed().line([huge]) is None
    with caplog.at_level(logging.ERROR):  # the SDK drops the attribute, and says so
        assert otlp_json._encode_line([huge]) == otlp_json._reference_line([huge])


def test_a_writer_that_differs_from_the_reference_is_not_used(
        monkeypatch: pytest.MonkeyPatch) -> None:
    spans = probe_spans()
    reference = otlp_json._reference_line
    assert sum(otlp_json_text.matches_reference(JsonEncoder(*v), reference)
               for v in VARIANTS) == 1  # the probe tells the variants apart
    broken: Any = lambda status: "{}"  # noqa: E731
    monkeypatch.setattr(otlp_json_text, "_status", broken)
    otlp_json._fast.cache_clear()
    try:
        assert otlp_json._fast() is None
        assert otlp_json._encode_line(spans) == reference(spans)
    finally:
        otlp_json._fast.cache_clear()
