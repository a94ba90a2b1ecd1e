"""The frozen, validated :class:`Config` and its environment variables.

Pure values and parsing, no state: the current configuration lives in :mod:`attnscope._state`
and changes through :func:`attnscope.configure`. Invalid values raise ``ValueError`` naming the
setting; ``from_env(strict=False)`` (the implicit configuration made on first use, inside a
user's call) reports them through ``warn`` and falls back instead.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Union

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import TracerProvider

__all__ = ["Config", "EXPORTER_NAMES", "EXPORTER_PREFIXES", "Warn", "check_rate", "from_env",
           "validate"]

ExporterSetting = Union[str, "SpanExporter"]

EXPORTER_NAMES = ("otlp", "otlp-grpc", "otlp-http", "console", "none")
EXPORTER_PREFIXES = ("jaeger-json:", "otlp-json:")
# (key, message, fields): how a non-strict parse reports a value it skipped.
Warn = Callable[[str, str, dict[str, Any]], None]


@dataclasses.dataclass(frozen=True)
class Config:
    """Effective settings. Build through :func:`configure`; read with :func:`current`."""

    service_name: str = "attnscope"
    enabled: bool = True
    sample_rate: float = 0.01
    exporter: ExporterSetting | None = None
    """None: the app's global SDK provider if it has one, else ``OTEL_TRACES_EXPORTER``/"otlp"."""
    tracer_provider: TracerProvider | None = None
    profile_rate: float = 0.05
    profile_max_per_minute: float = 2.0
    warmup_calls: int = 10
    max_spans_per_trace: int = 512
    overhead_budget: float = 0.01
    max_kernel_spans: int = 64
    profile_dir: str | None = None
    reset_peak_memory_stats: bool = False
    queue_size: int = 4096
    seed: int = 0
    metrics: bool = True
    meter_provider: MeterProvider | None = None
    """None: the app's global SDK MeterProvider if it has one, else ours (see docs/exporting.md)."""


# name -> (env var, parser)
def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {raw!r}")


_ENV: dict[str, tuple[str, Callable[[str], Any]]] = {
    "sample_rate": ("ATTNSCOPE_SAMPLE_RATE", float),
    "enabled": ("ATTNSCOPE_ENABLED", _parse_bool),
    "exporter": ("ATTNSCOPE_EXPORTER", str),
    "profile_rate": ("ATTNSCOPE_PROFILE_RATE", float),
    "profile_max_per_minute": ("ATTNSCOPE_PROFILE_MAX_PER_MINUTE", float),
    "warmup_calls": ("ATTNSCOPE_WARMUP_CALLS", int),
    "max_spans_per_trace": ("ATTNSCOPE_MAX_SPANS_PER_TRACE", int),
    "overhead_budget": ("ATTNSCOPE_OVERHEAD_BUDGET", float),
    "max_kernel_spans": ("ATTNSCOPE_MAX_KERNEL_SPANS", int),
    "profile_dir": ("ATTNSCOPE_PROFILE_DIR", str),
    "reset_peak_memory_stats": ("ATTNSCOPE_RESET_PEAK_MEMORY_STATS", _parse_bool),
    "queue_size": ("ATTNSCOPE_QUEUE_SIZE", int),
    "seed": ("ATTNSCOPE_SEED", int),
    "metrics": ("ATTNSCOPE_METRICS", _parse_bool),
}


def check_rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"attnscope: {name} must be a number in [0, 1], got {value!r}")
    if math.isnan(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"attnscope: {name} must be in [0, 1], got {value!r}")
    return float(value)


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"attnscope: {name} must be an integer >= {minimum}, got {value!r}")
    return value


def _check_exporter(value: Any) -> ExporterSetting | None:
    if value is None:
        return None
    if isinstance(value, str):
        name = value.strip()
        if name.lower() in EXPORTER_NAMES:
            return name.lower()
        if any(name.startswith(p) and len(name) > len(p) for p in EXPORTER_PREFIXES):
            return name
        raise ValueError(
            f"attnscope: exporter must be one of {', '.join(EXPORTER_NAMES)}, "
            f"'jaeger-json:PATH', 'otlp-json:PATH' or a SpanExporter, got {value!r}"
        )
    if hasattr(value, "export") and hasattr(value, "shutdown"):
        return value  # type: ignore[no-any-return]
    raise ValueError(f"attnscope: exporter must be a name or a SpanExporter, got {value!r}")


