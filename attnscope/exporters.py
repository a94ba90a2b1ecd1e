"""Span exporters: files for looking at traces without a tracing backend, and OTLP exporters for
an application's own ``TracerProvider``.

The public import path (docs/jaeger.md, docs/live.md, docs/exporting.md); the code lives in
:mod:`attnscope._export`.
"""

from typing import Any

from opentelemetry.sdk.trace.export import SpanExporter

from attnscope._export.jaeger_json import JaegerJSONFileExporter
from attnscope._export.jaeger_merge import merge_jaeger_json
from attnscope._export.otlp_json import OTLPJSONFileExporter, read_otlp_json_lines

__all__ = ["JaegerJSONFileExporter", "OTLPJSONFileExporter", "merge_jaeger_json",
           "otlp_span_exporter", "read_otlp_json_lines"]


def otlp_span_exporter(protocol: str = "grpc", **kwargs: Any) -> SpanExporter:
    """The OpenTelemetry SDK's OTLP span exporter (``protocol``: ``"grpc"`` or
    ``"http/protobuf"``; ``kwargs`` and the ``OTEL_EXPORTER_OTLP_*`` variables as for the SDK's
    class), its requests encoded by attnscope: the same bytes at a fifth of the CPU, for every
    span of the provider it serves (docs/exporting.md). The exporter attnscope builds for
    ``exporter="otlp"`` is this one."""
    from attnscope._export import otlp_exporters

    if protocol == "grpc":
        return otlp_exporters.grpc_exporter_class()(**kwargs)  # type: ignore[no-any-return]
    if protocol == "http/protobuf":
        return otlp_exporters.http_exporter_class()(**kwargs)  # type: ignore[no-any-return]
    raise ValueError(f"protocol must be 'grpc' or 'http/protobuf', got {protocol!r}")
