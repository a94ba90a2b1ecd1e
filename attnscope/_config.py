"""The frozen, validated :class:`Config` and its environment variables.

Pure values and parsing, no state: the current configuration lives in :mod:`attnscope._runtime`
and changes through :func:`attnscope.configure`. Invalid values raise ``ValueError`` naming the
setting; ``from_env(strict=False)`` (the implicit configuration made on first use, inside a
user's call) reports them through ``warn`` and falls back instead.
"""

from __future__ import annotations

import dataclasses
import math
import os
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, TypedDict, Union

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.trace import TracerProvider

__all__ = ["Config", "DEFAULT_OVERHEAD_BUDGET", "EXPORTER_NAMES", "EXPORTER_PREFIXES",
           "ExporterSetting", "OtherSettings", "Settings", "Warn", "budgeted", "check_rate",
           "from_env", "shown", "validate"]

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
    overhead_budget: float | None = None
    """None: ``DEFAULT_OVERHEAD_BUDGET``, on the rates left at their defaults (:func:`budgeted`)."""
    max_kernel_spans: int = 64
    profile_dir: str | None = None
    reset_peak_memory_stats: bool = False
    queue_size: int = 4096
    seed: int = 0
    metrics: bool = True
    meter_provider: MeterProvider | None = None
    """None: the app's global SDK MeterProvider if it has one, else ours (see docs/exporting.md)."""
    slow_call_quantile: float = 0.99
    """A timed call beyond this quantile of its site's latency is slow (docs/live.md); 1.0: off."""
    live_trigger: bool = True
    """Read ``attnscope trigger`` requests from ``trigger_dir`` (docs/live.md)."""
    trigger_dir: str | None = None
    """None: ``$XDG_RUNTIME_DIR/attnscope``, else ``<tmp>/attnscope-<uid>``."""
    run_id: str | None = None
    """Shared by every rank of one job: step traces' ids (docs/live.md). None: torchrun's."""
    device_peaks: Mapping[str, float] | None = None
    """``{"tflops": T, "gbps": G}``: the roofline's peaks (docs/profiling.md). None: the device
    table, else an ``attnscope calibrate`` result; on CPU without either, no roofline."""
    record_command_args: bool = False
    """The resource's ``process.command_args``: the whole command line, or (False) only the
    executable and the script or module (docs/attributes.md)."""
    compiled_graph_marks: bool = False
    """Mark instrumented calls on CUDA tensors in ``torch.compile``'d code, so that CUDA graphs
    of it (``mode="reduce-overhead"``) time them (docs/profiling.md). Read while Dynamo traces."""


class OtherSettings(TypedDict, total=False):
    """The settings :func:`attnscope.configure` takes as ``**other`` (those after its named
    ones), each of its :class:`Config` field's type or None (None: back to the default)."""

    profile_rate: float | None
    profile_max_per_minute: float | None
    warmup_calls: int | None
    max_spans_per_trace: int | None
    overhead_budget: float | None
    max_kernel_spans: int | None
    profile_dir: str | None
    reset_peak_memory_stats: bool | None
    queue_size: int | None
    seed: int | None
    metrics: bool | None
    meter_provider: MeterProvider | None
    slow_call_quantile: float | None
    live_trigger: bool | None
    trigger_dir: str | None
    run_id: str | None
    device_peaks: Mapping[str, float] | None
    record_command_args: bool | None
    compiled_graph_marks: bool | None


class Settings(OtherSettings, total=False):
    """Every keyword argument of :func:`attnscope.configure` (``configure(**settings)``): a key
    per :class:`Config` field. For the type checker only: ``configure()`` validates at run time
    whatever it is given (tests/test_public_api.py pins these to ``Config`` and ``configure``)."""

    service_name: str | None
    sample_rate: float | None
    exporter: ExporterSetting | None
    tracer_provider: TracerProvider | None
    enabled: bool | None


DEFAULT_OVERHEAD_BUDGET = 0.01


