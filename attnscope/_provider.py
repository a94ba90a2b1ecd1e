"""Where attnscope's spans go: the app's TracerProvider, or one of ours with an exporter.

Order: ``tracer_provider=`` → an explicit ``exporter=`` (our own provider) → the application's
global SDK provider → our own provider with ``OTEL_TRACES_EXPORTER`` (default "otlp"). attnscope
never sets the global provider and never shuts down one it did not create.
"""

from __future__ import annotations

import os
import platform
import socket
from typing import Any

from opentelemetry import trace as otel_trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from . import _sampling
from ._config import Config
from ._version import __version__

__all__ = ["Pipeline", "build", "make_exporter", "resource_attributes"]

INSTRUMENTATION_NAME = "attnscope"


class Pipeline:
    """The tracer the worker builds spans with, and the provider if attnscope owns it."""

    def __init__(self, tracer: Any, provider: Any, owned: bool) -> None:
        self.tracer = tracer
        self.provider = provider
        self.owned = owned

    def force_flush(self, timeout_ms: int) -> bool:
        flush = getattr(self.provider, "force_flush", None)
        if flush is None:
            return True
        return bool(flush(timeout_ms))

    def shutdown(self) -> None:
        if self.owned:
            self.provider.shutdown()


def resource_attributes(cfg: Config) -> dict[str, Any]:
    """Resource attributes for a provider attnscope creates."""
    attrs: dict[str, Any] = {
        "service.name": cfg.service_name,
        "attnscope.version": __version__,
        "host.name": socket.gethostname(),
        "process.pid": os.getpid(),
        "process.runtime.name": platform.python_implementation().lower(),
        "process.runtime.version": platform.python_version(),
        "attnscope.rank": _sampling.rank(),
        "attnscope.world_size": _sampling.world_size(),
    }
    try:
        import torch

        attrs["attnscope.torch.version"] = str(torch.__version__)
        # Only name the GPU when CUDA is already up: initialising it here would cost the app.
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            attrs["attnscope.device.name"] = torch.cuda.get_device_name()
    except Exception:
        pass
    return attrs


def _otlp_protocol() -> str:
    raw = os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or os.environ.get(
        "OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"
    )
    return raw.strip().lower()


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
    if name == "otlp-http" or (name == "otlp" and _otlp_protocol().startswith("http")):
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


def _own(cfg: Config, exporter: Any) -> Pipeline:
    provider = TracerProvider(resource=Resource.create(resource_attributes(cfg)))
    span_exporter = make_exporter(exporter) if isinstance(exporter, str) else exporter
    if span_exporter is not None:
        provider.add_span_processor(BatchSpanProcessor(span_exporter))
    return Pipeline(provider.get_tracer(INSTRUMENTATION_NAME, __version__), provider, owned=True)


def build(cfg: Config) -> Pipeline:
    """Resolve the configured destination (see the module docstring for the order)."""
    if cfg.tracer_provider is not None:
        provider = cfg.tracer_provider
        return Pipeline(provider.get_tracer(INSTRUMENTATION_NAME, __version__), provider, owned=False)
    if cfg.exporter is not None:
        return _own(cfg, cfg.exporter)
    global_provider = otel_trace.get_tracer_provider()
    if isinstance(global_provider, TracerProvider):
        return Pipeline(
            global_provider.get_tracer(INSTRUMENTATION_NAME, __version__), global_provider, owned=False
        )
    name = os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")[0].strip().lower() or "otlp"
    if name not in ("otlp", "otlp-grpc", "otlp-http", "console", "none"):
        from . import _safety

        _safety.warn_once("traces-exporter", "attnscope: unsupported OTEL_TRACES_EXPORTER; using otlp",
                          value=name)
        name = "otlp"
    return _own(cfg, name)
