"""Exemplars on the latency histogram: data points carry the trace and span id of a sampled call
(the SDK's trace-based exemplar filter), read back with the in-memory metric reader."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import attnscope

pytest.importorskip("opentelemetry.sdk.metrics._internal.exemplar")  # SDK >= 1.28


@pytest.fixture(autouse=True)
def _bare(bare_env: None) -> None:
    """No OTEL_*/ATTNSCOPE_* variables from the outside (OTEL_METRICS_EXEMPLAR_FILTER included)."""


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _calls(n: int) -> None:
    q = torch.randn(1, 2, 4, 8)
    for _ in range(n):
        attention(q, q, q)


def _exemplars(reader: InMemoryMetricReader, name: str) -> list[Any]:
    data = reader.get_metrics_data()
    assert data is not None
    found = []
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name == name:
                    for point in metric.data.data_points:
                        assert point.count > 0
                        found.extend(point.exemplars)
    return found


def _configure(reader: InMemoryMetricReader, **settings: Any) -> None:
    attnscope.configure(meter_provider=MeterProvider(metric_readers=[reader]), metrics=True,
                        sample_rate=1.0, warmup_calls=0, profile_rate=0.0, overhead_budget=1.0,
                        **settings)


def test_duration_exemplars_point_at_emitted_spans() -> None:
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    _configure(reader, exporter=spans)  # attnscope's own provider: spans made directly
    _calls(5)
    assert attnscope.flush(timeout_s=10.0)
    emitted = {(s.context.trace_id, s.context.span_id) for s in spans.get_finished_spans()
               if s.name == "attention"}
    assert len(emitted) == 5
    exemplars = _exemplars(reader, "attnscope.attention.duration")
    assert exemplars  # one per bucket the calls fell in, at least
    for exemplar in exemplars:
        assert (exemplar.trace_id, exemplar.span_id) in emitted
        assert exemplar.value > 0


def test_exemplars_through_the_applications_provider() -> None:
    reader = InMemoryMetricReader()
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    _configure(reader, tracer_provider=provider)
    _calls(3)
    assert attnscope.flush(timeout_s=10.0)
    emitted = {(s.context.trace_id, s.context.span_id) for s in spans.get_finished_spans()}
    exemplars = _exemplars(reader, "attnscope.attention.duration")
    assert exemplars and all((e.trace_id, e.span_id) in emitted for e in exemplars)


def test_no_exemplar_for_a_span_the_sampler_dropped() -> None:
    reader = InMemoryMetricReader()
    _configure(reader, tracer_provider=TracerProvider(sampler=ALWAYS_OFF))
    _calls(3)
    assert attnscope.flush(timeout_s=10.0)
    # the histogram still counts the calls (asserted in _exemplars), with no trace to link to
    assert _exemplars(reader, "attnscope.attention.duration") == []


def test_step_calls_link_to_the_step_trace() -> None:
    from attnscope._spans.steps import step_ids

    reader = InMemoryMetricReader()
    _configure(reader, exporter=InMemorySpanExporter(), run_id="job-x")
    attnscope.step(4)
    _calls(2)
    assert attnscope.flush(timeout_s=10.0)
    exemplars = _exemplars(reader, "attnscope.attention.duration")
    assert exemplars and {e.trace_id for e in exemplars} == {step_ids("job-x", 4, 0)[0]}
