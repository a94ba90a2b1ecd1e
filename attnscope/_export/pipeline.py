"""The pipeline the worker builds spans into: the app's providers, or ones attnscope creates.

Traces: ``tracer_provider=`` → an explicit ``exporter=`` (our own provider) → the application's
global SDK provider → our own provider with ``OTEL_TRACES_EXPORTER`` (default "otlp").
Metrics: see :func:`attnscope._export.destinations.meter_provider_for`. attnscope never sets a
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
from .._runtime import Delivery, runtime
from .._version import __version__
from . import ids, otlp_status
from .destinations import (
    NowhereExporter,
    make_exporter,
    meter_provider_for,
    resource,
    traces_exporter_from_env,
    unusable_env_exporter,
)
from .otel_env import batch_kwargs, span_limits

__all__ = ["Pipeline", "build", "destination_of", "report_undelivered"]

INSTRUMENTATION_NAME = "attnscope"
_LOCAL = (*EXPORTER_PREFIXES, "console", "none")  # exporters that wait on no network


class _CountingExporter(SpanExporter):
    """Delegates to the real exporter and counts what became of the spans of each export.

    Spans leave ``Delivery.in_flight`` here: exported or failed as the export returns. A file
    exporter that writes later than ``export()`` (Jaeger JSON keeps the document in memory and
    rewrites the file) says itself when spans are in the file or lost, through
    ``attnscope_bind_delivery``: a span counts as exported only once it is on disk.

    For an OTLP exporter (see :mod:`attnscope._export.otlp_status`): its own log lines stay out of
    an unconfigured console, the endpoint is tried once before the first export (nothing
    listening → one WARNING at once, not after the exporter's retries), and a first failure at an
    endpoint that listens gets one WARNING too.
    """

    def __init__(self, inner: SpanExporter, delivery: Delivery) -> None:
        self.inner = inner
        self.delivery = delivery
        self.endpoint = otlp_status.endpoint_of(inner)
        self._checked = self.endpoint is None
        self._reported = False
        bind = getattr(inner, "attnscope_bind_delivery", None)
        self.reports_itself = callable(bind)
        if self.reports_itself:
            bind(self._settled)  # type: ignore[misc]

    def _settled(self, written: int, lost: int) -> None:
        self.delivery.settle(exported=written, failed=lost)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not self._checked:
            self._checked = True
            if not otlp_status.listening(self.endpoint or ""):
                self._reported = True
                otlp_status.report_unreachable(self.endpoint or "")
        try:
            with otlp_status.exporting():
                result = self.inner.export(spans)
        except Exception as exc:
            _log.internal_error("exporter", exc)
            result = SpanExportResult.FAILURE
            self.delivery.settle(failed=len(spans))  # an exporter that raises took nothing
            return result
        if self.reports_itself:
            return result  # the exporter settles its spans when they are written or lost
        if result is SpanExportResult.SUCCESS:
            self.delivery.settle(exported=len(spans))
        else:
            self.delivery.settle(failed=len(spans))
            if self.endpoint is not None and not self._reported:
                self._reported = True
                if otlp_status.listening(self.endpoint):
                    otlp_status.report_refused(self.endpoint)
                else:
                    otlp_status.report_unreachable(self.endpoint)
        return result

    def shutdown(self, timeout_millis: float = 30_000) -> None:
        if runtime.worker.kept_exporter is not None and runtime.worker.kept_exporter is self.inner:
            self.force_flush(int(timeout_millis))  # configure() keeps it for the next pipeline
            return
        try:
            takes_timeout = "timeout_millis" in inspect.signature(self.inner.shutdown).parameters
        except (TypeError, ValueError):
            takes_timeout = False
        with otlp_status.exporting():  # an exporter cut short by shutdown says so: ours to tell
            if takes_timeout:
                self.inner.shutdown(timeout_millis=timeout_millis)  # type: ignore[call-arg]
            else:
                self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))


def _report_queue_full() -> None:
    # In place of the SDK's "Queue full, dropping Span." per span (kept off the console, below).
    _log.warn_once("export-queue-full", "attnscope: the export queue is full; spans are dropped "
                   "(counted in attnscope.stats()['export_dropped']). A collector slower than "
                   "the traffic, or raise OTEL_BSP_MAX_QUEUE_SIZE")


class _CountingQueue(deque[Any]):
    """The batch processor's queue, counting the spans that enter it and those it evicts.

    The SDK appends on the left of a bounded deque, which silently drops the oldest span when
    full. Checking the length before appending races with the export thread's pops (a span seen
    as dropped would be exported too); a lock around both sides makes the count exact.

    After the processor's shutdown has given up (its timeout), nothing exports the queue any
    more: :meth:`abandon` counts what is left as dropped.
    """

    def __init__(self, items: Any, maxlen: int, delivery: Delivery) -> None:
        super().__init__(items, maxlen)
        self._lock = threading.Lock()
        self._delivery = delivery
        self._abandoned = False

    def appendleft(self, item: Any) -> None:
        with self._lock:
            evicted = len(self) == self.maxlen
            if evicted:
                self._delivery.settle(dropped=1)
            self._delivery.queued()
            super().appendleft(item)
        if evicted:
            _report_queue_full()

    def pop(self, *index: int) -> Any:  # deque.pop takes no index; the signature is its base's
        with self._lock:
            item = super().pop(*index)
            if self._abandoned:  # an export that began as shutdown gave up: counted again there
                with self._delivery.lock:
                    self._delivery.export_queue_full -= 1
                    self._delivery.in_flight += 1
            return item

    def abandon(self) -> None:
        """The processor will export nothing more: what is queued is dropped (and counted)."""
        with self._lock:
            if not self._abandoned:
                self._abandoned = True
                self._delivery.settle(dropped=len(self))


class _CountingBatchSpanProcessor(BatchSpanProcessor):
    """A BatchSpanProcessor that counts the spans it queues, drops on a full queue, and gives up
    on at shutdown; the SDK's per-span "Queue full" line is replaced by one of attnscope's."""

    def __init__(self, exporter: SpanExporter, delivery: Delivery) -> None:
        super().__init__(exporter, **batch_kwargs())
        self.delivery = delivery
        inner = getattr(self, "_batch_processor", None)
        queue = getattr(inner, "_queue", None)
        self._inner = inner
        self._approximate = not (isinstance(queue, deque) and queue.maxlen)
        self._queue: _CountingQueue | None = None
        self._maxlen = 0
        if not self._approximate:  # the SDK's internals as of 1.2x; else the check in on_end
            self._maxlen = queue.maxlen  # type: ignore[union-attr]
            self._queue = _CountingQueue(queue, self._maxlen, delivery)
            inner._queue = self._queue  # type: ignore[union-attr]

    def on_end(self, span: ReadableSpan) -> None:
        inner, queue = self._inner, self._queue
        if getattr(inner, "_shutdown", False):
            if span.context and span.context.trace_flags.sampled:  # the SDK queues only these
                self._dropped_unqueued()  # the SDK would drop it with an INFO line, uncounted
            return
        if queue is not None:
            if len(queue) < self._maxlen:
                super().on_end(span)
                return
            # the SDK logs "Queue full, dropping Span." for each: as attnscope's own export's
            # record, it stays off a console nobody configured (export.otlp_status)
            with otlp_status.exporting():
                super().on_end(span)
            return
        queue = getattr(inner, "_queue", None)
        maxlen = getattr(queue, "maxlen", None)
        if not (span.context and span.context.trace_flags.sampled):
            return
        if maxlen is not None and len(queue) >= maxlen:  # type: ignore[arg-type]
            self._dropped_unqueued()
            _report_queue_full()
            return
        self.delivery.queued()
        super().on_end(span)

    def _dropped_unqueued(self) -> None:
        with self.delivery.lock:
            self.delivery.export_queue_full += 1

    def shutdown(self) -> None:
        try:
            super().shutdown()  # type: ignore[no-untyped-call]
        finally:
            if self._queue is not None:
                self._queue.abandon()


class Pipeline:
    """The tracer the worker builds spans with, and what attnscope owns behind it.

    ``exporter`` is the span exporter attnscope created (or was given) for its own provider: the
    SDK's span processors never call an exporter's ``force_flush``, so :meth:`force_flush` does,
    which is what makes file exporters write on ``attnscope.flush()``.
    """

    def __init__(self, tracer: Any, provider: Any, owned: bool, *, exporter: Any = None,
                 meter_provider: Any = None, meter_owned: bool = False,
                 meter_readers: Sequence[Any] = ()) -> None:
        self.tracer = tracer
        self.provider = provider
        self.owned = owned
        self.exporter = exporter
        self.meter_provider = meter_provider
        self.meter_owned = meter_owned
        # the readers attnscope created for its own meter provider (flushed one by one)
        self.meter_readers = tuple(meter_readers)
        self.processor: Any = None  # the span processor attnscope added to a provider it owns
        self.delivery: Delivery = runtime.delivery  # process-wide: counts outlive pipelines
        # spans leave through a file, the console or nowhere: exporting waits on no network
        self.local = False
        self.destination = "the application's tracer provider"  # where spans go, in words
        self._flush_lock = threading.Lock()
        self._flushing: threading.Thread | None = None
        self._closing: threading.Thread | None = None

    def force_flush(self, timeout_ms: int) -> bool:
        """Flush spans, the exporter and metrics; returns within ``timeout_ms`` even if they hang.

        The SDK's ``BatchSpanProcessor.force_flush`` ignores its timeout and exports on the calling
        thread, so the work runs on a helper thread; a flush still running from an earlier call is
        waited for instead of starting another one behind it. Where no thread may start (Python
        3.12.0 and 3.12.1 at exit: CPython gh-113964), a local destination (a file) is flushed
        here, where every span of the exit's last batch was lost; a collector is not, as nothing
        would bound its wait.
        """
        timeout_s = max(0.0, timeout_ms / 1000.0)
        result: list[bool] = []
        with self._flush_lock:
            running = self._flushing
            if running is None or not running.is_alive():
                running = threading.Thread(
                    target=lambda: result.append(self._flush_all(timeout_ms)),
                    name="attnscope-flush", daemon=True)
                if not _started(running):
                    running = None
                self._flushing = running
            else:
                result.append(False)  # the earlier flush may not cover what came since
        if running is None:
            return self.local and self._flush_all(timeout_ms)
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
            readers = self.meter_readers if self.meter_owned and self.meter_readers else None
            steps.append(("flush.metrics",
                          lambda: _flush_metrics(self.meter_provider, timeout_ms, readers)))
        for stage, step in steps:
            try:
                ok = (step() is not False) and ok
            except Exception as exc:
                _log.internal_error(stage, exc)
                ok = False
        return ok

    def shutdown_within(self, timeout_s: float) -> None:
        """:meth:`shutdown` on a helper thread (a hanging exporter may block it), waited for at
        most ``timeout_s``. Started once: a shutdown cut short (a Ctrl-C) left it running, and a
        later one waits for it rather than shut the providers down twice."""
        with self._flush_lock:
            closing = self._closing
            if closing is None:
                closing = self._closing = threading.Thread(
                    target=self.shutdown, name="attnscope-shutdown", daemon=True)
                if not _started(closing):  # as in force_flush: a file's, here
                    if self.local:
                        self.shutdown()
                    return
        closing.join(max(0.0, timeout_s))

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


def _started(thread: threading.Thread) -> bool:
    """Start ``thread``; False where the interpreter refuses a new thread (it is finishing, on
    Python 3.12.0 and 3.12.1: "can't create new thread at interpreter shutdown")."""
    try:
        thread.start()
    except RuntimeError:
        return False
    return True


def _flush_metrics(meter_provider: Any, timeout_ms: int,
                   readers: Sequence[Any] | None = None) -> bool:
    """Export pending metrics through push readers only.

    Flushing a pull reader (Prometheus) makes it queue one more copy of every series for the next
    scrape, so the periodic ones among ``readers`` (those attnscope created for its own provider)
    are flushed one by one instead of the provider. ``readers`` None: a provider attnscope did not
    create, whose readers the SDK lists only in a private field; without it, flushed whole.
    """
    from opentelemetry.sdk.metrics import MetricsTimeoutError
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    # a flush that runs out of time says so by raising: that is a False, not an internal error
    # (it was one line more on a loaded machine's stderr at exit, with no collector)
    if readers is None:
        # The application's provider. Flushed whole it would collect the application's pull
        # readers too: Prometheus' copies, and an in-memory reader's exemplars spent before the
        # application reads them (tests/test_exemplars.py). No public API lists the readers.
        readers = getattr(meter_provider, "_metric_readers", None)
    try:
        if readers is None:
            flush = getattr(meter_provider, "force_flush", None)
            return bool(flush(timeout_ms)) if flush is not None else True
        ok = True
        for reader in readers:
            if isinstance(reader, PeriodicExportingMetricReader):
                ok = bool(reader.force_flush(timeout_millis=timeout_ms)) and ok
        return ok
    except MetricsTimeoutError:
        return False


def destination_of(exporter: Any, name: str | None) -> str:
    """Where ``exporter`` sends spans, for a line about them: a URL, a file, or a name."""
    if exporter is None:
        return "nowhere (exporter 'none')" if name == "none" else \
            "the application's tracer provider"
    if isinstance(exporter, NowhereExporter):
        return "nowhere"
    endpoint = otlp_status.endpoint_of(exporter)
    if endpoint is not None:
        return endpoint
    path = getattr(exporter, "path", None)
    if isinstance(path, str):
        return path
    if name == "console":
        return "the console (stderr)"
    return f"the exporter {type(exporter).__name__}"


def report_undelivered(pipeline: Pipeline | None, unbuilt: int = 0) -> None:
    """At exit, after the last flush: one WARNING when spans of this process were not delivered
    (calls captured and not yet made spans, ``unbuilt``: exit stopped waiting, a second Ctrl-C;
    spans still being sent, failed, or dropped), with how many and where. Without it a program
    that exits while its collector hangs, resets or answers 429/503 loses every span without a
    line. Never raises."""
    try:
        delivery = runtime.delivery
        with delivery.lock:
            in_flight, failed = delivery.in_flight, delivery.export_failed
            dropped = delivery.export_queue_full + delivery.no_pipeline
            exported = delivery.exported
        unbuilt = max(0, unbuilt)
        lost = unbuilt + in_flight + failed + dropped
        # "nothing is listening at ..." has said it already: a first run without a collector
        # gets that one line, not two
        if lost <= 0 or "log:export-unreachable" in runtime.log.last_logged:
            return
        where = pipeline.destination if pipeline is not None else "no exporter"
        # said only when there are some: the usual line stays as it was
        calls = f"{unbuilt} calls not yet made spans, " if unbuilt else ""
        _log.warn_once(
            "exit-undelivered",
            f"attnscope: at exit, {lost} of {lost + exported} spans were not delivered to "
            f"{where}: {calls}{in_flight} still being sent when exit stopped waiting, "
            f"{failed} failed, {dropped} dropped (attnscope.stats() has the counts)",
            destination=where, in_flight=in_flight, failed=failed, dropped=dropped,
            exported=exported, unbuilt=unbuilt)
    except Exception as exc:
        _log.internal_error("exit.report", exc)


def build(cfg: Config) -> Pipeline:
    """Resolve the configured destinations (see the module docstring for the order)."""
    traces_via: str | None = None  # the exporter name when attnscope owns the provider
    res: Resource | None = None
    span_exporter: Any = None
    explicit: Any = cfg.exporter
    if explicit is None and cfg.tracer_provider is None:
        # ATTNSCOPE_EXPORTER set but unusable (the configuration skipped it): nowhere, not the
        # default OTLP endpoint the user did not ask for
        explicit = unusable_env_exporter()
    if cfg.tracer_provider is not None:
        provider: Any = cfg.tracer_provider
        owned = False
    elif explicit is not None or not isinstance(otel_trace.get_tracer_provider(),
                                                TracerProvider):
        setting = explicit if explicit is not None else traces_exporter_from_env()
        traces_via = setting if isinstance(setting, str) else None
        res = resource(cfg)
        provider = TracerProvider(resource=res, shutdown_on_exit=False, span_limits=span_limits(),
                                  id_generator=ids.IDS)  # not the random module's: export.ids
        span_exporter = make_exporter(setting) if isinstance(setting, str) else setting
        owned = True
    else:
        provider = otel_trace.get_tracer_provider()
        owned = False
    meter_provider, meter_owned, meter_readers = (None, False, ())
    if cfg.metrics:
        try:
            meter_provider, meter_owned, meter_readers = meter_provider_for(
                cfg, traces_via, res if res is not None else resource(cfg))
        except Exception as exc:
            _log.internal_error("metrics.provider", exc)
    pipeline = Pipeline(provider.get_tracer(INSTRUMENTATION_NAME, __version__), provider, owned,
                        exporter=span_exporter, meter_provider=meter_provider,
                        meter_owned=meter_owned, meter_readers=meter_readers)
    # a file exporter given as an object (attnscope's own, or `attnscope run`'s pair) waits on
    # no network either: exit lets it finish instead of cutting it at the network limit
    pipeline.local = (traces_via is not None and traces_via.startswith(_LOCAL)) or (
        getattr(span_exporter, "attnscope_writes_files", False) is True) or isinstance(
        span_exporter, NowhereExporter)
    pipeline.destination = destination_of(span_exporter, traces_via)
    if owned and span_exporter is not None or meter_owned:
        otlp_status.install_log_filter()  # after the exporters' modules are loaded
    if owned and span_exporter is not None:
        pipeline.processor = _CountingBatchSpanProcessor(
            _CountingExporter(span_exporter, pipeline.delivery), pipeline.delivery)
        provider.add_span_processor(pipeline.processor)
    return pipeline
