"""Where attnscope's spans and metrics go: the app's providers, or ones attnscope creates.

Traces: ``tracer_provider=`` → an explicit ``exporter=`` (our own provider) → the application's
global SDK provider → our own provider with ``OTEL_TRACES_EXPORTER`` (default "otlp").
Metrics: see :func:`attnscope._metrics.meter_provider_for`. attnscope never sets a global provider
and never shuts down one it did not create. The OTLP exporters read the standard
``OTEL_EXPORTER_OTLP_*`` variables themselves; attnscope only picks gRPC or HTTP.
"""

from __future__ import annotations

import inspect
import os
import platform
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from . import _safety, _sampling
from ._config import Config
from ._version import __version__

__all__ = ["Delivery", "Pipeline", "build", "make_exporter", "otlp_protocol", "resource",
           "resource_attributes"]

INSTRUMENTATION_NAME = "attnscope"
_DEFAULT_SERVICE = Config.service_name
_TRACES_EXPORTERS = ("otlp", "otlp-grpc", "otlp-http", "console", "none")


class Delivery:
    """What happened to spans after attnscope built them (our own provider only)."""

    __slots__ = ("export_failed", "export_queue_full")

    def __init__(self) -> None:
        self.export_failed = 0  # spans in batches the exporter reported as failed
        self.export_queue_full = 0  # spans the batch processor dropped: its queue was full


