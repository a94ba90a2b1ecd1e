"""Where spans and metrics go: the resource, span exporters by name, meter providers and readers.

The OTLP exporters read the standard ``OTEL_EXPORTER_OTLP_*`` variables themselves; attnscope only
picks gRPC or HTTP. Metrics: ``meter_provider=`` → the application's global SDK MeterProvider →
our own, with the readers named in ``OTEL_METRICS_EXPORTER``.
"""

from __future__ import annotations

import importlib
import os
import platform
import socket
import sys
from collections.abc import Sequence
from typing import Any, cast

from opentelemetry.sdk.resources import OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from .. import _dist, _log
from .. import _schema as schema
from .._config import EXPORTER_NAMES, Config, budgeted, validate
from .._runtime import runtime
from .._version import __version__
from . import otlp_exporters, otlp_status
from .otel_env import (
    check_headers,
    exporter_kwargs,
    invalid_endpoint,
    metric_preferences,
    otlp_endpoint,
    reader_kwargs,
)

__all__ = ["NowhereExporter", "command_args", "command_line", "config_attributes", "make_exporter",
           "meter_provider_for", "otlp_protocol", "preload_imports", "program_of", "resource",
           "resource_attributes", "traces_exporter_from_env", "unusable_env_exporter"]

_DEFAULT_SERVICE = Config.service_name
_OTLP_NAMES = ("otlp", "otlp-grpc", "otlp-http")


# ---- resource ------------------------------------------------------------------------------------


def resource_attributes(cfg: Config) -> dict[str, Any]:
    """attnscope's own resource attributes (before ``OTEL_RESOURCE_ATTRIBUTES`` is merged in)."""
    attrs: dict[str, Any] = {
        "service.name": cfg.service_name,
        schema.VERSION.name: __version__,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
        "process.executable.name": os.path.basename(sys.executable),
        "process.runtime.name": platform.python_implementation().lower(),
        "process.runtime.version": platform.python_version(),
        schema.RANK.name: _dist.rank(),
        schema.WORLD_SIZE.name: _dist.world_size(),
        schema.HOST_ARCH.name: platform.machine() or "unknown",
        schema.COMMAND_ARGS.name: command_args(command_line(cfg.record_command_args)),
        **config_attributes(cfg),
    }
    started = _process_start()
    if started is not None:
        attrs[schema.PROCESS_START.name] = started
    cpu = _cpu_name()
    if cpu:
        attrs[schema.CPU_NAME.name] = cpu
    # Only when the program imported it: importing transformers here would cost seconds.
    transformers = sys.modules.get("transformers")
    version = getattr(transformers, "__version__", None)
    if isinstance(version, str):
        attrs[schema.TRANSFORMERS_VERSION.name] = version
    try:
        import torch

        attrs[schema.TORCH_VERSION.name] = str(torch.__version__)
        # Only name the GPU when CUDA is already up: initialising it here would cost the app.
        if torch.cuda.is_available() and torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
            attrs[schema.DEVICE_NAME.name] = torch.cuda.get_device_name()
    except Exception:
        pass
    return attrs


def config_attributes(cfg: Config) -> dict[str, Any]:
    """The settings what was measured depends on, as resource attributes (a report or a diary
    entry states them). A later ``configure()`` changes them without a new pipeline: attnscope's
    own emitter puts the values in force on each span's resource (``worker.emit``)."""
    return {schema.CONFIG_SAMPLE_RATE.name: float(cfg.sample_rate),
            schema.CONFIG_PROFILE_RATE.name: float(cfg.profile_rate),
            schema.CONFIG_OVERHEAD_BUDGET.name: float(budgeted(cfg)[0]),  # the one in force
            schema.CONFIG_WARMUP_CALLS.name: int(cfg.warmup_calls)}


_MAX_ARGS, _MAX_ARG_CHARS = 64, 512


