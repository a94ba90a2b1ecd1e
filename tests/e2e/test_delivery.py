"""Spans lost after attnscope built them are counted, flush() says so, and a malformed OTEL_*
variable costs one log line, not the pipeline (issue 10 item 4)."""

from __future__ import annotations

import logging
from typing import Any

import pytest

import attnscope
from attnscope._runtime import COUNT_KEYS, runtime
from tests.e2e.otlp_fakes import HTTPCollector

CALLS = 20


def _traffic(n: int = CALLS) -> None:
    f = attnscope.trace(name="delivered")(lambda x: x + 1)
    for i in range(n):
        assert f(i) == i + 1


def _http(monkeypatch: pytest.MonkeyPatch, collector: HTTPCollector, **env: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    attnscope.configure(exporter="otlp-http", sample_rate=1.0, warmup_calls=0, profile_rate=0.0,
                        metrics=False)


def test_every_count_is_there_before_the_first_sampled_call() -> None:
    assert runtime.worker.current is None
    stats = attnscope.stats()
    for key in COUNT_KEYS:
        assert stats[key] == 0, key


def test_delivered_spans_are_counted_as_exported(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = HTTPCollector("ok").start()
    try:
        _http(monkeypatch, collector)
        _traffic()
        assert attnscope.flush(10)
        stats = attnscope.stats()
        assert stats["exported"] == CALLS == len(collector.spans)
        assert stats["export_failed"] == stats["export_dropped"] == 0
    finally:
        collector.stop()


def test_failed_exports_are_counted_and_flush_says_false(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = HTTPCollector("error").start()  # HTTP 500: not retried
    try:
        _http(monkeypatch, collector)
        _traffic()
        assert attnscope.flush(10) is False
        stats = attnscope.stats()
        assert stats["export_failed"] == CALLS
        assert stats["exported"] == 0
        assert stats["emitted"] == CALLS
    finally:
        collector.stop()


@pytest.mark.parametrize("env", [
    {"OTEL_EXPORTER_OTLP_TIMEOUT": "abc"},
    {"OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "-3"},
    {"OTEL_EXPORTER_OTLP_COMPRESSION": "zstd"},
    {"OTEL_BSP_MAX_QUEUE_SIZE": "0"},
    {"OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "-1"},
    {"OTEL_BSP_SCHEDULE_DELAY": "soon"},
    {"OTEL_BSP_MAX_QUEUE_SIZE": "64", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "128"},
], ids=lambda env: ",".join(f"{k}={v}" for k, v in env.items()))
def test_an_invalid_otel_variable_falls_back_and_is_named_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        env: dict[str, str]) -> None:
    collector = HTTPCollector("ok").start()
    try:
        _http(monkeypatch, collector, **env)
        with caplog.at_level(logging.WARNING, logger="attnscope"):
            _traffic()
            assert attnscope.flush(10)
        named = [r for r in caplog.records
                 if r.name == "attnscope" and any(var in r.getMessage() for var in env)]
        assert len(named) == 1, [r.getMessage() for r in caplog.records]
        assert len(collector.spans) == CALLS
        stats = attnscope.stats()
        assert stats["exported"] == CALLS and stats["internal_errors"] == 0
    finally:
        collector.stop()


@pytest.mark.parametrize("grpc", [True, False])
def test_an_invalid_endpoint_sends_nowhere(monkeypatch: pytest.MonkeyPatch, grpc: bool) -> None:
    # not the default endpoint: spans would go where the user did not ask (issue 35 §14)
    from attnscope._export.destinations import NowhereExporter, make_exporter

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://[::1")
    exporter: Any = make_exporter("otlp-grpc" if grpc else "otlp-http")
    assert isinstance(exporter, NowhereExporter)


@pytest.mark.internal_errors("pipeline")
def test_spans_of_a_pipeline_that_could_not_be_built_are_counted(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope._export import pipeline

    def broken(cfg: Any) -> Any:
        raise RuntimeError("no pipeline today")

    monkeypatch.setattr(pipeline, "build", broken)
    from attnscope._worker import loop

    monkeypatch.setattr(loop.Worker.__init__, "__defaults__", (broken, None))
    attnscope.configure(sample_rate=1.0, warmup_calls=0, profile_rate=0.0)
    _traffic()
    assert attnscope.flush(5) is False
    stats = attnscope.stats()
    assert stats["emitted"] == CALLS
    assert stats["export_dropped"] == CALLS
    assert stats["internal_errors"] == 1


def test_counts_survive_shutdown_and_a_new_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = HTTPCollector("ok").start()
    try:
        _http(monkeypatch, collector)
        _traffic(5)
        assert attnscope.shutdown(10)
        _traffic(7)
        assert attnscope.flush(10)
        stats = attnscope.stats()
        assert stats["captured"] == stats["emitted"] == stats["exported"] == 12
    finally:
        collector.stop()


def test_spans_the_batch_queue_drops_are_counted(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = HTTPCollector("ok").start()
    try:
        _http(monkeypatch, collector, OTEL_BSP_MAX_QUEUE_SIZE="4",
              OTEL_BSP_MAX_EXPORT_BATCH_SIZE="4", OTEL_BSP_SCHEDULE_DELAY="10000")
        _traffic(50)
        assert attnscope.flush(10) is False
        stats = attnscope.stats()
        assert stats["export_dropped"] > 0
        assert stats["exported"] + stats["export_dropped"] == 50 == stats["emitted"]
        assert stats["exported"] == len(collector.spans)
    finally:
        collector.stop()