class _CountingExporter(SpanExporter):
    """Delegates to the real exporter and counts the spans of failed exports."""

    def __init__(self, inner: SpanExporter, delivery: Delivery) -> None:
        self.inner = inner
        self.delivery = delivery

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        try:
            result = self.inner.export(spans)
        except Exception as exc:
            _safety.internal_error("exporter", exc)
            result = SpanExportResult.FAILURE
        if result is not SpanExportResult.SUCCESS:
            self.delivery.export_failed += len(spans)
        return result

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        try:
            takes_timeout = "timeout_millis" in inspect.signature(self.inner.shutdown).parameters
        except (TypeError, ValueError):
            takes_timeout = False
        if takes_timeout:
            self.inner.shutdown(timeout_millis=timeout_millis)  # type: ignore[call-arg]
        else:
            self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class _CountingBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the spans it drops on a full queue."""

    def __init__(self, exporter: SpanExporter, delivery: Delivery) -> None:
        super().__init__(exporter)
        self.delivery = delivery

    def on_end(self, span: ReadableSpan) -> None:
        queue = getattr(getattr(self, "_batch_processor", None), "_queue", None)
        maxlen = getattr(queue, "maxlen", None)
        if maxlen is not None and len(queue) >= maxlen:  # type: ignore[arg-type]
            self.delivery.export_queue_full += 1
        super().on_end(span)


class Pipeline:
    """The tracer the worker builds spans with, and what attnscope owns behind it.

    ``exporter`` is the span exporter attnscope created (or was given) for its own provider: the
    SDK's span processors never call an exporter's ``force_flush``, so :meth:`force_flush` does,
    which is what makes file exporters write on ``attnscope.flush()``.
    """

    def __init__(self, tracer: Any, provider: Any, owned: bool, *, exporter: Any = None,
                 meter_provider: Any = None, meter_owned: bool = False) -> None:
        self.tracer = tracer
        self.provider = provider
        self.owned = owned
        self.exporter = exporter
        self.meter_provider = meter_provider
        self.meter_owned = meter_owned
        self.delivery = Delivery()
        self._flush_lock = threading.Lock()
        self._flushing: threading.Thread | None = None

    def force_flush(self, timeout_ms: int) -> bool:
        """Flush spans, the exporter and metrics; returns within ``timeout_ms`` even if they hang.

        The SDK's ``BatchSpanProcessor.force_flush`` ignores its timeout and exports on the calling
        thread, so the work runs on a helper thread; a flush still running from an earlier call is
        waited for instead of starting another one behind it.
        """
        timeout_s = max(0.0, timeout_ms / 1000.0)
        result: list[bool] = []
        with self._flush_lock:
            running = self._flushing
            if running is None or not running.is_alive():
                running = threading.Thread(
                    target=lambda: result.append(self._flush_all(timeout_ms)),
                    name="attnscope-flush", daemon=True)
                self._flushing = running
                running.start()
            else:
                result.append(False)  # the earlier flush may not cover what came since
        running.join(timeout_s)
        return not running.is_alive() and all(result) and bool(result)

    def _flush_all(self, timeout_ms: int) -> bool:
        ok = True
        steps: list[tuple[str, Callable[[], Any]]] = []
        flush = getattr(self.provider, "force_flush", None)
        if flush is not None:
            steps.append(("flush.provider", lambda: flush(timeout_ms)))
        if self.exporter is not None:
            steps.append(("flush.exporter", lambda: self.exporter.force_flush(timeout_ms)))
        if self.meter_provider is not None:
            steps.append(("flush.metrics", lambda: _flush_metrics(self.meter_provider, timeout_ms)))
        for stage, step in steps:
            try:
                ok = (step() is not False) and ok
            except Exception as exc:
                _safety.internal_error(stage, exc)
                ok = False
        return ok

    def shutdown(self, timeout_ms: int = 30_000) -> None:
        """Shut down what attnscope created (the worker bounds the time this may take)."""
        if self.owned:
            try:
                self.provider.shutdown()
            except Exception as exc:
                _safety.internal_error("shutdown.provider", exc)
        if self.meter_owned and self.meter_provider is not None:
            try:
                self.meter_provider.shutdown(timeout_millis=timeout_ms)
            except Exception as exc:
                _safety.internal_error("shutdown.metrics", exc)


def _flush_metrics(meter_provider: Any, timeout_ms: int) -> bool:
    """Export pending metrics through push readers only.

    Flushing a pull reader (Prometheus) makes it queue one more copy of every series for the next
    scrape, so an SDK provider's periodic readers are flushed one by one instead of the provider.
    """
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    readers = getattr(meter_provider, "_metric_readers", None)
    if readers is None:
        flush = getattr(meter_provider, "force_flush", None)
        return bool(flush(timeout_ms)) if flush is not None else True
    ok = True
    for reader in readers:
        if isinstance(reader, PeriodicExportingMetricReader):
            ok = bool(reader.force_flush(timeout_millis=timeout_ms)) and ok
    return ok


# ---- resource ------------------------------------------------------------------------------------


def resource_attributes(cfg: Config) -> dict[str, Any]:
    """attnscope's own resource attributes (before ``OTEL_RESOURCE_ATTRIBUTES`` is merged in)."""
    attrs: dict[str, Any] = {
        "service.name": cfg.service_name,
        "attnscope.version": __version__,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
        "process.executable.name": os.path.basename(sys.executable),
        "process.runtime.name": platform.python_implementation().lower(),
        "process.runtime.version": platform.python_version(),
        "attnscope.rank": _sampling.rank(),
        "attnscope.world_size": _sampling.world_size(),
    }
    try:
        import torch

        attrs["attnscope.torch.version"] = str(torch.__version__)
        # Only name the GPU when CUDA is already up: initialising it here would cost the app.
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            attrs["attnscope.device.name"] = torch.cuda.get_device_name()
    except Exception:
        pass
    return attrs


def resource(cfg: Config) -> Resource:
    """The Resource of providers attnscope creates.

    ``OTEL_RESOURCE_ATTRIBUTES`` overrides attnscope's detected attributes. ``service.name``:
    a ``service_name`` configured to something other than the default, else ``OTEL_SERVICE_NAME``,
    else ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``, else "attnscope".
    """
    attrs = resource_attributes(cfg)
    try:
        env_attrs = dict(OTELResourceDetector().detect().attributes)
    except Exception as exc:
        _safety.internal_error("resource", exc)
        env_attrs = {}
    attrs.update(env_attrs)
    if cfg.service_name != _DEFAULT_SERVICE or not env_attrs.get("service.name"):
        attrs["service.name"] = cfg.service_name
    return Resource.create(attrs)


