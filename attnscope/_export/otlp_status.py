"""What attnscope says about its own OTLP exports, in place of the exporters' retry lines.

- **Nothing listening.** Before the first export of a pipeline, the endpoint is tried with a plain
  TCP connection (on the export thread): refused or unreachable → one WARNING naming the endpoint,
  how to point attnscope elsewhere (``OTEL_EXPORTER_OTLP_ENDPOINT``) and how to write a file
  instead. An endpoint that connects but refuses the spans gets one WARNING of its own.
- **Metrics a backend does not take.** Jaeger and Phoenix accept traces only. When the metric
  exporter's first answer is "not supported" (HTTP 404/405/415/501, gRPC UNIMPLEMENTED), metric
  export is switched off for the pipeline with one INFO line.
- **The exporters' own lines.** While attnscope's exporters run (a context variable set around
  their ``export``), records of the ``opentelemetry`` loggers are dropped — unless the application
  configured that logger or one of its ``opentelemetry.*`` parents (a level, a handler, a filter,
  ``propagate=False``): then they go where it said. Records of the application's own exporters
  never carry the flag and pass untouched. Nothing else about logging is changed.
"""

from __future__ import annotations

import contextvars
import errno
import functools
import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit

from .. import _log

__all__ = ["MetricExportGuard", "endpoint_of", "exporting", "install_log_filter", "keep_endpoint",
           "listening", "refused", "report_unreachable", "sdk_quiet"]

# Records logged while this is set come from an exporter attnscope created; the list collects
# their (message, args) so a caller can read the status code the exporter saw.
_EXPORTING: contextvars.ContextVar[list[logging.LogRecord] | None] = contextvars.ContextVar(
    "attnscope_exporting", default=None)
_PREFIXES = ("opentelemetry.exporter", "opentelemetry.sdk")
_UNSUPPORTED_HTTP = (404, 405, 415, 501)
_PROBE_TIMEOUT_S = 0.5


@contextmanager
def exporting() -> Iterator[list[logging.LogRecord]]:
    """Mark the export call inside as attnscope's own; yields the exporters' records."""
    seen: list[logging.LogRecord] = []
    token = _EXPORTING.set(seen)
    try:
        yield seen
    finally:
        _EXPORTING.reset(token)


class _OwnExportFilter(logging.Filter):
    """On an ``opentelemetry`` logger: drop the records of attnscope's exports (see module)."""

    def filter(self, record: logging.LogRecord) -> bool:
        seen = _EXPORTING.get()
        if seen is None:
            return True  # the application's exporters, or outside any export
        if len(seen) < 32:
            seen.append(record)
        return _configured(record.name)


def _configured(name: str) -> bool:
    """The application set up ``name`` or an ``opentelemetry.*`` logger above it (a filter of
    the SDK's own, such as its ``DuplicateFilter``, or ours, does not count)."""
    logger: logging.Logger | None = logging.getLogger(name)
    while logger is not None and logger.name.startswith("opentelemetry"):
        if (logger.handlers or logger.level != logging.NOTSET or not logger.propagate
                or any(not _library_filter(f) for f in logger.filters)):
            return True
        logger = logger.parent
    return False


def _library_filter(f: Any) -> bool:
    return isinstance(f, (_OwnExportFilter, _QuietFilter)) or type(f).__module__.startswith(
        "opentelemetry")


# ---- the SDK's lines about malformed variables, while attnscope builds its pipeline ------------

# The SDK logs a line per malformed entry of OTEL_EXPORTER_OTLP_HEADERS each time an exporter is
# made, and per malformed entry of OTEL_RESOURCE_ATTRIBUTES each time a resource is (twice for
# one Resource.create, once in a thread of its own): attnscope says it once instead
# (export.otel_env.check_headers, destinations.resource).
_QUIET_LOGGERS = ("opentelemetry.util.re", "opentelemetry.sdk.resources",
                  "opentelemetry.attributes")


class _QuietFilter(logging.Filter):
    """Drops the records of its logger (one of :data:`_QUIET_LOGGERS`) while a :func:`sdk_quiet`
    block runs, unless the application configured that logger (as :class:`_OwnExportFilter`).
    The blocks running are tokens in ``active``: a set's add and discard are atomic, so no lock
    (and nothing a fork could inherit held)."""

    def __init__(self) -> None:
        super().__init__()
        self.active: set[object] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        return not self.active or _configured(record.name)


@contextmanager
def sdk_quiet() -> Iterator[None]:
    """Keep the SDK's lines about malformed variables off the console while the body runs (in
    any thread: ``Resource.create`` detects in a pool thread of its own)."""
    token = object()
    filters: list[_QuietFilter] = []
    try:
        for name in _QUIET_LOGGERS:
            logger = logging.getLogger(name)
            found = next((f for f in logger.filters if isinstance(f, _QuietFilter)), None)
            if found is None:
                found = _QuietFilter()
                logger.addFilter(found)
            found.active.add(token)
            filters.append(found)
    except Exception as exc:
        _log.internal_error("export.log-filter", exc)
    try:
        yield
    finally:
        for f in filters:
            f.active.discard(token)


def install_log_filter() -> None:
    """Add the filter to the exporter and SDK loggers that exist now (their modules are loaded
    by the time a pipeline is built). Idempotent; never raises."""
    try:
        names = [n for n, v in list(logging.root.manager.loggerDict.items())
                 if isinstance(v, logging.Logger) and n.startswith(_PREFIXES)]
        for name in names:
            logger = logging.getLogger(name)
            if not any(isinstance(f, _OwnExportFilter) for f in logger.filters):
                # First: the OTLP exporters' own DuplicateFilter drops a record whose message
                # template was logged in the last 20 s ("Failed to export %s ..." is one template
                # for traces and metrics), and this one must still see the metrics answer.
                logger.filters.insert(0, _OwnExportFilter())
    except Exception as exc:
        _log.internal_error("export.log-filter", exc)


