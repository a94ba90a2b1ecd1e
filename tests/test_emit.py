"""The direct path (a provider attnscope owns) gives the same spans as the SDK's tracer path."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import attnscope
from attnscope._state import state
from attnscope.worker.emit import DirectEmitter, SdkEmitter

SETTINGS: dict[str, Any] = {"sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0,
                            "profile_rate": 0.0, "metrics": False}


@attnscope.trace
def inner(q: torch.Tensor, fail: bool = False) -> torch.Tensor:
    if fail:
        raise ValueError("bad shapes")
    return q * 2


@attnscope.trace
def outer(q: torch.Tensor) -> torch.Tensor:
    return inner(q) + inner(q)


def _workload() -> None:
    q = torch.ones(1, 2, 4, 8)
    outer(q)
    with pytest.raises(ValueError):
        inner(q, fail=True)
    with attnscope.span("block", tokens=3):
        inner(q)


def _shape(spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
    """What a backend sees, ids replaced by names: comparable across runs."""
    by_id = {s.context.span_id: s.name for s in spans}
    out = []
    for s in spans:
        attrs = {k: v for k, v in (s.attributes or {}).items()
                 if not k.endswith(("_ns", "tflops", "tokens_per_s", "host_rss_bytes"))}
        events = [(e.name, sorted((e.attributes or {}).keys())) for e in s.events]
        parent = by_id.get(s.parent.span_id) if s.parent is not None else None
        out.append((s.name, parent, sorted(attrs.items()), s.status.status_code.name,
                    s.status.description, events, s.kind.name, s.instrumentation_scope.name
                    if s.instrumentation_scope else None))
    return sorted(out, key=repr)


def _run_owned() -> tuple[list[ReadableSpan], Any]:
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    _workload()
    assert attnscope.flush(timeout_s=10)
    emitter = state.worker.builder.emitter
    return list(exporter.get_finished_spans()), emitter


def _run_app_provider() -> tuple[list[ReadableSpan], Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    attnscope.configure(tracer_provider=provider, **SETTINGS)
    _workload()
    assert attnscope.flush(timeout_s=10)
    emitter = state.worker.builder.emitter
    return list(exporter.get_finished_spans()), emitter


def test_owned_provider_takes_the_direct_path_with_identical_spans() -> None:
    direct, direct_emitter = _run_owned()
    attnscope.shutdown()
    via_sdk, sdk_emitter = _run_app_provider()
    assert isinstance(direct_emitter, DirectEmitter) and isinstance(sdk_emitter, SdkEmitter)
    assert len(direct) == len(via_sdk) == 6
    assert _shape(direct) == _shape(via_sdk)
    [failed] = [s for s in direct if s.status.status_code.name == "ERROR"]
    [event] = failed.events
    assert event.attributes["exception.type"] == "ValueError"
    assert "bad shapes" in event.attributes["exception.stacktrace"]
    assert direct[0].resource.attributes["service.name"] == "attnscope"


def test_direct_path_nests_under_the_app_span_and_links_an_unrecorded_one() -> None:
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    app = TracerProvider()
    q = torch.ones(1, 2, 4, 8)
    with app.get_tracer("app").start_as_current_span("request") as request:
        inner(q)
    unrecorded = TracerProvider(sampler=ALWAYS_OFF).get_tracer("app")
    with unrecorded.start_as_current_span("dropped") as dropped:
        with attnscope.sampling(force=True):
            inner(q)
    assert attnscope.flush(timeout_s=10)
    first, second = exporter.get_finished_spans()
    assert first.parent.span_id == request.get_span_context().span_id
    assert first.context.trace_id == request.get_span_context().trace_id
    assert second.parent is None
    assert [link.context.span_id for link in second.links] == [
        dropped.get_span_context().span_id]


def test_direct_path_asks_the_providers_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    _workload()
    assert attnscope.flush(timeout_s=10)
    assert isinstance(state.worker.builder.emitter, DirectEmitter)
    assert exporter.get_finished_spans() == ()
    assert otel_trace.get_tracer_provider() is not None  # the global provider was left alone


def test_rates_keep_four_significant_digits_and_never_overflow() -> None:
    import sys

    from attnscope.worker.derived import sig4

    for x in (1234567.0, 0.000123456, -98765.4321, 3.0, 9.99951):
        assert sig4(x) == float(f"{x:.4g}")
    # the largest float rounds up past itself: kept as it is, never an OverflowError
    assert sig4(sys.float_info.max) == sys.float_info.max
    assert sig4(0.0) == 0.0 and sig4(float("inf")) == float("inf")
