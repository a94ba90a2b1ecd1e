"""The ``OTEL_*`` settings of attnscope's own exporters and batch processor, checked before use.

The SDK raises on some malformed values (``OTEL_EXPORTER_OTLP_TIMEOUT=abc``,
``OTEL_EXPORTER_OTLP_COMPRESSION=zstd``, ``OTEL_BSP_MAX_QUEUE_SIZE=0``, an endpoint that is not a
URL), and one bad variable would then lose every span. Each invalid value is logged once, naming
the variable, and the SDK's default for that setting is passed explicitly instead; valid values are
left for the SDK to read as usual.
"""

from __future__ import annotations

import importlib
import math
import os
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from .. import _log

__all__ = ["exporter_kwargs", "batch_kwargs", "reader_kwargs"]

_COMPRESSIONS = ("gzip", "deflate", "none")
_TIMEOUT_S = 10.0
_GRPC_ENDPOINT = "http://localhost:4317"
_HTTP_ENDPOINT = "http://localhost:4318/v1/"
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
    found = _setting(signal, "ENDPOINT")
    if found is not None and not _url_ok(found[1], grpc):
        default = _GRPC_ENDPOINT if grpc else _HTTP_ENDPOINT + signal.lower()
        _invalid(found[0], found[1], default)
        out["endpoint"] = default
    return out


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