# ---- where the exporter sends, and whether anything listens there ------------------------------


def keep_endpoint(exporter: Any, endpoint: str | None) -> None:
    """Keep on an OTLP exporter attnscope made the URL it resolved for it (``otel_env.
    otlp_endpoint``), for :func:`endpoint_of`; the exporter keeps its own only privately."""
    try:
        exporter.attnscope_endpoint = endpoint
    except Exception:  # an exporter that takes no attribute: no URL in the lines, as for others
        pass


def endpoint_of(exporter: Any) -> str | None:
    """The URL an OTLP exporter sends to (None for anything else): the one attnscope resolved
    for an exporter it made (:func:`keep_endpoint`), else an OTLP exporter's own."""
    endpoint = getattr(exporter, "attnscope_endpoint", None)
    if isinstance(endpoint, str) and endpoint:
        return endpoint
    if not type(exporter).__module__.startswith("opentelemetry.exporter.otlp"):
        return None
    # an OTLP exporter the application made (configure(exporter=...)): it keeps its URL only
    # privately, and its lines name it as they always did (missing: no URL in them)
    endpoint = getattr(exporter, "_endpoint", None)
    if not isinstance(endpoint, str) or not endpoint:
        return None
    return endpoint if "://" in endpoint else "http://" + endpoint


def listening(endpoint: str, timeout_s: float = _PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the endpoint's host and port opens (True when unsure)."""
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
        port = parts.port or (443 if parts.scheme == "https" else 80)
        if not host:
            return True
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
    except Exception:
        return True


def refused(endpoint: str, timeout_s: float = _PROBE_TIMEOUT_S) -> bool:
    """Whether a TCP connection to the endpoint fails for certain: refused (nothing listens),
    a name that does not resolve, a network or host that cannot be reached. A connection that
    opens, or that has not answered within ``timeout_s`` (a slow link), is not."""
    try:
        parts = urlsplit(endpoint)
        host = parts.hostname
        if not host:
            return False
        port = parts.port or (443 if parts.scheme == "https" else 80)
        with socket.create_connection((host, port), timeout=timeout_s):
            return False
    except (ConnectionRefusedError, socket.gaierror):
        return True
    except OSError as exc:
        return exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH)
    except Exception:
        return False


def report_unreachable(endpoint: str, signal: str = "spans") -> None:
    _log.warn_once(
        "export-unreachable",
        f"attnscope: nothing is listening at {endpoint}; {signal} are not delivered (counted in "
        "attnscope.stats()['export_failed']). Start a collector there, set "
        "OTEL_EXPORTER_OTLP_ENDPOINT to one, or write a file instead: "
        "attnscope.configure(exporter='jaeger-json:attnscope-trace.json')",
        endpoint=endpoint)


def report_refused(endpoint: str) -> None:
    _log.warn_once(
        "export-refused",
        f"attnscope: the OTLP endpoint {endpoint} did not accept spans (counted in "
        "attnscope.stats()['export_failed']); OTEL_EXPORTER_OTLP_ENDPOINT / _PROTOCOL decide "
        "where and how they are sent", endpoint=endpoint)


def unsupported(records: list[logging.LogRecord]) -> str | None:
    """The answer that says "this backend takes no metrics", from the exporter's records."""
    for record in records:
        args = record.args if isinstance(record.args, tuple) else ()
        for arg in args:
            if isinstance(arg, int) and not isinstance(arg, bool) and arg in _UNSUPPORTED_HTTP:
                return f"HTTP {arg}"
            if getattr(arg, "name", None) == "UNIMPLEMENTED":
                return "gRPC UNIMPLEMENTED"
    return None


# ---- metrics -------------------------------------------------------------------------------------


def MetricExportGuard(inner: Any, preferred_temporality: dict[type, Any] | None = None,  # noqa: N802
                      preferred_aggregation: dict[type, Any] | None = None) -> Any:
    """Wrap an OTLP metric exporter: exports run as attnscope's own (quiet), and the first answer
    "metrics not supported" switches metric export off. The preferences are those attnscope gave
    ``inner`` (its reader asks the guard, not ``inner``). A class built on first use: the SDK is
    worker-side."""
    return _guard_class()(inner, preferred_temporality, preferred_aggregation)


@functools.cache
def _guard_class() -> type:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

    class _Guard(MetricExporter):
        def __init__(self, inner: Any, preferred_temporality: dict[type, Any] | None,
                     preferred_aggregation: dict[type, Any] | None) -> None:
            super().__init__(preferred_temporality=preferred_temporality,
                             preferred_aggregation=preferred_aggregation)
            self.inner = inner
            self.off = False
            self._lock = threading.Lock()

        def export(self, metrics_data: Any, timeout_millis: float = 10_000,
                   **kwargs: Any) -> Any:
            if self.off:
                return MetricExportResult.SUCCESS  # switched off: nothing is sent
            with exporting() as records:
                result = self.inner.export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            if result is not MetricExportResult.SUCCESS:
                answer = unsupported(records)
                if answer is not None:
                    with self._lock:
                        self.off = True
                    _log.info_once(
                        "metrics-unsupported",
                        f"attnscope: {endpoint_of(self.inner) or 'the OTLP endpoint'} does not "
                        f"accept metrics ({answer}); metric export is off for this process. "
                        "OTEL_METRICS_EXPORTER=none skips it from the start",
                        answer=answer)
            return result

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            return bool(self.inner.force_flush(timeout_millis=timeout_millis))

        def shutdown(self, timeout_millis: float = 30_000, **kwargs: Any) -> None:
            with exporting():
                self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)

    return _Guard
