"""OpenTelemetry metrics, recorded on the worker for every emitted span.

Instruments (see docs/exporting.md):

- ``attnscope.attention.duration`` histogram, seconds (device time when measured, else wall),
  explicit buckets from 10 µs to 10 s;
- ``attnscope.attention.tokens`` counter, tokens of sampled calls divided by their sample rate;
- ``attnscope.memory.peak`` histogram, bytes;
- ``attnscope.spans.dropped`` (by ``reason``), ``attnscope.profiles.skipped`` and
  ``attnscope.internal_errors``: observable counters read from attnscope's own counts.

The first three carry ``attnscope.module`` / ``attnscope.backend`` / ``attnscope.device`` /
``attnscope.phase`` when the span has them.
"""

from __future__ import annotations

import importlib
import os
import threading
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeGuard

from . import _safety
from ._config import Config
from ._version import __version__

__all__ = ["DURATION_BUCKETS_S", "MEMORY_BUCKETS_BYTES", "meter_provider_for", "recorder"]

P = "attnscope."
DURATION_BUCKETS_S = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
MEMORY_BUCKETS_BYTES = tuple(float(4**k) for k in range(8, 19))  # 64 KiB .. 64 GiB
_LABELS = (P + "module", P + "backend", P + "device", P + "phase")
_OTLP_NAMES = ("otlp", "otlp-grpc", "otlp-http")
_prometheus_started = False


# ---- where metrics go ----------------------------------------------------------------------------


def meter_provider_for(cfg: Config, traces_via: str | None, resource: Any, *,
                       own: bool = True) -> tuple[Any, bool]:
    """``(meter provider, owned)`` for ``cfg``, or ``(None, False)`` when metrics go nowhere.

    Order: ``meter_provider=`` → the application's global SDK MeterProvider → our own, with the
    readers named in ``OTEL_METRICS_EXPORTER`` (otlp, prometheus, console, none). When that is
    unset, ours exports over OTLP only if attnscope's spans do (``traces_via`` is an OTLP name), so
    ``exporter="jaeger-json:..."`` or an injected ``tracer_provider`` never opens a connection.
    """
    if not cfg.metrics:
        return None, False
    if cfg.meter_provider is not None:
        return cfg.meter_provider, False
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider

    global_provider = otel_metrics.get_meter_provider()
    if isinstance(global_provider, MeterProvider):
        return global_provider, False
    if not own:
        return None, False
    raw = os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower()
    if raw:
        names = [n.strip() for n in raw.split(",") if n.strip()]
    else:
        names = ["otlp"] if traces_via in _OTLP_NAMES else []
    readers = [r for r in (_reader(n, traces_via) for n in names) if r is not None]
    if not readers:
        return None, False
    return MeterProvider(metric_readers=readers, resource=resource, shutdown_on_exit=False), True


def _reader(name: str, traces_via: str | None) -> Any:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if name == "none":
        return None
    if name == "otlp":
        return PeriodicExportingMetricReader(_otlp_metric_exporter(traces_via))
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return PeriodicExportingMetricReader(ConsoleMetricExporter())
    if name == "prometheus":
        return _prometheus_reader()
    _safety.warn_once("metrics-exporter", "attnscope: unsupported OTEL_METRICS_EXPORTER entry; "
                      "skipped", value=name)
    return None


def _otlp_metric_exporter(traces_via: str | None) -> Any:
    from ._provider import otlp_protocol

    http = traces_via == "otlp-http" or (traces_via != "otlp-grpc"
                                         and otlp_protocol("METRICS") == "http/protobuf")
    if http:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
            OTLPMetricExporter as HTTPMetricExporter,
        )

        return HTTPMetricExporter()
    from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
        OTLPMetricExporter as GRPCMetricExporter,
    )

    return GRPCMetricExporter()