def command_line(record_all: bool) -> list[str]:
    """This process's command line as the resource states it: whole when ``record_all``
    (``record_command_args``), else :func:`program_of` it (arguments may be secrets or prompts)."""
    argv = [str(a) for a in (getattr(sys, "orig_argv", None) or sys.argv)]
    return argv if record_all else program_of(argv)


def program_of(argv: Sequence[str]) -> list[str]:
    """The interpreter and what it runs, without the arguments or the interpreter's options:
    ``[python, script]``, ``[python, "-m", module]``, ``[python, "-c"]`` (never the program's
    text). ``argv`` is the interpreter's (``sys.orig_argv``)."""
    if not argv:
        return []
    words, i = [argv[0]], 1
    while i < len(argv):
        word = argv[i]
        if word == "--":  # ends the interpreter's options: the script follows
            i += 1
            break
        if word.startswith("--"):
            i += 2 if word == "--check-hash-based-pycs" else 1
            continue
        if not word.startswith("-") or word == "-":
            break
        # one-letter options, grouped (-uBc): c, m, W and X take the rest of the word or the next
        for at, letter in enumerate(word[1:], 2):
            if letter not in "cmWX":
                continue
            rest = word[at:]
            if letter == "c":
                return [*words, "-c"]
            if letter == "m":
                return [*words, "-m", rest or (argv[i + 1] if i + 1 < len(argv) else "")]
            i += 0 if rest else 1  # -W/-X: their value is the next word
            break
        i += 1
    if i < len(argv):
        words.append(argv[i])  # the script, or "-" (standard input)
    return words


def command_args(argv: list[str]) -> list[str]:
    """The command line as a bounded list: at most ``_MAX_ARGS`` entries of ``_MAX_ARG_CHARS``
    characters; a cut list ends with ``"…(N more)"``, a cut entry with ``"…"``."""
    args = [str(a) if len(str(a)) <= _MAX_ARG_CHARS else str(a)[:_MAX_ARG_CHARS - 1] + "…"
            for a in list(argv)[:_MAX_ARGS]]
    if len(argv) > _MAX_ARGS:
        args[-1] = f"…({len(argv) - _MAX_ARGS + 1} more)"
    return args


def _process_start() -> str | None:
    """This process's start, ISO 8601 UTC to the millisecond; None where psutil cannot tell."""
    try:
        import datetime

        import psutil

        created = psutil.Process().create_time()
        return datetime.datetime.fromtimestamp(created, datetime.timezone.utc).isoformat(
            timespec="milliseconds").replace("+00:00", "Z")
    except Exception:
        return None