# ---- exporters -----------------------------------------------------------------------------------


def otlp_protocol(signal: str = "TRACES") -> str:
    """``grpc`` or ``http/protobuf``, from ``OTEL_EXPORTER_OTLP_{signal}_PROTOCOL``, else
    ``OTEL_EXPORTER_OTLP_PROTOCOL``, else grpc."""
    raw = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL", "").strip()
           or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL", "").strip() or "grpc").lower()
    if raw == "grpc":
        return "grpc"
    if raw == "http/protobuf":
        return raw
    if raw.startswith("http"):
        _safety.warn_once("otlp-protocol", "attnscope: only OTLP http/protobuf is supported over "
                          "HTTP; using it", value=raw)
        return "http/protobuf"
    _safety.warn_once("otlp-protocol", "attnscope: unknown OTLP protocol; using grpc", value=raw)
    return "grpc"


def make_exporter(name: str) -> SpanExporter | None:
    """A SpanExporter for a configured name; None for "none"."""
    if name == "none":
        return None
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name.startswith("jaeger-json:"):
        from .exporters.jaeger_json import JaegerJSONFileExporter

        return JaegerJSONFileExporter(name.split(":", 1)[1])
    if name.startswith("otlp-json:"):
        from .exporters.otlp_json import OTLPJSONFileExporter

        return OTLPJSONFileExporter(name.split(":", 1)[1])
    if name == "otlp-http" or (name == "otlp" and otlp_protocol() == "http/protobuf"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HTTPExporter,
        )

        return HTTPExporter()
    if name in ("otlp", "otlp-grpc"):
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as GRPCExporter,
        )

        return GRPCExporter()
    raise ValueError(f"attnscope: unknown exporter {name!r}")


def traces_exporter_from_env() -> str:
    """The first supported name in ``OTEL_TRACES_EXPORTER`` (default "otlp")."""
    name = os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")[0].strip().lower() or "otlp"
    if name not in _TRACES_EXPORTERS:
        _safety.warn_once("traces-exporter",
                          "attnscope: unsupported OTEL_TRACES_EXPORTER; using otlp", value=name)
        name = "otlp"
    return name


def build(cfg: Config) -> Pipeline:
    """Resolve the configured destinations (see the module docstring for the order)."""
    from . import _metrics

    traces_via: str | None = None  # the exporter name when attnscope owns the provider
    res: Resource | None = None
    span_exporter: Any = None
    if cfg.tracer_provider is not None:
        provider: Any = cfg.tracer_provider
        owned = False
    elif cfg.exporter is not None or not isinstance(otel_trace.get_tracer_provider(),
                                                    TracerProvider):
        setting = cfg.exporter if cfg.exporter is not None else traces_exporter_from_env()
        traces_via = setting if isinstance(setting, str) else None
        res = resource(cfg)
        provider = TracerProvider(resource=res, shutdown_on_exit=False)
        span_exporter = make_exporter(setting) if isinstance(setting, str) else setting
        owned = True
    else:
        provider = otel_trace.get_tracer_provider()
        owned = False
    meter_provider, meter_owned = (None, False)
    if cfg.metrics:
        try:
            meter_provider, meter_owned = _metrics.meter_provider_for(
                cfg, traces_via, res if res is not None else resource(cfg))
        except Exception as exc:
            _safety.internal_error("metrics.provider", exc)
    pipeline = Pipeline(provider.get_tracer(INSTRUMENTATION_NAME, __version__), provider, owned,
                        exporter=span_exporter, meter_provider=meter_provider,
                        meter_owned=meter_owned)
    if owned and span_exporter is not None:
        provider.add_span_processor(_CountingBatchSpanProcessor(
            _CountingExporter(span_exporter, pipeline.delivery), pipeline.delivery))
    return pipeline