def budgeted(cfg: Config) -> tuple[float, bool, bool]:
    """(the budget in force, whether it lowers the sample rate, whether the profile rate).

    An ``overhead_budget`` the user set applies to both rates. Left unset, the default budget
    holds only while ``sample_rate`` is left at its default, and then lowers the sample rate and
    the profile rate unless that one was set: a sample rate the user asked for (``sample_rate=1.0``
    for a short experiment) is what they get, with no budget (1.0).
    """
    if cfg.overhead_budget is not None:
        return cfg.overhead_budget, True, True
    if cfg.sample_rate != Config.sample_rate:
        return 1.0, False, False
    return DEFAULT_OVERHEAD_BUDGET, True, cfg.profile_rate == Config.profile_rate


# name -> (env var, parser)
def _parse_bool(raw: str) -> bool:
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true/false, got {shown(raw)}")


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
    "slow_call_quantile": ("ATTNSCOPE_SLOW_CALL_QUANTILE", float),
    "live_trigger": ("ATTNSCOPE_LIVE_TRIGGER", _parse_bool),
    "trigger_dir": ("ATTNSCOPE_TRIGGER_DIR", str),
    "run_id": ("ATTNSCOPE_RUN_ID", str),
    "record_command_args": ("ATTNSCOPE_RECORD_COMMAND_ARGS", _parse_bool),
    "compiled_graph_marks": ("ATTNSCOPE_COMPILED_GRAPH_MARKS", _parse_bool),
}


def check_rate(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"attnscope: {name} must be a number in [0, 1], got {shown(value)}")
    # A comparison, not math.isnan(): NaN fails it too, and a huge int does not overflow.
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"attnscope: {name} must be in [0, 1], got {shown(value)}")
    return float(value)


def shown(value: Any) -> str:
    """A value for an error message: its repr, bounded; never raises (a ``__repr__`` that raises
    would replace the message that names the setting)."""
    try:
        text = repr(value)
    except Exception:
        return f"<{_type_name(value)} object (its repr() raised)>"
    return text if len(text) <= 80 else text[:77] + "..."


def _type_name(value: Any) -> str:
    try:
        return str(type(value).__qualname__)[:80]
    except Exception:
        return "unknown"


def _check_bool(name: str, value: Any) -> None:
    # A string such as "false" is truthy: accepting it would turn the setting on.
    if not isinstance(value, bool):
        raise ValueError(f"attnscope: {name} must be True or False, got {shown(value)}")


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"attnscope: {name} must be an integer >= {minimum}, got {shown(value)}")
    return value


_PEAK_KEYS = ("tflops", "gbps")
_PEAK_ENV = ("ATTNSCOPE_PEAK_TFLOPS", "ATTNSCOPE_PEAK_GBPS")


def _check_device_peaks(value: Any) -> Mapping[str, float] | None:
    """A read-only ``{"tflops", "gbps"}`` of finite positive numbers (at most 1e9 each)."""
    if value is None:
        return None
    if not isinstance(value, Mapping) or set(value) != set(_PEAK_KEYS):
        raise ValueError(f"attnscope: device_peaks must be a dict with exactly the keys "
                         f"'tflops' and 'gbps', got {shown(value)}")
    peaks: dict[str, float] = {}
    for key in _PEAK_KEYS:
        number = value[key]
        if isinstance(number, bool) or not isinstance(number, (int, float)) \
                or not 0 < number <= 1e9 or not math.isfinite(float(number)):
            raise ValueError(f"attnscope: device_peaks[{key!r}] must be a number in (0, 1e9], "
                             f"got {shown(number)}")
        peaks[key] = float(number)
    return types.MappingProxyType(peaks)