def _cpu_name() -> str | None:
    """The CPU's model name (Linux: /proc/cpuinfo; elsewhere the platform's processor string)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "Hardware") and value.strip():
                    return value.strip()[:128]
    except OSError:
        pass
    return (platform.processor() or "")[:128] or None


def resource(cfg: Config) -> Resource:
    """The Resource of providers attnscope creates.

    ``OTEL_RESOURCE_ATTRIBUTES`` overrides attnscope's detected attributes. ``service.name``:
    a ``service_name`` configured to something other than the default, else ``OTEL_SERVICE_NAME``,
    else ``service.name`` in ``OTEL_RESOURCE_ATTRIBUTES``, else "attnscope".
    """
    attrs = resource_attributes(cfg)
    _check_resource_attributes()
    with otlp_status.sdk_quiet():  # the SDK's line per malformed entry, per detection
        try:
            env_attrs = dict(OTELResourceDetector().detect().attributes)
        except Exception as exc:
            _log.internal_error("resource", exc)
            env_attrs = {}
        attrs.update(env_attrs)
        if cfg.service_name != _DEFAULT_SERVICE or not env_attrs.get("service.name"):
            attrs["service.name"] = cfg.service_name
        return Resource.create(attrs)


def _check_resource_attributes() -> None:
    """One line for the entries of ``OTEL_RESOURCE_ATTRIBUTES`` the SDK drops (no ``=``, or an
    empty key), in place of its own lines."""
    raw = os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    bad = [item.strip() for item in raw.split(",") if item.strip()
           and (not item.partition("=")[1] or not item.partition("=")[0].strip())]
    if bad:
        _log.warn_once("otel-env-OTEL_RESOURCE_ATTRIBUTES", "attnscope: OTEL_RESOURCE_ATTRIBUTES "
                       "has malformed entries (expected key=value,...); they are left out",
                       variable="OTEL_RESOURCE_ATTRIBUTES", ignored=len(bad),
                       first=bad[0][:64])


# ---- exporters -----------------------------------------------------------------------------------


class _Stderr:
    """``sys.stderr`` as it is when written to (a program or a test may replace it later)."""

    def write(self, text: str) -> int:
        stream = sys.stderr
        return stream.write(text) if stream is not None else len(text)  # pythonw: no stderr

    def flush(self) -> None:
        if sys.stderr is not None:
            sys.stderr.flush()


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
        _log.warn_once("otlp-protocol", "attnscope: only OTLP http/protobuf is supported over "
                          "HTTP; using it", value=raw)
        return "http/protobuf"
    _log.warn_once("otlp-protocol", "attnscope: unknown OTLP protocol; using grpc", value=raw)
    return "grpc"


def make_exporter(name: str) -> SpanExporter | None:
    """A SpanExporter for a configured name; None for "none"."""
    if name == "none":
        return None
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        # stderr, not the SDK's stdout: the program's stdout is its own (`... | jq .`)
        return ConsoleSpanExporter(out=cast(Any, _Stderr()))
    if name.startswith("jaeger-json:"):
        from .jaeger_json import JaegerJSONFileExporter

        return JaegerJSONFileExporter(name.split(":", 1)[1])
    if name.startswith("otlp-json:"):
        from .otlp_json import OTLPJSONFileExporter

        return OTLPJSONFileExporter(name.split(":", 1)[1])
    http = name == "otlp-http" or (name == "otlp" and otlp_protocol() == "http/protobuf")
    if not http and name not in ("otlp", "otlp-grpc"):
        raise ValueError(f"attnscope: unknown exporter {name!r}")
    bad = invalid_endpoint("TRACES", grpc=not http)
    if bad is not None:
        return NowhereExporter(f"{bad[0]}={bad[1][:64]!r} is not a URL")
    check_headers("TRACES")
    exporter: SpanExporter
    with otlp_status.sdk_quiet():  # the SDK's line per malformed header: check_headers said it
        # the SDK's exporters, their requests encoded by attnscope's encoder (.otlp_exporters)
        if http:
            exporter = otlp_exporters.http_exporter_class()(
                **exporter_kwargs("TRACES", grpc=False), **_session("TRACES"))
        else:
            exporter = otlp_exporters.grpc_exporter_class()(**exporter_kwargs("TRACES", grpc=True))
    otlp_status.keep_endpoint(exporter, otlp_endpoint("TRACES", grpc=not http))
    return exporter


def preload_imports(cfg: Config) -> None:
    """Import what building ``cfg``'s pipeline will import (the metrics SDK, an OTLP exporter of
    the configured protocol), on attnscope's spare thread at set-up: the worker's thread imported
    them beside the first requests (152 modules, 137 ms for OTLP over gRPC, from the first sampled
    call to a built pipeline). Nothing is built; a wrong guess imports one module too many or
    leaves one to the worker. Never raises."""
    try:
        import importlib

        name = cfg.exporter if isinstance(cfg.exporter, str) else (
            traces_exporter_from_env() if cfg.exporter is None and cfg.tracer_provider is None
            else None)
        modules = []
        if cfg.metrics and cfg.meter_provider is None:
            modules.append("opentelemetry.sdk.metrics.export")
        if name in ("otlp", "otlp-http", "otlp-grpc"):
            http = name == "otlp-http" or (name == "otlp" and otlp_protocol() == "http/protobuf")
            package = "opentelemetry.exporter.otlp.proto." + ("http" if http else "grpc")
            modules.append(package + ".trace_exporter")
            if cfg.metrics and cfg.meter_provider is None:
                modules.append(package + ".metric_exporter")
        for module in modules:
            importlib.import_module(module)
        if any(m.endswith(".trace_exporter") for m in modules):
            otlp_exporters.encoder()  # its check against the SDK's encoding, done once, here
    except Exception:  # noqa: BLE001  (the worker imports it when it builds, and says why)
        pass


def _session(signal: str) -> dict[str, Any]:
    """``session=`` for an OTLP/HTTP exporter: attnscope's bounded one, unless a credential
    provider (``OTEL_PYTHON_EXPORTER_OTLP_HTTP_[{signal}_]CREDENTIAL_PROVIDER``) makes the
    session: the exporter loads that one itself."""
    prefix = "OTEL_PYTHON_EXPORTER_OTLP_HTTP_"
    if os.environ.get(f"{prefix}CREDENTIAL_PROVIDER") or os.environ.get(
            f"{prefix}{signal}_CREDENTIAL_PROVIDER"):
        return {}
    from .bounded_http import BoundedSession

    return {"session": BoundedSession()}


class NowhereExporter(SpanExporter):
    """In place of a destination that cannot be used (an explicit one, invalid): spans go nowhere
    else, each export fails (counted in ``stats()["export_failed"]``), and one WARNING says why."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        _log.warn_once("export-nowhere", f"attnscope: {reason}; spans are exported nowhere "
                       "(counted in attnscope.stats()['export_failed'])", reason=reason)

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def unusable_env_exporter() -> NowhereExporter | None:
    """A :class:`NowhereExporter` when ``ATTNSCOPE_EXPORTER`` is set but cannot be used (an
    invalid name, a file in a directory that does not exist, ...), else None. The configuration
    skipped the value: without this the spans would go to the default OTLP endpoint."""
    raw = os.environ.get("ATTNSCOPE_EXPORTER", "").strip()
    if not raw:
        return None
    try:
        validate(Config(exporter=raw))
    except ValueError as exc:
        return NowhereExporter(f"ATTNSCOPE_EXPORTER={raw[:200]!r} cannot be used "
                               f"({str(exc).removeprefix('attnscope: ')[:300]})")
    return None


