"""The OTLP span exporters attnscope builds: the SDK's, their requests encoded by
:mod:`.otlp_encode`.

Everything else (endpoints, headers, TLS, compression, retries, the SDK's own metrics) is the
SDK exporter's, unchanged. Only the step from spans to an ``ExportTraceServiceRequest`` differs:

- over gRPC, through ``_translate_data``, the method the SDK's exporter mixin has each signal's
  exporter implement;
- over HTTP, the SDK exporter's own method that encodes (``export``, or ``_serialize_spans`` in
  older releases), run with ``encode_spans`` naming this module's :func:`encode_serialized`
  instead of the SDK's: the request's bytes as written, no message built to be serialized. A
  copy of the function, not a change to the SDK's module: any other exporter in the program is
  untouched. When no method of a release calls ``encode_spans``, the SDK's class is used as it
  is.

Either way a request is encoded by the SDK when the fast encoder did not reproduce the installed
SDK's bytes on the probe spans, or cannot write one of the request's spans exactly.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable, Sequence
from typing import Any

from .. import _log
from .otlp_encode import Encoder, first_variant, matches_sdk

__all__ = ["Serialized", "encode_request", "encode_serialized", "encoder", "grpc_exporter_class",
           "http_exporter_class"]


@functools.cache
def encoder() -> Encoder | None:
    """The fast encoder in the variant that writes what the installed SDK writes, else None."""
    try:
        found = first_variant(Encoder, matches_sdk)
        if found is not None:
            return found
        _log.debug_once("otlp-encode", "attnscope: the OpenTelemetry SDK's OTLP encoding differs "
                        "from attnscope's; spans are encoded by the SDK")
    except Exception as exc:  # the SDK's encoding, as before
        _log.internal_error("otlp-encode", exc)
    return None


def encode_request(spans: Sequence[Any]) -> Any:
    """``encode_spans(spans)`` of the SDK, the same message, written by :func:`encoder`."""
    data = _encoded(spans)
    return _sdk_message(spans) if data is None else _message(data)


def encode_serialized(spans: Sequence[Any]) -> Any:
    """:func:`encode_request` for a caller that only serializes the message (the HTTP
    exporter): the bytes as written, no message built and serialized again."""
    data = _encoded(spans)
    return _sdk_message(spans) if data is None else Serialized(data)


def _sdk_message(spans: Sequence[Any]) -> Any:
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    return encode_spans(spans)


class Serialized:
    """An ``ExportTraceServiceRequest`` already serialized: its bytes for what an exporter asks of
    it, the parsed message for anything else it might ask (made then, once)."""

    __slots__ = ("data", "_parsed")

    def __init__(self, data: bytes) -> None:
        self.data = data
        self._parsed: Any = None

    def SerializePartialToString(self, **options: Any) -> bytes:  # noqa: N802 (protobuf's)
        return self.data if not options else self._message().SerializePartialToString(**options)

    def SerializeToString(self, **options: Any) -> bytes:  # noqa: N802 (protobuf's)
        return self.data if not options else self._message().SerializeToString(**options)

    def ByteSize(self) -> int:  # noqa: N802 (protobuf's)
        return len(self.data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._message(), name)

    def _message(self) -> Any:
        if self._parsed is None:
            self._parsed = _message(self.data)
        return self._parsed


def _encoded(spans: Sequence[Any]) -> bytes | None:
    fast = encoder()
    if fast is not None:
        try:
            return fast.encode(spans)
        except Exception as exc:  # this request the SDK's way
            _log.internal_error("otlp-encode", exc)
    return None


def _message(data: bytes) -> Any:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    return ExportTraceServiceRequest.FromString(data)


@functools.cache
def grpc_exporter_class() -> type:
    """The SDK's OTLP/gRPC span exporter, its requests from :func:`encode_request`."""
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

    def _translate_data(self: Any, data: Sequence[Any], *more: Any, **named: Any) -> Any:
        if more or named:  # a release that passes more than the spans: its own way
            return OTLPSpanExporter._translate_data(self, data, *more, **named)
        return encode_request(data)

    return type("AttnscopeGRPCSpanExporter", (OTLPSpanExporter,),
                {"_translate_data": _translate_data, "__module__": __name__})


@functools.cache
def http_exporter_class() -> type:
    """The SDK's OTLP/HTTP span exporter, each of its methods that calls ``encode_spans`` calling
    :func:`encode_serialized` instead (``export`` in 1.45, ``_serialize_spans`` in 1.30); the SDK's
    class as it is when none does."""
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    copies = {name: copy for name, fn in vars(OTLPSpanExporter).items()
              if (copy := _with_global(fn, "encode_spans", encode_serialized)) is not None}
    if not copies:
        return OTLPSpanExporter
    return type("AttnscopeHTTPSpanExporter", (OTLPSpanExporter,),
                {**copies, "__module__": __name__})


def _with_global(fn: Any, name: str, value: Callable[..., Any]) -> Any:
    """A copy of function ``fn`` whose global ``name`` is ``value``; None when ``fn`` is not a
    plain function reading that global."""
    if not isinstance(fn, types.FunctionType) or name not in fn.__code__.co_names \
            or name not in fn.__globals__:
        return None
    copy = types.FunctionType(fn.__code__, {**fn.__globals__, name: value}, fn.__name__,
                              fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = fn.__qualname__
    copy.__doc__ = fn.__doc__
    return copy
