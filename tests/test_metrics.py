"""OTel metrics recorded by the worker, read back with the SDK's in-memory metric reader."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from opentelemetry import metrics as otel_metrics
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import (
    InMemoryMetricReader,
    MetricExporter,
    MetricExportResult,
    PeriodicExportingMetricReader,
)

import attnscope
from attnscope import _config, _log
from attnscope._export import metrics as _metrics
from attnscope._export import pipeline as _provider
from attnscope._runtime import runtime
from attnscope._worker import engine as _engine
from attnscope.testing import capture_spans


@pytest.fixture(autouse=True)
def _bare(bare_env: None) -> None:
    """No OTEL_*/ATTNSCOPE_* variables from the outside (the root conftest resets attnscope)."""


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _metrics_by_name(reader: InMemoryMetricReader) -> dict[str, Any]:
    data = reader.get_metrics_data()
    out: dict[str, Any] = {}
    if data is None:
        return out
    for rm in data.resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                out[metric.name] = metric
    return out


def _points(metric: Any) -> list[Any]:
    return list(metric.data.data_points)


def test_duration_tokens_and_labels(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    q = torch.randn(2, 2, 8, 4)
    with capture_spans(meter_provider=meter_provider) as spans:
        for _ in range(5):
            attention(q, q, q)
        with attnscope.span("decode", tokens=3, attributes={"attnscope.phase": "decode",
                                                            "attnscope.backend": "math"}):
            pass
    metrics = _metrics_by_name(reader)
    duration = metrics["attnscope.attention.duration"]
    assert duration.unit == "s"
    points = {tuple(sorted(p.attributes.items())): p for p in _points(duration)}
    calls = points[(("attnscope.device", "cpu"), ("attnscope.module_class", "attention"))]
    assert calls.count == 5
    walls = [s.attributes["attnscope.wall_ns"] for s in spans if s.name == "attention"]
    assert calls.sum == pytest.approx(sum(walls) / 1e9)
    assert list(calls.explicit_bounds) == list(_metrics.DURATION_BUCKETS_S)
    assert calls.explicit_bounds[0] == 1e-5 and calls.explicit_bounds[-1] == 10.0
    block = points[(("attnscope.backend", "math"), ("attnscope.module_class", "decode"),
                    ("attnscope.phase", "decode"))]
    assert block.count == 1

    tokens = metrics["attnscope.attention.tokens"]
    assert tokens.unit == "{token}"
    by_module = {p.attributes["attnscope.module_class"]: p.value for p in _points(tokens)}
    assert by_module == {"attention": 5 * 2 * 8, "decode": 3}


def _result(attrs: dict[str, Any], name: str = "site") -> Any:
    """What the recorder reads of a built span (a worker.spans.Result)."""
    return SimpleNamespace(name=name, attrs=attrs)


def test_recorder_weights_prefers_device_time_and_records_memory(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    record = _metrics._instruments_for(meter_provider).record
    record(_result({"attnscope.wall_ns": 5_000_000, "attnscope.device_ns": 2_000_000,
                    "attnscope.tokens": 10, "attnscope.sample_rate": 0.25,
                    "attnscope.memory.peak_bytes": 3 * 2**20, "attnscope.device": "cuda:0",
                    "attnscope.module": "model.layers.0.self_attn",
                    "attnscope.module_class": "LlamaAttention", "attnscope.phase": 7}))
    metrics = _metrics_by_name(reader)
    (duration,) = _points(metrics["attnscope.attention.duration"])
    assert duration.sum == pytest.approx(0.002)  # device time wins over wall time
    # the class, not the path (one series per layer); a non-string label is dropped
    assert dict(duration.attributes) == {"attnscope.module_class": "LlamaAttention",
                                         "attnscope.device": "cuda:0"}
    (tokens,) = _points(metrics["attnscope.attention.tokens"])
    assert tokens.value == pytest.approx(40.0)  # 10 sampled tokens at rate 1/4
    peak = metrics["attnscope.memory.peak"]
    assert peak.unit == "By"
    (point,) = _points(peak)
    assert point.count == 1 and point.sum == 3 * 2**20


def test_the_duration_leaves_out_calls_the_profiler_ran_over(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    """A profiled call, and a call timed inside or around one, ran slowed by the profiler: their
    times are not the attention's. Their tokens and memory peaks still count."""
    record = _metrics._instruments_for(meter_provider).record
    base = {"attnscope.tier": "timing", "attnscope.tokens": 4, "attnscope.sample_rate": 1.0,
            "attnscope.memory.peak_bytes": 1024}
    record(_result({**base, "attnscope.wall_ns": 1_000}))
    record(_result({**base, "attnscope.wall_ns": 50_000, "attnscope.tier": "profile"}))
    for by in ("enclosing", "nested"):
        record(_result({**base, "attnscope.wall_ns": 20_000, "attnscope.profiled_by": by}))
    metrics = _metrics_by_name(reader)
    (duration,) = _points(metrics["attnscope.attention.duration"])
    assert duration.count == 1 and duration.sum == pytest.approx(1e-6)
    (tokens,) = _points(metrics["attnscope.attention.tokens"])
    assert tokens.value == pytest.approx(16.0)
    (peak,) = _points(metrics["attnscope.memory.peak"])
    assert peak.count == 4


