"""Metrics to a traces-only backend (issue 11 item 7): Phoenix answers 405 over HTTP and
UNIMPLEMENTED over gRPC; attnscope switches metric export off after that first answer, says so
once at INFO, keeps the exporter's own lines off the console and still delivers every span."""

from __future__ import annotations

import logging
import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._runtime import runtime

pytestmark = pytest.mark.e2e


@attnscope.trace
def attention(q: torch.Tensor) -> Any:
    return F.scaled_dot_product_attention(q, q, q)


def _guard() -> Any:
    worker = runtime.worker.current
    assert worker is not None
    readers = worker.pipeline.meter_provider._metric_readers
    (reader,) = readers
    return reader._exporter


@pytest.mark.parametrize(("exporter", "answer"), [("otlp-http", "HTTP 405"),
                                                  ("otlp-grpc", "gRPC UNIMPLEMENTED")])
def test_metric_export_switches_off_after_the_first_unsupported_answer(
    phoenix: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    exporter: str, answer: str,
) -> None:
    endpoint = phoenix.http_endpoint if exporter == "otlp-http" else phoenix.grpc_endpoint
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    caplog.set_level(logging.INFO)
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, metrics=True,
                        profile_rate=0.0)
    q = torch.randn(1, 2, 8, 4)
    attention(q)
    attnscope.flush(timeout_s=10)
    guard = _guard()
    # a flush returns at its timeout while the export finishes on its own thread: on a loaded
    # machine the first answer may come a little after it, and the first answer is what counts
    deadline = time.monotonic() + 30
    while not guard.off and time.monotonic() < deadline:
        time.sleep(0.1)
    assert guard.off, caplog.text
    attention(q)
    attnscope.flush(timeout_s=10)  # metrics are not sent again

    said = [r for r in caplog.records if r.name == "attnscope"
            and "does not accept metrics" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert answer in said[0].getMessage()
    noise = [r for r in caplog.records if r.name.startswith("opentelemetry")
             and r.levelno >= logging.WARNING]
    assert noise == []
    stats = attnscope.stats()
    assert stats["export_failed"] == 0 and stats["exported"] >= 2


def test_otel_metrics_exporter_none_opens_no_metric_export(
    phoenix: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.http_endpoint)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    caplog.set_level(logging.INFO)
    attnscope.configure(exporter="otlp-http", sample_rate=1.0, warmup_calls=0, metrics=True,
                        profile_rate=0.0)
    attention(torch.randn(1, 2, 8, 4))
    assert attnscope.flush(timeout_s=10)
    worker = runtime.worker.current
    assert worker is not None and worker.pipeline.meter_provider is None
    assert "metrics" not in caplog.text
    assert attnscope.stats()["exported"] >= 1