def _prometheus_reader() -> Any:
    """A Prometheus reader served on OTEL_EXPORTER_PROMETHEUS_HOST:PORT (localhost:9464)."""
    global _prometheus_started
    try:  # optional extra: imported by name so type checking does not need it installed
        exporter_module = importlib.import_module("opentelemetry.exporter.prometheus")
        reader_cls = exporter_module.PrometheusMetricReader
        start_http_server = importlib.import_module("prometheus_client").start_http_server
    except ImportError:
        _safety.warn_once("prometheus", "attnscope: OTEL_METRICS_EXPORTER=prometheus needs the "
                          "extra: pip install 'attnscope[prometheus]'")
        return None
    reader = reader_cls()
    if not _prometheus_started:
        host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
        port = int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"))
        start_http_server(port=port, addr=host)
        _prometheus_started = True
    return reader


# ---- instruments ---------------------------------------------------------------------------------


class _Monotonic:
    """Process-lifetime totals from counts that restart (a new worker, ``_safety.reset()``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._last: dict[str, tuple[Any, int]] = {}
        self._total: dict[str, int] = {}

    def total(self, key: str, source: Any, value: int) -> int:
        with self._lock:
            last_source, last_value = self._last.get(key, (None, 0))
            same = last_source is not None and last_source() is source
            delta = value - last_value if same and value >= last_value else value
            self._last[key] = (weakref.ref(source) if source is not None else _none_ref, value)
            self._total[key] = self._total.get(key, 0) + max(0, delta)
            return self._total[key]

    def current(self, key: str) -> int:
        with self._lock:
            return self._total.get(key, 0)


class _Global:
    """Stands in as the ``source`` of process-wide counts (weak-referenceable, never collected)."""


_GLOBAL = _Global()


def _none_ref() -> Any:
    return None


_totals = _Monotonic()
_DROP_REASONS = ("queue_full", "trace_cap", "export_failed", "export_queue_full")


def _drop_counts() -> tuple[Any, dict[str, int]]:
    from . import _worker

    worker = _worker.get()
    if worker is None:
        return None, {}
    delivery = worker.pipeline.delivery
    return worker, {
        "queue_full": worker.dropped_queue,
        "trace_cap": worker.builder.stats.dropped_trace_cap,
        "export_failed": delivery.export_failed,
        "export_queue_full": delivery.export_queue_full,
    }


def _observe_dropped(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    try:
        worker, counts = _drop_counts()
        out = []
        for reason in _DROP_REASONS:
            key = "dropped:" + reason
            value = _totals.total(key, worker, counts[reason]) if worker is not None else \
                _totals.current(key)
            out.append(Observation(value, {"reason": reason}))
        return out
    except Exception as exc:
        _safety.internal_error("metrics.observe", exc)
        return []


def _profile_skips() -> dict[str, int]:
    """Skipped profile-tier captures by reason, from the profiler module's counts."""
    from . import _profile

    counts = getattr(_profile, "stats", None)
    raw: dict[str, Any] = counts() if callable(counts) else {}
    return {key[len("skipped_"):]: int(value) for key, value in raw.items()
            if key.startswith("skipped_") and isinstance(value, int)}


