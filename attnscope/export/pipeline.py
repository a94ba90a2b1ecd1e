"""The pipeline the worker builds spans into: the app's providers, or ones attnscope creates.

Traces: ``tracer_provider=`` → an explicit ``exporter=`` (our own provider) → the application's
global SDK provider → our own provider with ``OTEL_TRACES_EXPORTER`` (default "otlp").
Metrics: see :func:`attnscope.export.destinations.meter_provider_for`. attnscope never sets a
global provider and never shuts down one it did not create.
"""

from __future__ import annotations

import inspect
import threading
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from .. import _log
from .._config import EXPORTER_PREFIXES, Config
from .._state import Delivery, state
from .._version import __version__
from . import reporting
from .destinations import make_exporter, meter_provider_for, resource, traces_exporter_from_env
from .otel_env import batch_kwargs

__all__ = ["Pipeline", "build"]

INSTRUMENTATION_NAME = "attnscope"
_LOCAL = (*EXPORTER_PREFIXES, "console", "none")  # exporters that wait on no network


class _CountingExporter(SpanExporter):
    """Delegates to the real exporter and counts the spans of failed exports.

    For an OTLP exporter (see :mod:`attnscope.export.reporting`): its own log lines stay out of
    an unconfigured console, the endpoint is tried once before the first export (nothing
    listening → one WARNING at once, not after the exporter's retries), and a first failure at an
    endpoint that listens gets one WARNING too.
    """

    def __init__(self, inner: SpanExporter, delivery: Delivery) -> None:
        self.inner = inner
        self.delivery = delivery
        self.endpoint = reporting.endpoint_of(inner)
        self._checked = self.endpoint is None
        self._reported = False

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self._checked:
            self._checked = True
            if not reporting.listening(self.endpoint or ""):
                self._reported = True
                reporting.report_unreachable(self.endpoint or "")
        try:
            with reporting.exporting():
                result = self.inner.export(spans)
        except Exception as exc:
            _log.internal_error("exporter", exc)
            result = SpanExportResult.FAILURE
        if result is SpanExportResult.SUCCESS:
            self.delivery.exported += len(spans)
        else:
            self.delivery.export_failed += len(spans)
            if self.endpoint is not None and not self._reported:
                self._reported = True
                if reporting.listening(self.endpoint):
                    reporting.report_refused(self.endpoint)
                else:
                    reporting.report_unreachable(self.endpoint)
        return result

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        try:
            takes_timeout = "timeout_millis" in inspect.signature(self.inner.shutdown).parameters
        except (TypeError, ValueError):
            takes_timeout = False
        with reporting.exporting():  # an exporter cut short by shutdown says so: ours to tell
            if takes_timeout:
                self.inner.shutdown(timeout_millis=timeout_millis)  # type: ignore[call-arg]
            else:
                self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


class _CountingQueue(deque[Any]):
    """The batch processor's queue, counting the spans a full queue evicts.

    The SDK appends on the left of a bounded deque, which silently drops the oldest span when
    full. Checking the length before appending races with the export thread's pops (a span seen
    as dropped would be exported too); a lock around both sides makes the count exact.
    """

    def __init__(self, items: Any, maxlen: int, delivery: Delivery) -> None:
        super().__init__(items, maxlen)
        self._lock = threading.Lock()
        self._delivery = delivery

    def appendleft(self, item: Any) -> None:
        with self._lock:
            if len(self) == self.maxlen:
                self._delivery.export_queue_full += 1
            super().appendleft(item)

    def pop(self, *index: int) -> Any:  # deque.pop takes no index; the signature is its base's
        with self._lock:
            return super().pop(*index)


class _CountingBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the spans it drops on a full queue."""

    def __init__(self, exporter: SpanExporter, delivery: Delivery) -> None:
        super().__init__(exporter, **batch_kwargs())
        self.delivery = delivery
        inner = getattr(self, "_batch_processor", None)
        queue = getattr(inner, "_queue", None)
        self._approximate = not (isinstance(queue, deque) and queue.maxlen)
        if not self._approximate:  # the SDK's internals as of 1.2x; else the check below
            inner._queue = _CountingQueue(queue, queue.maxlen, delivery)  # type: ignore[union-attr]

    def on_end(self, span: ReadableSpan) -> None:
        if self._approximate:
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
        self.processor: Any = None  # the span processor attnscope added to a provider it owns
        self.delivery: Delivery = state.delivery  # process-wide: counts outlive pipelines
        # spans leave through a file, the console or nowhere: exporting waits on no network
        self.local = False
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
                _log.internal_error(stage, exc)
                ok = False
        return ok

    def shutdown(self, timeout_ms: int = 30_000) -> None:
        """Shut down what attnscope created (the worker bounds the time this may take)."""
        if self.owned:
            try:
                self.provider.shutdown()
            except Exception as exc:
                _log.internal_error("shutdown.provider", exc)
        if self.meter_owned and self.meter_provider is not None:
            try:
                self.meter_provider.shutdown(timeout_millis=timeout_ms)
            except Exception as exc:
                _log.internal_error("shutdown.metrics", exc)


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


def build(cfg: Config) -> Pipeline:
    """Resolve the configured destinations (see the module docstring for the order)."""
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
            meter_provider, meter_owned = meter_provider_for(
                cfg, traces_via, res if res is not None else resource(cfg))
        except Exception as exc:
            _log.internal_error("metrics.provider", exc)
    pipeline = Pipeline(provider.get_tracer(INSTRUMENTATION_NAME, __version__), provider, owned,
                        exporter=span_exporter, meter_provider=meter_provider,
                        meter_owned=meter_owned)
    # a file exporter given as an object (attnscope's own, or `attnscope run`'s pair) waits on
    # no network either: exit lets it finish instead of cutting it at the network limit
    pipeline.local = (traces_via is not None and traces_via.startswith(_LOCAL)) or (
        getattr(span_exporter, "attnscope_writes_files", False) is True)
    if owned and span_exporter is not None or meter_owned:
        reporting.install_log_filter()  # after the exporters' modules are loaded
    if owned and span_exporter is not None:
        pipeline.processor = _CountingBatchSpanProcessor(
            _CountingExporter(span_exporter, pipeline.delivery), pipeline.delivery)
        provider.add_span_processor(pipeline.processor)
    return pipeline
