"""Small OTLP receivers for fault tests: gRPC (from opentelemetry-proto's services) and HTTP.

Each listens on 127.0.0.1 on a free port and answers in one of these modes:

- ``ok``: accept and keep the decoded requests (and the request headers / gRPC metadata);
- ``hang``: hold every request until :meth:`stop` (or 30 s), like a stuck collector;
- ``error``: fail every request (gRPC ``INTERNAL``, HTTP 500): not retryable;
- ``unavailable``: gRPC ``UNAVAILABLE`` / HTTP 503: retryable, so exporters retry until their
  timeout.
"""

from __future__ import annotations

import gzip
import http.server
import socket
import threading
import zlib
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

__all__ = ["GRPCCollector", "HTTPCollector", "free_port", "spans_of"]

MODES = ("ok", "hang", "error", "unavailable")
_HANG_MAX_S = 30.0


def free_port() -> int:
    """A port nothing listens on right now (bound and released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def spans_of(requests: list[Any]) -> list[Any]:
    """Every span in a list of ExportTraceServiceRequest."""
    return [span for req in requests for rs in req.resource_spans for ss in rs.scope_spans
            for span in ss.spans]


class _Base:
    def __init__(self, mode: str) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.trace_requests: list[trace_service_pb2.ExportTraceServiceRequest] = []
        self.metric_requests: list[metrics_service_pb2.ExportMetricsServiceRequest] = []
        self.headers: list[dict[str, str]] = []
        self.calls = 0
        self.release = threading.Event()
        self._lock = threading.Lock()

    def _note(self, headers: dict[str, str]) -> None:
        with self._lock:
            self.calls += 1
            self.headers.append(headers)

    @property
    def spans(self) -> list[Any]:
        return spans_of(self.trace_requests)


class GRPCServing:
    """A gRPC server on 127.0.0.1 for a receiver: addressed, stopped."""

    port = 0
    _server: grpc.Server | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop_serving(self) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
            self._server = None


class GRPCCollector(_Base, GRPCServing):
    """An OTLP/gRPC receiver for traces and metrics."""

    def __init__(self, mode: str = "ok") -> None:
        super().__init__(mode)

    def _answer(self, context: grpc.ServicerContext) -> bool:
        self._note({k: v for k, v in context.invocation_metadata() if isinstance(v, str)})
        if self.mode == "hang":
            self.release.wait(_HANG_MAX_S)
            context.abort(grpc.StatusCode.UNAVAILABLE, "released")
        if self.mode == "error":
            context.abort(grpc.StatusCode.INTERNAL, "fake collector error")
        if self.mode == "unavailable":
            context.abort(grpc.StatusCode.UNAVAILABLE, "fake collector unavailable")
        return True

    def start(self) -> GRPCCollector:
        outer = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC name)
                outer._answer(context)
                outer.trace_requests.append(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        class Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC name)
                outer._answer(context)
                outer.metric_requests.append(request)
                return metrics_service_pb2.ExportMetricsServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(Metrics(), server)
        self.port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.release.set()
        self.stop_serving()


class HTTPServing:
    """A threaded HTTP server on 127.0.0.1 for a receiver: started, addressed, stopped."""

    _server: http.server.ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None

    def serve(self, handler: type[http.server.BaseHTTPRequestHandler], port: int,
              name: str) -> None:
        server = http.server.ThreadingHTTPServer(("127.0.0.1", port), handler)
        server.daemon_threads = True
        self._server = server
        self._thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=name, daemon=True)
        self._thread.start()

    @property
    def port(self) -> int:
        assert self._server is not None
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop_serving(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(5)


class HTTPCollector(_Base, HTTPServing):
    """An OTLP/HTTP (protobuf) receiver for /v1/traces and /v1/metrics."""

    def __init__(self, mode: str = "ok") -> None:
        super().__init__(mode)
        self.paths: list[str] = []

    def start(self) -> HTTPCollector:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return None

            def do_POST(self) -> None:  # noqa: N802 (http.server name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer._note({k.lower(): v for k, v in self.headers.items()})
                outer.paths.append(self.path)
                if outer.mode == "hang":
                    outer.release.wait(_HANG_MAX_S)
                    return self._reply(503)
                if outer.mode in ("error", "unavailable"):
                    return self._reply(500 if outer.mode == "error" else 503)
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                if self.path.endswith("/v1/metrics"):
                    metrics_req = metrics_service_pb2.ExportMetricsServiceRequest()
                    metrics_req.ParseFromString(body)
                    outer.metric_requests.append(metrics_req)
                    return self._reply(200, metrics_service_pb2.ExportMetricsServiceResponse())
                trace_req = trace_service_pb2.ExportTraceServiceRequest()
                trace_req.ParseFromString(body)
                outer.trace_requests.append(trace_req)
                return self._reply(200, trace_service_pb2.ExportTraceServiceResponse())

            def _reply(self, status: int, message: Any = None) -> None:
                data = message.SerializeToString() if message is not None else b""
                try:
                    self.send_response(status)
                except OSError:
                    return
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(data)))
                try:
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (its timeout): nothing to answer
                    pass

        self.serve(Handler, 0, "fake-otlp-http")
        return self

    def stop(self) -> None:
        self.release.set()
        self.stop_serving()