def _observe_profiles_skipped(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    try:
        return [Observation(_totals.total("profiles_skipped:" + reason, _GLOBAL, value),
                            {"reason": reason})
                for reason, value in sorted(_profile_skips().items())]
    except Exception as exc:
        _safety.internal_error("metrics.observe", exc)
        return []


def _observe_internal_errors(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    try:
        return [Observation(_totals.total("internal_errors", _GLOBAL, _safety.error_count()))]
    except Exception:
        return []


def _observe_sampling(options: Any) -> Iterable[Any]:
    """The effective (budget-scaled) sample and profile rates, by tier."""
    from opentelemetry.metrics import Observation

    from . import _sampling

    try:
        s = _sampling.sampler
        return [Observation(s.effective_rate, {"tier": "timing"}),
                Observation(s.effective_profile_rate, {"tier": "profile"})]
    except Exception as exc:
        _safety.internal_error("metrics.observe", exc)
        return []


def _observe_overhead(options: Any) -> Iterable[Any]:
    """attnscope's measured calling-thread cost over the wrapped calls' time (last window)."""
    from opentelemetry.metrics import Observation

    from . import _sampling

    try:
        return [Observation(_sampling.sampler.budget.last_ratio)]
    except Exception as exc:
        _safety.internal_error("metrics.observe", exc)
        return []


class _Instruments:
    """The instruments on one meter provider; :meth:`record` runs on the worker per span."""

    def __init__(self, meter_provider: Any) -> None:
        meter = meter_provider.get_meter("attnscope", __version__)
        self.duration = meter.create_histogram(
            "attnscope.attention.duration", unit="s",
            description="Duration of sampled attention calls (device time when measured)",
            explicit_bucket_boundaries_advisory=list(DURATION_BUCKETS_S),
        )
        self.tokens = meter.create_counter(
            "attnscope.attention.tokens", unit="{token}",
            description="Tokens processed by attention calls (sampled calls / sample rate)",
        )
        self.memory_peak = meter.create_histogram(
            "attnscope.memory.peak", unit="By",
            description="Peak device memory allocated during sampled calls",
            explicit_bucket_boundaries_advisory=list(MEMORY_BUCKETS_BYTES),
        )
        meter.create_observable_counter(
            "attnscope.spans.dropped", callbacks=[_observe_dropped], unit="{span}",
            description="attnscope spans not delivered, by reason",
        )
        meter.create_observable_counter(
            "attnscope.profiles.skipped", callbacks=[_observe_profiles_skipped], unit="{profile}",
            description="Profile-tier captures that fell back to timing, by reason",
        )
        meter.create_observable_counter(
            "attnscope.internal_errors", callbacks=[_observe_internal_errors], unit="{error}",
            description="Internal errors attnscope caught and logged",
        )
        meter.create_observable_gauge(
            "attnscope.sampling.effective_rate", callbacks=[_observe_sampling], unit="1",
            description="Sampling probability in force after the overhead budget, by tier",
        )
        meter.create_observable_gauge(
            "attnscope.overhead.ratio", callbacks=[_observe_overhead], unit="1",
            description="attnscope's calling-thread cost / wall time of the calls it wraps",
        )

    def record(self, cap: Any, attrs: dict[str, Any]) -> None:
        try:
            labels: dict[str, str] = {}
            for key in _LABELS:
                value = attrs.get(key)
                if isinstance(value, str) and value:
                    labels[key] = value
            if P + "module" not in labels and getattr(cap, "name", None):
                labels[P + "module"] = str(cap.name)
            device_ns = attrs.get(P + "device_ns")
            wall_ns = attrs.get(P + "wall_ns")
            ns = device_ns if _positive_int(device_ns) else wall_ns
            if _count(ns):
                self.duration.record(ns / 1e9, labels)
            tokens = attrs.get(P + "tokens")
            if _count(tokens) and tokens > 0:
                rate = attrs.get(P + "sample_rate")
                weight = 1.0 / rate if isinstance(rate, float) and 0.0 < rate <= 1.0 else 1.0
                self.tokens.add(tokens * weight, labels)
            peak = attrs.get(P + "memory.peak_bytes")
            if _count(peak):
                self.memory_peak.record(peak, labels)
        except Exception as exc:
            _safety.internal_error("metrics", exc)


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


_instruments: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_instruments_lock = threading.Lock()


def _instruments_for(meter_provider: Any) -> _Instruments:
    """One set of instruments per provider: a restarted worker reuses them (no duplicates)."""
    with _instruments_lock:
        try:
            found = _instruments.get(meter_provider)
        except TypeError:  # not weak-referenceable: build each time
            return _Instruments(meter_provider)
        if found is None:
            found = _instruments[meter_provider] = _Instruments(meter_provider)
        return found


def recorder(cfg: Config, pipeline: Any = None) -> Callable[[Any, dict[str, Any]], None] | None:
    """A callable ``(capture, attributes)`` that records metrics, or None when metrics are off.

    ``pipeline`` (a ``_provider.Pipeline``) supplies the meter provider it resolved, which it also
    flushes and shuts down. Without one, only ``meter_provider=`` or the app's global SDK provider
    is used: a provider nobody would shut down is never created here.
    """
    if not cfg.metrics:
        return None
    try:
        if pipeline is not None:
            meter_provider = pipeline.meter_provider
        else:
            meter_provider, _ = meter_provider_for(cfg, None, None, own=False)
        if meter_provider is None:
            return None
        return _instruments_for(meter_provider).record
    except Exception as exc:
        _safety.internal_error("metrics", exc)
        return None