def test_a_fallback_is_counted_once_on_the_profiled_call(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    """The layer around a profiled SDPA call, or the one timed inside a profiled decoder layer,
    carries that call's verdict too: one SDPA call, one count."""
    record = _metrics._instruments_for(meter_provider).record
    fell = {"attnscope.backend.fallback": True, "attnscope.wall_ns": 1_000}
    record(_result({**fell, "attnscope.tier": "profile"}))
    for by in ("enclosing", "nested"):
        record(_result({**fell, "attnscope.tier": "timing", "attnscope.profiled_by": by}))
    (point,) = _points(_metrics_by_name(reader)["attnscope.attention.backend_fallbacks"])
    assert point.value == 1


def test_recorder_never_raises(meter_provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    record = _metrics._instruments_for(meter_provider).record
    record(_result({"attnscope.wall_ns": "not a number", "attnscope.tokens": True}))
    record(_result({}))
    assert _log.error_count() == 0


def test_metrics_wait_for_the_end_of_the_workers_batch() -> None:
    seen: list[Any] = []
    batch = _engine.MetricsBatch(lambda result, span_context: seen.append(result))
    batch.add("a", None)
    batch.add("b", None)
    assert seen == [] and len(batch.held) == 2
    batch.drain()
    assert seen == ["a", "b"] and not batch.held
    for i in range(_engine._METRICS_BATCH_MAX):  # bounded: recorded once the batch is full
        batch.add(i, None)
    assert seen[2:] == list(range(_engine._METRICS_BATCH_MAX)) and not batch.held


def test_flush_returns_once_every_calls_metrics_are_recorded(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    calls = _engine._METRICS_BATCH_MAX + 100  # more than one batch
    q = torch.randn(1, 2, 4, 8)
    with capture_spans(meter_provider=meter_provider):
        for _ in range(calls):
            attention(q, q, q)
        assert attnscope.flush(timeout_s=30.0)
        (point,) = _points(_metrics_by_name(reader)["attnscope.attention.duration"])
        assert point.count == calls


def test_instruments_are_made_once_per_provider(meter_provider: MeterProvider) -> None:
    assert _metrics._instruments_for(meter_provider) is _metrics._instruments_for(meter_provider)


@pytest.mark.internal_errors("test")
def test_dropped_spans_and_internal_errors_are_counted(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    # Totals are process-wide (they survive worker restarts): compare with what they were.
    reasons = ("queue_full", "trace_cap", "export_failed", "export_queue_full")
    baseline = {r: _metrics._current_total("dropped:" + r) for r in reasons}
    q = torch.randn(1, 1, 4, 4)
    with capture_spans(meter_provider=meter_provider, max_spans_per_trace=1) as spans:
        with attnscope.span("outer"):
            attention(q, q, q)
            attention(q, q, q)
        _log.internal_error("test", RuntimeError("boom"))
        attnscope.flush()
        metrics = _metrics_by_name(reader)
    assert [s.name for s in spans] == ["outer"]
    dropped = {p.attributes["reason"]: p.value - baseline[p.attributes["reason"]]
               for p in _points(metrics["attnscope.spans.dropped"])}
    assert dropped == {"queue_full": 0, "trace_cap": 2, "export_failed": 0, "export_queue_full": 0}
    (errors,) = _points(metrics["attnscope.internal_errors"])
    before = errors.value
    assert before >= 1
    # Counters never go down when the counts they read restart.
    runtime.log.errors_by_stage.clear()  # as if the count had restarted
    (errors,) = _points(_metrics_by_name(reader)["attnscope.internal_errors"])
    assert errors.value == before
    for _ in range(before + 2):
        _log.internal_error("test", RuntimeError("again"))
    (errors,) = _points(_metrics_by_name(reader)["attnscope.internal_errors"])
    assert errors.value == 2 * before + 2


class _ListMetricExporter(MetricExporter):
    def __init__(self) -> None:
        super().__init__()
        self.batches: list[Any] = []

    def export(self, metrics_data: Any, timeout_millis: float = 10_000, **kwargs: Any) -> Any:
        self.batches.append(metrics_data)
        return MetricExportResult.SUCCESS

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return True

    def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
        return None


def test_skipped_profiles_are_counted_by_reason(
    monkeypatch: pytest.MonkeyPatch, meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:
    counts = {"profiled": 4, "skipped_busy": 0, "skipped_warming": 0}
    monkeypatch.setattr(runtime.profiler, "counts", counts)
    _metrics._instruments_for(meter_provider)

    def skipped() -> dict[str, int]:
        metric = _metrics_by_name(reader)["attnscope.profiles.skipped"]
        return {p.attributes["reason"]: p.value for p in _points(metric)}

    before = skipped()
    assert set(before) == {"busy", "warming"}
    counts["skipped_busy"] = 3
    after = skipped()
    assert after["busy"] - before["busy"] == 3 and after["warming"] == before["warming"]


def test_flush_exports_metrics_and_metrics_false_records_nothing() -> None:
    exporter = _ListMetricExporter()
    mp = MeterProvider(metric_readers=[PeriodicExportingMetricReader(
        exporter, export_interval_millis=3_600_000)])
    q = torch.randn(1, 1, 4, 4)
    try:
        with capture_spans(meter_provider=mp):
            attention(q, q, q)
            assert attnscope.flush(timeout_s=5.0)
            names = {m.name for batch in exporter.batches for rm in batch.resource_metrics
                     for sm in rm.scope_metrics for m in sm.metrics}
            assert "attnscope.attention.duration" in names
        reader = InMemoryMetricReader()
        off = MeterProvider(metric_readers=[reader])
        with capture_spans(meter_provider=off, metrics=False) as spans:
            attention(q, q, q)
        assert len(spans) == 1
        assert "attnscope.attention.duration" not in _metrics_by_name(reader)
        off.shutdown()
    finally:
        mp.shutdown()


# ---- which meter provider ------------------------------------------------------------------------


def _pipeline(**settings: Any) -> _provider.Pipeline:
    return _provider.build(_config.Config(**settings))


def test_app_global_meter_provider_is_used_and_not_owned(
    monkeypatch: pytest.MonkeyPatch, meter_provider: MeterProvider
) -> None:
    monkeypatch.setattr(otel_metrics, "get_meter_provider", lambda: meter_provider)
    pipeline = _pipeline(exporter="none")
    assert pipeline.meter_provider is meter_provider and not pipeline.meter_owned


def test_configured_meter_provider_wins(meter_provider: MeterProvider) -> None:
    pipeline = _pipeline(exporter="otlp", meter_provider=meter_provider)
    assert pipeline.meter_provider is meter_provider and not pipeline.meter_owned
    pipeline.shutdown(timeout_ms=1000)


@pytest.mark.parametrize(
    ("settings", "env", "expected"),
    [
        ({"exporter": "otlp"}, {}, "grpc"),
        ({"exporter": "otlp-http"}, {}, "http"),
        ({"exporter": "otlp"}, {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, "http"),
        ({"exporter": "otlp"}, {"OTEL_EXPORTER_OTLP_METRICS_PROTOCOL": "http/protobuf"}, "http"),
        ({"exporter": "otlp"}, {"OTEL_METRICS_EXPORTER": "none"}, None),
        ({"exporter": "none"}, {}, None),  # spans not sent over OTLP: metrics neither
        ({"exporter": "none"}, {"OTEL_METRICS_EXPORTER": "otlp"}, "grpc"),
        ({"exporter": "otlp", "metrics": False}, {}, None),
    ],
)
def test_own_meter_provider_follows_the_configuration(
    monkeypatch: pytest.MonkeyPatch, settings: dict[str, Any], env: dict[str, str],
    expected: str | None,
) -> None:
    monkeypatch.setattr(otel_metrics, "get_meter_provider", otel_metrics.NoOpMeterProvider)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")  # never reached
    pipeline = _pipeline(**settings)
    try:
        if expected is None:
            assert pipeline.meter_provider is None
            return
        assert pipeline.meter_owned
        (reader,) = pipeline.meter_provider._metric_readers
        exporter = getattr(reader._exporter, "inner", reader._exporter)  # reporting's guard
        module = type(exporter).__module__
        assert (".http." in module) == (expected == "http"), module
        resource = pipeline.meter_provider._sdk_config.resource.attributes
        assert resource["attnscope.version"] == attnscope.__version__
        # the settings configure() may change later are the spans' (a meter provider's resource
        # is fixed): none of them here, the rest of the spans' resource as it is
        spans = pipeline.provider.resource.attributes
        assert not [k for k in resource if k.startswith("attnscope.config.")]
        assert [k for k in spans if k.startswith("attnscope.config.")]
        assert {k: v for k, v in spans.items() if not k.startswith("attnscope.config.")} \
            == dict(resource)
    finally:
        if pipeline.meter_provider is not None:
            pipeline.meter_provider.shutdown(timeout_millis=100)
        pipeline.provider.shutdown()


def test_own_meter_provider_is_shut_down_with_the_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(otel_metrics, "get_meter_provider", otel_metrics.NoOpMeterProvider)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "3600000")
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0)
    q = torch.randn(1, 1, 4, 4)
    attention(q, q, q)
    assert attnscope.flush(timeout_s=5.0)  # the worker builds its pipeline on its own thread
    worker = runtime.worker.current
    assert worker is not None and worker.pipeline.meter_owned
    calls: list[Any] = []
    mp = worker.pipeline.meter_provider
    real_shutdown = mp.shutdown
    monkeypatch.setattr(mp, "shutdown", lambda **kw: (calls.append(kw), real_shutdown(**kw)))
    monkeypatch.setattr(mp, "force_flush", lambda timeout_millis=0: True)  # no console output
    assert attnscope.shutdown(timeout_s=5.0)
    assert len(calls) == 1


def test_prometheus_reader_serves_the_histogram(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("opentelemetry.exporter.prometheus", reason="the [prometheus] extra")
    import urllib.request

    from tests.e2e.otlp_fakes import free_port

    port = free_port()
    monkeypatch.setattr(otel_metrics, "get_meter_provider", otel_metrics.NoOpMeterProvider)
    monkeypatch.setattr(runtime.metrics, "prometheus_started", False)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "prometheus")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_HOST", "127.0.0.1")
    monkeypatch.setenv("OTEL_EXPORTER_PROMETHEUS_PORT", str(port))
    # profile_rate 0: a profiled call (5% at the default) records no duration
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0)
    q = torch.randn(1, 1, 4, 4)
    attention(q, q, q)
    assert attnscope.flush(timeout_s=5.0)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    assert "attnscope_attention_duration_seconds_bucket{" in text
    assert 'attnscope_module_class="attention"' in text
    # flush() must not make the pull reader queue extra copies of each series.
    assert text.count("attnscope_attention_duration_seconds_count{") == 1


def test_effective_rates_and_overhead_are_gauges(
    meter_provider: MeterProvider, reader: InMemoryMetricReader
) -> None:

    q = torch.randn(1, 1, 4, 4)
    with capture_spans(meter_provider=meter_provider, sample_rate=0.5, profile_rate=0.2,
                       overhead_budget=0.01):
        runtime.sampler.budget.scale = 0.25  # as if the budget had cut the rates
        runtime.sampler.budget.profile_scale = 0.25
        runtime.sampler.budget.last_ratio = 0.02
        with attnscope.sampling(force=True):  # one capture, so the worker (and metrics) start
            attention(q, q, q)
        attnscope.flush()
        metrics = _metrics_by_name(reader)
    rates = {p.attributes["tier"]: p.value
             for p in _points(metrics["attnscope.sampling.effective_rate"])}
    assert rates == {"timing": pytest.approx(0.125), "profile": pytest.approx(0.05)}
    (ratio,) = _points(metrics["attnscope.overhead.ratio"])
    assert ratio.value == pytest.approx(0.02)


def test_the_metrics_answer_is_seen_after_a_traces_failure_logged_just_before() -> None:
    """The OTLP exporters' DuplicateFilter drops a record whose message template was logged in
    the last 20 s, and "Failed to export %s to %s ..." is one template for traces and metrics:
    attnscope's filter must see the metrics answer first, or metric export never switches off
    (the e2e test failed whenever a trace export had failed just before, on the same logger)."""
    import logging

    import grpc
    from opentelemetry.exporter.otlp.proto.grpc import exporter as grpc_exporter

    from attnscope._export import otlp_status as reporting

    reporting.install_log_filter()
    logger = logging.getLogger(grpc_exporter.__name__)
    template = "Failed to export %s to %s, error code: %s, error details: %s"
    logger.error(template, "traces", "localhost:4317", grpc.StatusCode.UNAVAILABLE, "down")
    with reporting.exporting() as records:
        logger.error(template, "metrics", "localhost:4317", grpc.StatusCode.UNIMPLEMENTED, "no")
    assert reporting.unsupported(records) == "gRPC UNIMPLEMENTED"