def _peaks_from_env(env: Mapping[str, str]) -> dict[str, float] | None:
    """Both peak variables, or neither; ValueError naming what is wrong."""
    raw = [env.get(var, "").strip() for var in _PEAK_ENV]
    if not any(raw):
        return None
    if not all(raw):
        given, missing = (_PEAK_ENV[0], _PEAK_ENV[1]) if raw[0] else (_PEAK_ENV[1], _PEAK_ENV[0])
        raise ValueError(f"attnscope: {given} is set without {missing}: set both or neither")
    try:
        return {key: float(text) for key, text in zip(_PEAK_KEYS, raw, strict=True)}
    except ValueError:
        raise ValueError(f"attnscope: {_PEAK_ENV[0]}/{_PEAK_ENV[1]} must be numbers, "
                         f"got {shown(raw[0])}/{shown(raw[1])}") from None


def _check_exporter(value: Any) -> ExporterSetting | None:
    if value is None:
        return None
    if isinstance(value, str):
        name = value.strip()
        if name.lower() in EXPORTER_NAMES:
            return name.lower()
        if any(name.startswith(p) and len(name) > len(p) for p in EXPORTER_PREFIXES):
            from ._safe_files import check_target  # no directory, device or link: ValueError

            check_target(name.split(":", 1)[1], "exporter")
            return name
        raise ValueError(
            f"attnscope: exporter must be one of {', '.join(EXPORTER_NAMES)}, "
            f"'jaeger-json:PATH', 'otlp-json:PATH' or a SpanExporter, got {shown(value)}"
        )
    if isinstance(value, type):
        raise ValueError(f"attnscope: exporter must be a SpanExporter instance, not the class "
                         f"{value.__name__} (write {value.__name__}(...))")
    if hasattr(value, "export") and hasattr(value, "shutdown"):
        return value  # type: ignore[no-any-return]
    raise ValueError(f"attnscope: exporter must be a name or a SpanExporter, got {shown(value)}")


def validate(cfg: Config) -> Config:
    if not isinstance(cfg.service_name, str) or not cfg.service_name:
        raise ValueError(f"attnscope: service_name must be a non-empty string, "
                         f"got {shown(cfg.service_name)}")
    _check_bool("enabled", cfg.enabled)
    _check_bool("metrics", cfg.metrics)
    _check_bool("reset_peak_memory_stats", cfg.reset_peak_memory_stats)
    _check_bool("live_trigger", cfg.live_trigger)
    _check_bool("record_command_args", cfg.record_command_args)
    _check_bool("compiled_graph_marks", cfg.compiled_graph_marks)
    if not 0.5 <= check_rate("slow_call_quantile", cfg.slow_call_quantile):
        raise ValueError(f"attnscope: slow_call_quantile must be in [0.5, 1] (1: off), "
                         f"got {shown(cfg.slow_call_quantile)}")
    if cfg.trigger_dir is not None and (not isinstance(cfg.trigger_dir, str)
                                        or not cfg.trigger_dir):
        raise ValueError(f"attnscope: trigger_dir must be a path string, "
                         f"got {shown(cfg.trigger_dir)}")
    check_rate("sample_rate", cfg.sample_rate)
    check_rate("profile_rate", cfg.profile_rate)
    if cfg.overhead_budget is not None:
        check_rate("overhead_budget", cfg.overhead_budget)
        if cfg.overhead_budget == 0.0:
            raise ValueError("attnscope: overhead_budget must be > 0 "
                             "(use enabled=False to turn off)")
    ppm = cfg.profile_max_per_minute
    if isinstance(ppm, bool) or not isinstance(ppm, (int, float)) or not ppm >= 0 \
            or not isinstance(ppm, float) and ppm > 1e18:  # NaN fails >= 0; a huge int, float()
        raise ValueError(f"attnscope: profile_max_per_minute must be a number from 0 to 1e18 "
                         f"(or inf), got {shown(ppm)}")
    _check_int("warmup_calls", cfg.warmup_calls, 0)
    _check_int("max_spans_per_trace", cfg.max_spans_per_trace, 1)
    _check_int("max_kernel_spans", cfg.max_kernel_spans, 1)
    _check_int("queue_size", cfg.queue_size, 1)
    _check_int("seed", cfg.seed, 0)
    _check_exporter(cfg.exporter)
    if cfg.tracer_provider is not None and not hasattr(cfg.tracer_provider, "get_tracer"):
        raise ValueError(
            f"attnscope: tracer_provider must be an OpenTelemetry TracerProvider, "
            f"got {shown(cfg.tracer_provider)}"
        )
    if cfg.meter_provider is not None and not hasattr(cfg.meter_provider, "get_meter"):
        raise ValueError(
            f"attnscope: meter_provider must be an OpenTelemetry MeterProvider, "
            f"got {shown(cfg.meter_provider)}"
        )
    if cfg.run_id is not None and not (isinstance(cfg.run_id, str) and cfg.run_id.strip()):
        raise ValueError(f"attnscope: run_id must be a non-empty string, got {shown(cfg.run_id)}")
    if cfg.profile_dir is not None and not isinstance(cfg.profile_dir, str):
        raise ValueError(f"attnscope: profile_dir must be a path string, "
                         f"got {shown(cfg.profile_dir)}")
    return dataclasses.replace(
        cfg,
        sample_rate=float(cfg.sample_rate),
        profile_rate=float(cfg.profile_rate),
        overhead_budget=None if cfg.overhead_budget is None else float(cfg.overhead_budget),
        profile_max_per_minute=float(ppm),
        slow_call_quantile=float(cfg.slow_call_quantile),
        exporter=_check_exporter(cfg.exporter),
        device_peaks=_check_device_peaks(cfg.device_peaks),
    )


