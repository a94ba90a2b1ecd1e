"""The ``OTEL_*`` settings of attnscope's own exporters, provider and batch processor, checked
before use.

The SDK raises on some malformed values (``OTEL_EXPORTER_OTLP_TIMEOUT=abc``,
``OTEL_EXPORTER_OTLP_COMPRESSION=zstd``, ``OTEL_BSP_MAX_QUEUE_SIZE=0``,
``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT=abc``, ``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT=-1``), and one bad
variable would then lose every span. Each invalid value is logged once, naming the variable, and
the SDK's default for that setting is passed explicitly instead; valid values are left for the SDK
to read as usual.

An endpoint is a destination, not a tuning knob: one that is not a URL gets no default (that would
send spans to localhost, where the user did not ask): :func:`invalid_endpoint` names it, and the
caller sends nowhere. Malformed ``OTEL_EXPORTER_OTLP_*HEADERS`` entries are ignored by the SDK with
a line per entry per exporter: :func:`check_headers` says so once instead.
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from .. import _log

__all__ = ["batch_kwargs", "check_headers", "exporter_kwargs", "import_sdk_trace",
           "invalid_endpoint", "metric_preferences", "otlp_endpoint", "reader_kwargs",
           "span_limits"]

_COMPRESSIONS = ("gzip", "deflate", "none")
_TIMEOUT_S = 10.0
# OTEL_BSP_*: the SDK's defaults (ms for times)
_BSP = (("OTEL_BSP_MAX_QUEUE_SIZE", "max_queue_size", 2048),
        ("OTEL_BSP_SCHEDULE_DELAY", "schedule_delay_millis", 5000),
        ("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "max_export_batch_size", 512),
        ("OTEL_BSP_EXPORT_TIMEOUT", "export_timeout_millis", 30000))
_READER = (("OTEL_METRIC_EXPORT_INTERVAL", "export_interval_millis", 60000),
           ("OTEL_METRIC_EXPORT_TIMEOUT", "export_timeout_millis", 30000))


def _invalid(var: str, value: str, fallback: object) -> None:
    _log.warn_once(f"otel-env-{var}", f"attnscope: invalid {var}; using the default instead",
                   variable=var, value=value[:64], default=str(fallback))


def _setting(signal: str, name: str) -> tuple[str, str] | None:
    """``(variable, value)`` of the per-signal variable if set, else of the general one."""
    for var in (f"OTEL_EXPORTER_OTLP_{signal}_{name}", f"OTEL_EXPORTER_OTLP_{name}"):
        value = os.environ.get(var, "").strip()
        if value:
            return var, value
    return None


def _positive_float(value: str) -> bool:
    try:
        number = float(value)
    except ValueError:
        return False
    return math.isfinite(number) and number > 0


def _url_ok(value: str, grpc: bool) -> bool:
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018  (raises ValueError on a bad port)
    except ValueError:
        return False
    if parts.scheme in ("http", "https"):
        return bool(parts.hostname)
    return grpc and not parts.netloc and ":" in value  # gRPC also takes "host:port"


def exporter_kwargs(signal: str, grpc: bool) -> dict[str, Any]:
    """Keyword arguments replacing invalid ``OTEL_EXPORTER_OTLP_[{signal}_]*`` values."""
    out: dict[str, Any] = {}
    found = _setting(signal, "TIMEOUT")
    if found is not None and not _positive_float(found[1]):
        _invalid(found[0], found[1], _TIMEOUT_S)
        out["timeout"] = _TIMEOUT_S
    found = _setting(signal, "COMPRESSION")
    if found is not None and found[1].lower() not in _COMPRESSIONS:
        _invalid(found[0], found[1], "none")
        out["compression"] = _no_compression(grpc)
    return out


def invalid_endpoint(signal: str, grpc: bool) -> tuple[str, str] | None:
    """``(variable, value)`` when the endpoint set for ``signal`` is not a URL, else None."""
    found = _setting(signal, "ENDPOINT")
    if found is not None and not _url_ok(found[1], grpc):
        return found
    return None


# The OTLP exporters' endpoints when no variable names one: gRPC's is its channel's host:port,
# HTTP's a base URL the signal's path is appended to.
_GRPC_DEFAULT = "http://localhost:4317"
_HTTP_DEFAULT = "http://localhost:4318"


def otlp_endpoint(signal: str, grpc: bool) -> str | None:
    """The URL attnscope's OTLP exporter for ``signal`` sends to, as a line names it (a gRPC
    target with ``http://`` before its host:port); None when there is none.

    attnscope passes the exporter no endpoint: it is found in the environment here the way the
    exporter finds it, when the exporter is made, instead of being read back out of the exporter
    (a private field). A URL that is not valid never gets this far (:func:`invalid_endpoint`).
    """
    own = os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
    try:
        if grpc:
            endpoint = own or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", _GRPC_DEFAULT)
            endpoint = urlsplit(endpoint).netloc or endpoint  # what the channel is opened to
        else:
            base = os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or _HTTP_DEFAULT
            endpoint = own or f"{base.removesuffix('/')}/v1/{signal.lower()}"
    except ValueError:
        return None
    if not endpoint:
        return None
    return endpoint if "://" in endpoint else "http://" + endpoint


def metric_preferences(grpc: bool) -> tuple[dict[type, Any], dict[type, Any]]:
    """``(preferred_temporality, preferred_aggregation)`` for attnscope's OTLP metric exporter:
    ``OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE`` and ``..._DEFAULT_HISTOGRAM_AGGREGATION``
    read as that exporter reads them, for every instrument kind its own table names. attnscope
    passes them to the exporter and to the guard around it (whose preferences its reader uses):
    the two agree without reading the exporter's private fields. An invalid value falls back as
    in the exporter, which says so itself (no second line here)."""
    from opentelemetry.sdk.metrics import (
        Counter,
        Histogram,
        ObservableCounter,
        ObservableGauge,
        ObservableUpDownCounter,
        UpDownCounter,
    )
    from opentelemetry.sdk.metrics.export import AggregationTemporality
    from opentelemetry.sdk.metrics.view import (
        ExplicitBucketHistogramAggregation,
        ExponentialBucketHistogramAggregation,
    )

    preference = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE",
                                "CUMULATIVE").upper().strip()
    delta, cumulative = AggregationTemporality.DELTA, AggregationTemporality.CUMULATIVE
    sums = delta if preference in ("DELTA", "LOWMEMORY") else cumulative
    observed = delta if preference == "DELTA" else cumulative  # LOWMEMORY: cumulative
    temporality: dict[type, Any] = {
        Counter: sums, UpDownCounter: cumulative, Histogram: sums, ObservableCounter: observed,
        ObservableUpDownCounter: cumulative, ObservableGauge: cumulative}
    raw = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_DEFAULT_HISTOGRAM_AGGREGATION",
                         "explicit_bucket_histogram")
    # the gRPC exporter takes the value as written, the HTTP one in any case and spacing
    exponential = (raw == "base2_exponential_bucket_histogram" if grpc
                   else raw.upper().strip() == "BASE2_EXPONENTIAL_BUCKET_HISTOGRAM")
    aggregation: dict[type, Any] = {Histogram: ExponentialBucketHistogramAggregation()
                                    if exponential else ExplicitBucketHistogramAggregation()}
    return temporality, aggregation


# "name=value" as the SDK's liberal parser accepts it (its own pattern when it has one)
_HEADER = re.compile(r"[ \t]*[\x21\x23-\x27\x2a\x2b\x2d\x2e\x30-\x39\x41-\x5a\x5e-\x7a\x7c\x7e]+"
                     r"[ \t]*=[ \t]*[\x20\x21\x23-\x2b\x2d-\x3a\x3c-\x5b\x5d-\x7e]*[ \t]*")


def _header_pattern() -> re.Pattern[str]:
    found = getattr(importlib.import_module("opentelemetry.util.re"), "_LIBERAL_HEADER_PATTERN",
                    None)
    return found if isinstance(found, re.Pattern) else _HEADER


def check_headers(signal: str) -> None:
    """Log once when ``OTEL_EXPORTER_OTLP_[{signal}_]HEADERS`` has entries the SDK will ignore
    (its own lines about them are kept off the console: see :mod:`attnscope._export.otlp_status`).
    Header values may be secrets: only the variable and the count are logged."""
    found = _setting(signal, "HEADERS")
    if found is None:
        return
    pattern = _header_pattern()
    bad = sum(1 for entry in re.split(r"[ \t]*,[ \t]*", found[1]) if entry
              and not pattern.fullmatch(entry.strip()))
    if bad:
        _log.warn_once(f"otel-env-{found[0]}", f"attnscope: {found[0]} has malformed entries "
                       "(expected name=value,...); they are not sent", variable=found[0],
                       ignored=bad)


def _no_compression(grpc: bool) -> Any:
    if grpc:  # grpc ships no type stubs: imported by name
        return importlib.import_module("grpc").Compression.NoCompression
    from opentelemetry.exporter.otlp.proto.http import Compression

    return Compression.NoCompression


def _numbers(table: tuple[tuple[str, str, int], ...],
             valid: Callable[[str], bool]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for var, kwarg, default in table:
        value = os.environ.get(var, "").strip()
        if value and not valid(value):
            _invalid(var, value, default)
            out[kwarg] = default
    return out


def _positive_int(value: str) -> bool:
    try:
        return int(value) > 0
    except ValueError:
        return False


def batch_kwargs() -> dict[str, Any]:
    """Keyword arguments replacing invalid ``OTEL_BSP_*`` values for ``BatchSpanProcessor``."""
    out = _numbers(_BSP, _positive_int)
    queue = out.get("max_queue_size") or int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") or 2048)
    batch = out.get("max_export_batch_size") or int(
        os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE") or 512)
    if batch > queue:  # the SDK refuses a batch larger than its queue
        _invalid("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", str(batch), min(512, queue))
        out["max_export_batch_size"] = min(512, queue)
    return out


def reader_kwargs() -> dict[str, Any]:
    """Keyword arguments replacing invalid ``OTEL_METRIC_EXPORT_*`` values for a periodic reader."""
    return _numbers(_READER, _positive_float)


# OTEL_*_LIMIT: (variable, SpanLimits keyword, the variable whose value is its default). Without
# a valid one, a count's default is the SDK's 128 and a length's is "no limit".
_LIMITS = (("OTEL_SPAN_EVENT_COUNT_LIMIT", "max_events", None),
           ("OTEL_SPAN_LINK_COUNT_LIMIT", "max_links", None),
           ("OTEL_ATTRIBUTE_COUNT_LIMIT", "max_attributes", None),
           ("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "max_span_attributes", "OTEL_ATTRIBUTE_COUNT_LIMIT"),
           ("OTEL_EVENT_ATTRIBUTE_COUNT_LIMIT", "max_event_attributes",
            "OTEL_ATTRIBUTE_COUNT_LIMIT"),
           ("OTEL_LINK_ATTRIBUTE_COUNT_LIMIT", "max_link_attributes", "OTEL_ATTRIBUTE_COUNT_LIMIT"),
           ("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "max_attribute_length", None),
           ("OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT", "max_span_attribute_length",
            "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT"))
_SDK_COUNT_DEFAULT = 128


def _limit_ok(value: str) -> bool:
    if value.lower() == "unset":
        return True
    try:
        return int(value) >= 0
    except ValueError:
        return False


def span_limits() -> Any:
    """``SpanLimits`` for attnscope's provider with every malformed ``OTEL_*_LIMIT`` replaced by
    its default; None when all are valid (the SDK reads them itself).

    The SDK raises on a value that is not a non-negative integer or "unset" (a blank one too)
    when the provider is made or a span starts: every span would be lost.
    """
    from opentelemetry.sdk.trace import SpanLimits

    given = {var: os.environ[var].strip() for var, _, _ in _LIMITS if var in os.environ}
    bad = {var for var, value in given.items() if not _limit_ok(value)}
    if not bad:
        return None
    kwargs: dict[str, Any] = {}
    for var, kwarg, parent in _LIMITS:
        if var not in bad:
            continue
        default: int | None = None if "LENGTH" in var else _SDK_COUNT_DEFAULT
        inherited = given.get(parent) if parent is not None and parent not in bad else None
        if inherited is not None:
            default = None if inherited.lower() == "unset" else int(inherited)
        if given[var]:  # a blank value is "not set": the default, without a line
            _invalid(var, given[var], "no limit" if default is None else default)
        kwargs[kwarg] = SpanLimits.UNSET if default is None else default
    return SpanLimits(**kwargs)


def import_sdk_trace() -> None:
    """Import ``opentelemetry.sdk.trace`` even when ``OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT`` is
    malformed: the SDK reads it at import (a deprecated module constant) and raises, and nothing
    of attnscope's worker side could load. The variable holds the SDK's default for the length of
    the import only; :func:`span_limits` then names it and passes the default itself."""
    var = "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT"
    value = os.environ.get(var)
    if "opentelemetry.sdk.trace" in sys.modules or value is None or _limit_ok(value.strip()):
        return
    os.environ[var] = str(_SDK_COUNT_DEFAULT)
    try:
        importlib.import_module("opentelemetry.sdk.trace")
    finally:
        os.environ[var] = value
