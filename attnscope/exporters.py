"""Span exporters that write files, for looking at traces without running a tracing backend.

The public import path (docs/jaeger.md, docs/live.md); the code lives in :mod:`attnscope._export`.
"""

from attnscope._export.jaeger_json import JaegerJSONFileExporter
from attnscope._export.jaeger_merge import merge_jaeger_json
from attnscope._export.otlp_json import OTLPJSONFileExporter, read_otlp_json_lines

__all__ = ["JaegerJSONFileExporter", "OTLPJSONFileExporter", "merge_jaeger_json",
           "read_otlp_json_lines"]
