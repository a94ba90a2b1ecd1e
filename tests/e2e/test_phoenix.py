"""attnscope → OTLP (gRPC and HTTP) → Arize Phoenix, read back through Phoenix's REST API.

Phoenix keeps names, parents, attributes (with JSON types), status and events, with timestamps to
the microsecond; it drops resource attributes and span kind, so those are checked elsewhere.
"""

from __future__ import annotations

import time
from datetime import datetime
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import attnscope
from attnscope._derive.call import attention_flops

pytestmark = pytest.mark.e2e

B, H, S, D = 2, 4, 16, 8


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = True) -> Any:
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


@attnscope.trace(name="broken_attention")
def broken_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    raise RuntimeError("k and v disagree in the test")


def _app_exporter(protocol: str, phoenix: Any) -> Any:
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(endpoint=phoenix.grpc_endpoint, insecure=True)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTP

    return HTTP(endpoint=f"{phoenix.http_endpoint}/v1/traces")


def _us(stamp: str) -> int:
    """Phoenix's ISO timestamp → microseconds since the epoch."""
    dt = datetime.fromisoformat(stamp)
    return int(dt.timestamp()) * 1_000_000 + dt.microsecond


@pytest.mark.parametrize(("exporter", "protocol"), [("otlp", "grpc"), ("otlp-http", "http")])
def test_spans_arrive_in_phoenix_with_parents_attributes_errors_and_timing(
    phoenix: Any, monkeypatch: pytest.MonkeyPatch, exporter: str, protocol: str
) -> None:
    endpoint = phoenix.grpc_endpoint if protocol == "grpc" else phoenix.http_endpoint
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_SERVICE_NAME", f"attnscope-e2e-{protocol}")
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")  # Phoenix takes traces only
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0)

    # The application's own tracing (its own provider, not the global one) owns the request span.
    app_provider = TracerProvider()
    app_provider.add_span_processor(SimpleSpanProcessor(_app_exporter(protocol, phoenix)))
    app_tracer = app_provider.get_tracer("e2e-app")

    torch.manual_seed(0)
    q, k, v = (torch.randn(B, H, S, D) for _ in range(3))
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t0_us = time.time_ns() // 1000
    with app_tracer.start_as_current_span(f"handle-request-{protocol}") as request_span:
        with attnscope.span("decode-step", tokens=B * S):
            out1 = attention(q, k, v, is_causal=True)
            out2 = attention(q, k, v, is_causal=False)
            with pytest.raises(RuntimeError, match="k and v disagree") as excinfo:
                broken_attention(q, k, v)
    t1_us = time.time_ns() // 1000
    # The user's results and exception are untouched.
    assert torch.equal(out1, expected)
    assert torch.equal(out2, F.scaled_dot_product_attention(q, k, v))
    assert excinfo.traceback[-1].name == "broken_attention"

    assert attnscope.flush(timeout_s=20.0)
    app_provider.shutdown()
    assert attnscope.stats()["emitted"] == 4

    trace_id = f"{request_span.get_span_context().trace_id:032x}"
    spans = phoenix.wait_for_spans(trace_id, 5)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for s in spans:
        by_name.setdefault(s["name"], []).append(s)
    assert sorted(by_name) == sorted(
        [f"handle-request-{protocol}", "decode-step", "attention", "broken_attention"]
    ), phoenix.tail()
    assert len(spans) == 5
    (root,) = by_name[f"handle-request-{protocol}"]
    (step,) = by_name["decode-step"]
    (failing,) = by_name["broken_attention"]
    calls = sorted(by_name["attention"], key=lambda s: _us(s["start_time"]))
    assert len(calls) == 2

    # Parents: request → decode-step → the three attention calls.
    assert root["parent_id"] is None
    assert root["context"]["span_id"] == f"{request_span.get_span_context().span_id:016x}"
    assert step["parent_id"] == root["context"]["span_id"]
    for child in (*calls, failing):
        assert child["parent_id"] == step["context"]["span_id"]

    # Attribute values and their JSON types.
    causal, full = (c["attributes"] for c in calls)
    for attrs, is_causal in ((causal, True), (full, False)):
        assert attrs["attnscope.batch_size"] == B and type(attrs["attnscope.batch_size"]) is int
        assert attrs["attnscope.num_heads"] == H and type(attrs["attnscope.num_heads"]) is int
        assert attrs["attnscope.num_kv_heads"] == H
        assert attrs["attnscope.seq_len_q"] == S and attrs["attnscope.seq_len_kv"] == S
        assert attrs["attnscope.head_dim"] == D
        assert attrs["attnscope.dtype"] == "float32"
        assert attrs["attnscope.device"] == "cpu"
        assert attrs["attnscope.causal"] is is_causal
        assert attrs["attnscope.flops"] == attention_flops(B, H, S, S, D, D, is_causal)
        assert type(attrs["attnscope.flops"]) is int
        assert attrs["attnscope.tokens"] == B * S
        assert attrs["attnscope.tier"] == "timing"
        assert attrs["attnscope.sample_rate"] == 1.0
        assert type(attrs["attnscope.sample_rate"]) is float
        assert type(attrs["attnscope.wall_ns"]) is int and attrs["attnscope.wall_ns"] > 0
        assert type(attrs["attnscope.tflops"]) is float and attrs["attnscope.tflops"] > 0
        assert type(attrs["attnscope.tokens_per_s"]) is float
    assert step["attributes"]["attnscope.tokens"] == B * S

    # Error status and the exception event on the failing call only.
    assert failing["status_code"] == "ERROR"
    assert failing["status_message"].startswith("RuntimeError: k and v disagree")
    (event,) = [e for e in failing["events"] if e["name"] == "exception"]
    assert event["attributes"]["exception.type"] == "RuntimeError"
    assert event["attributes"]["exception.message"] == "k and v disagree in the test"
    assert "broken_attention" in event["attributes"]["exception.stacktrace"]
    for ok_span in (root, step, *calls):
        assert ok_span["status_code"] != "ERROR"
        assert not [e for e in ok_span["events"] if e["name"] == "exception"]

    # Timing: inside the test's window, children inside their parent, in call order, and each
    # span as long as the wall time attnscope measured (Phoenix keeps microseconds; ends are
    # start + a perf_counter interval, so allow a couple of µs between the two clocks).
    slack = 2
    assert t0_us - slack <= _us(root["start_time"]) and _us(root["end_time"]) <= t1_us + slack
    for parent, children in ((root, [step]), (step, [*calls, failing])):
        for child in children:
            assert _us(parent["start_time"]) <= _us(child["start_time"]) + slack
            assert _us(child["end_time"]) <= _us(parent["end_time"]) + slack
    assert _us(calls[0]["end_time"]) <= _us(calls[1]["start_time"]) + slack
    assert _us(calls[1]["end_time"]) <= _us(failing["start_time"]) + slack
    for call in calls:
        measured_us = call["attributes"]["attnscope.wall_ns"] / 1000
        stored_us = _us(call["end_time"]) - _us(call["start_time"])
        assert abs(stored_us - measured_us) <= 2, (stored_us, measured_us)