def from_env(environ: Mapping[str, str] | None = None, *, strict: bool = True,
             warn: Warn | None = None) -> Config:
    """Defaults overlaid with the environment.

    ``strict=False`` skips bad values, telling ``warn``; all but an unusable
    ``ATTNSCOPE_EXPORTER``, which the export pipeline replaces by "nowhere" and reports itself.
    """
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
                warn("env:" + var, f"attnscope: ignoring the environment variable "
                     f"{var}={shown(raw)}: {exc}", {"variable": var, "value": raw})
    try:
        peaks = _peaks_from_env(env)
        if peaks is not None:
            values["device_peaks"] = _check_device_peaks(peaks)
    except ValueError as exc:
        if strict:
            raise ValueError(f"attnscope: environment variables {_PEAK_ENV[0]}/{_PEAK_ENV[1]} "
                             f"are invalid: {exc}") from None
        if warn is not None:
            warn("env:ATTNSCOPE_PEAK", f"attnscope: ignoring the environment variables "
                 f"{_PEAK_ENV[0]}/{_PEAK_ENV[1]}: {str(exc).removeprefix('attnscope: ')}",
                 {"variable": "ATTNSCOPE_PEAK_TFLOPS/ATTNSCOPE_PEAK_GBPS", "reason": str(exc)})
    disabled = env.get("OTEL_SDK_DISABLED")
    if disabled is not None and disabled.strip():
        try:
            if _parse_bool(disabled):
                values["enabled"] = False
        except ValueError:  # the SDK reads anything but "true" as false: say so, do the same
            if warn is not None:
                warn("env:OTEL_SDK_DISABLED", f"attnscope: ignoring the environment variable "
                     f"OTEL_SDK_DISABLED={shown(disabled)} (expected true or false; attnscope "
                     "stays enabled)", {"variable": "OTEL_SDK_DISABLED", "value": disabled})
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
            # An unusable ATTNSCOPE_EXPORTER is not ignored: the export pipeline sends spans
            # nowhere in its place and says so in one line (_export/destinations.py); "ignoring"
            # here would be a second line, and untrue.
            if warn is not None and field != "exporter":
                var = _ENV[field][0] if field in _ENV else field
                warn("env:" + field, f"attnscope: ignoring the environment variable "
                     f"{var}={shown(value)}: not a valid {field}",
                     {"setting": field, "variable": var, "value": value})
    return cfg
