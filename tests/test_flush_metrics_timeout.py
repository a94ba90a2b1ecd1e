"""A metrics flush that runs out of time is a False flush, not an internal error: with no
collector on a loaded machine it was one more line on stderr at exit (issue 38 §5)."""

from __future__ import annotations

import io
from typing import Any

from opentelemetry.sdk.metrics import MeterProvider, MetricsTimeoutError
from opentelemetry.sdk.metrics.export import (
    ConsoleMetricExporter,
    PeriodicExportingMetricReader,
)

from attnscope import _log
from attnscope._export.pipeline import _flush_metrics


class _SlowReader(PeriodicExportingMetricReader):
    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        raise MetricsTimeoutError("Timed out while flushing metric readers")


def test_a_timed_out_metrics_flush_is_false_and_no_internal_error() -> None:
    reader = _SlowReader(ConsoleMetricExporter(out=io.StringIO()), export_interval_millis=60_000)
    provider = MeterProvider(metric_readers=[reader])
    errors = _log.error_count()
    try:
        assert _flush_metrics(provider, 100) is False
        assert _log.error_count() == errors
    finally:
        provider.shutdown(timeout_millis=1_000)


def test_a_provider_without_readers_list_times_out_the_same() -> None:
    class Provider:
        def force_flush(self, timeout_ms: Any) -> bool:
            raise MetricsTimeoutError("Timed out")

    assert _flush_metrics(Provider(), 100) is False