def traces_exporter_from_env() -> str:
    """The first supported name in ``OTEL_TRACES_EXPORTER`` (default "otlp")."""
    name = os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")[0].strip().lower() or "otlp"
    if name not in EXPORTER_NAMES:
        _log.warn_once("traces-exporter",
                          "attnscope: unsupported OTEL_TRACES_EXPORTER; using otlp", value=name)
        name = "otlp"
    return name


# ---- metrics ----------------------------------------------------------------------------


def meter_provider_for(cfg: Config, traces_via: str | None, resource: Any, *,
                       own: bool = True) -> tuple[Any, bool, tuple[Any, ...]]:
    """``(meter provider, owned, readers)`` for ``cfg``, or ``(None, False, ())`` when metrics go
    nowhere. ``readers``: the metric readers attnscope created for its own provider (a provider
    does not list its readers in public), empty for one it did not create.

    Order: ``meter_provider=`` → the application's global SDK MeterProvider → our own, with the
    readers named in ``OTEL_METRICS_EXPORTER`` (otlp, prometheus, console, none). When that is
    unset, ours exports over OTLP only if attnscope's spans do (``traces_via`` is an OTLP name), so
    ``exporter="jaeger-json:..."`` or an injected ``tracer_provider`` never opens a connection.
    """
    if not cfg.metrics:
        return None, False, ()
    if cfg.meter_provider is not None:
        return cfg.meter_provider, False, ()
    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics import MeterProvider

    global_provider = otel_metrics.get_meter_provider()
    if isinstance(global_provider, MeterProvider):
        return global_provider, False, ()
    if not own:
        return None, False, ()
    raw = os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower()
    if raw:
        names = [n.strip() for n in raw.split(",") if n.strip()]
    else:
        names = ["otlp"] if traces_via in _OTLP_NAMES else []
    readers = tuple(r for r in (_reader(n, traces_via) for n in names) if r is not None)
    if not readers:
        return None, False, ()
    return MeterProvider(metric_readers=readers, resource=_lasting(resource, cfg),
                         shutdown_on_exit=False), True, readers