def validate(cfg: Config) -> Config:
    if not isinstance(cfg.service_name, str) or not cfg.service_name:
        raise ValueError(f"attnscope: service_name must be a non-empty string, got {cfg.service_name!r}")
    if not isinstance(cfg.enabled, bool):
        raise ValueError(f"attnscope: enabled must be a bool, got {cfg.enabled!r}")
    check_rate("sample_rate", cfg.sample_rate)
    check_rate("profile_rate", cfg.profile_rate)
    check_rate("overhead_budget", cfg.overhead_budget)
    if cfg.overhead_budget == 0.0:
        raise ValueError("attnscope: overhead_budget must be > 0 (use enabled=False to turn off)")
    ppm = cfg.profile_max_per_minute
    if isinstance(ppm, bool) or not isinstance(ppm, (int, float)) or math.isnan(ppm) or ppm < 0:
        raise ValueError(f"attnscope: profile_max_per_minute must be a number >= 0, got {ppm!r}")
    _check_int("warmup_calls", cfg.warmup_calls, 0)
    _check_int("max_spans_per_trace", cfg.max_spans_per_trace, 1)
    _check_int("max_kernel_spans", cfg.max_kernel_spans, 1)
    _check_int("queue_size", cfg.queue_size, 1)
    _check_int("seed", cfg.seed, 0)
    _check_exporter(cfg.exporter)
    if cfg.tracer_provider is not None and not hasattr(cfg.tracer_provider, "get_tracer"):
        raise ValueError(
            f"attnscope: tracer_provider must be an OpenTelemetry TracerProvider, "
            f"got {cfg.tracer_provider!r}"
        )
    if cfg.meter_provider is not None and not hasattr(cfg.meter_provider, "get_meter"):
        raise ValueError(
            f"attnscope: meter_provider must be an OpenTelemetry MeterProvider, "
            f"got {cfg.meter_provider!r}"
        )
    if cfg.profile_dir is not None and not isinstance(cfg.profile_dir, str):
        raise ValueError(f"attnscope: profile_dir must be a path string, got {cfg.profile_dir!r}")
    return dataclasses.replace(
        cfg,
        sample_rate=float(cfg.sample_rate),
        profile_rate=float(cfg.profile_rate),
        overhead_budget=float(cfg.overhead_budget),
        profile_max_per_minute=float(ppm),
        exporter=_check_exporter(cfg.exporter),
    )


def from_env(environ: Mapping[str, str] | None = None, *, strict: bool = True,
             warn: Warn | None = None) -> Config:
    """Defaults overlaid with the environment. ``strict=False`` skips bad values, telling ``warn``."""
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    service = env.get("OTEL_SERVICE_NAME", "").strip()
    if service:
        values["service_name"] = service
    for field, (var, parse) in _ENV.items():
        raw = env.get(var)
        if raw is None or raw.strip() == "":
            continue
        try:
            values[field] = parse(raw)
        except ValueError as exc:
            if strict:
                raise ValueError(f"attnscope: {var}={raw!r} is invalid: {exc}") from None
            if warn is not None:
                warn("env:" + var, "attnscope: ignoring invalid environment value",
                     {"variable": var, "value": raw})
    if _parse_env_bool(env.get("OTEL_SDK_DISABLED")):
        values["enabled"] = False
    cfg = Config()
    for field, value in values.items():
        try:
            cfg = validate(dataclasses.replace(cfg, **{field: value}))
        except ValueError:
            if strict:
                var = _ENV[field][0] if field in _ENV else field
                raise ValueError(
                    f"attnscope: environment variable {var}={value!r} is invalid for {field}"
                ) from None
            if warn is not None:
                warn("env:" + field, "attnscope: ignoring invalid environment value",
                     {"setting": field, "value": value})
    return cfg


def _parse_env_bool(raw: str | None) -> bool:
    if raw is None:
        return False
    try:
        return _parse_bool(raw)
    except ValueError:
        return False