def _lasting(res: Any, cfg: Config) -> Any:
    """``res`` without the settings a later ``configure()`` changes while the provider lives
    (``attnscope.config.*``): a meter provider's resource is fixed once it is made, so they
    would go stale there (spans take those in force: ``_spans.emit``); what the sampling does
    now is a metric of its own (``attnscope.sampling.effective_rate``)."""
    if not isinstance(res, Resource):
        return res
    changing = config_attributes(cfg)
    return Resource({k: v for k, v in res.attributes.items() if k not in changing},
                    res.schema_url)


def _reader(name: str, traces_via: str | None) -> Any:
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

    if name == "none":
        return None
    if name == "otlp":
        guarded = _otlp_metric_exporter(traces_via)
        if guarded is None:
            return None
        return PeriodicExportingMetricReader(guarded, **reader_kwargs())
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return PeriodicExportingMetricReader(ConsoleMetricExporter(out=cast(Any, _Stderr())),
                                             **reader_kwargs())
    if name == "prometheus":
        return _prometheus_reader()
    _log.warn_once("metrics-exporter", "attnscope: unsupported OTEL_METRICS_EXPORTER entry; "
                      "skipped", value=name)
    return None


def _otlp_metric_exporter(traces_via: str | None) -> Any:
    """The OTLP metric exporter in its guard (``otlp_status.MetricExportGuard``); None when its
    endpoint is not a URL (said once)."""
    http = traces_via == "otlp-http" or (traces_via != "otlp-grpc"
                                         and otlp_protocol("METRICS") == "http/protobuf")
    bad = invalid_endpoint("METRICS", grpc=not http)
    if bad is not None:
        _log.warn_once("export-nowhere-metrics", f"attnscope: {bad[0]}={bad[1][:64]!r} is not a "
                       "URL; metrics are exported nowhere", variable=bad[0])
        return None
    check_headers("METRICS")
    temporality, aggregation = metric_preferences(grpc=not http)
    preferences: dict[str, Any] = {"preferred_temporality": temporality,
                                   "preferred_aggregation": aggregation}
    with otlp_status.sdk_quiet():
        if http:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
                OTLPMetricExporter as HTTPMetricExporter,
            )

            exporter: Any = HTTPMetricExporter(**exporter_kwargs("METRICS", grpc=False),
                                               **_session("METRICS"), **preferences)
        else:
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import (
                OTLPMetricExporter as GRPCMetricExporter,
            )

            exporter = GRPCMetricExporter(**exporter_kwargs("METRICS", grpc=True), **preferences)
    otlp_status.keep_endpoint(exporter, otlp_endpoint("METRICS", grpc=not http))
    return otlp_status.MetricExportGuard(exporter, temporality, aggregation)


def _prometheus_reader() -> Any:
    """A Prometheus reader served on OTEL_EXPORTER_PROMETHEUS_HOST:PORT (localhost:9464)."""
    try:  # optional extra: imported by name so type checking does not need it installed
        exporter_module = importlib.import_module("opentelemetry.exporter.prometheus")
        reader_cls = exporter_module.PrometheusMetricReader
        start_http_server = importlib.import_module("prometheus_client").start_http_server
    except ImportError:
        _log.warn_once("prometheus", "attnscope: OTEL_METRICS_EXPORTER=prometheus needs the "
                          "extra: pip install 'attnscope[prometheus]'")
        return None
    reader = reader_cls()
    if not runtime.metrics.prometheus_started:
        host = os.environ.get("OTEL_EXPORTER_PROMETHEUS_HOST", "localhost")
        port = int(os.environ.get("OTEL_EXPORTER_PROMETHEUS_PORT", "9464"))
        start_http_server(port=port, addr=host)
        runtime.metrics.prometheus_started = True
    return reader


