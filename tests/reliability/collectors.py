"""Fault-injecting OTLP collectors for the reliability suite, on top of tests/e2e/otlp_fakes.py.

Modes (both protocols unless said): ``ok``; ``hang`` (hold every request until healed);
``slow`` (answer after ``SLOW_S``, then accept); ``flapping`` (up ``FLAP_S``, down ``FLAP_S``:
gRPC ``UNAVAILABLE`` / HTTP 503 while down); gRPC ``unavailable`` and ``error`` (``INTERNAL``);
HTTP ``status-429``, ``status-500``, ``status-503``. ``heal()`` turns any of them into ``ok`` and
lets held requests go (they are answered with an error and not stored, so nothing is counted as
both exported and failed). A collector can be started on a given port: an "absent" collector is
healed by starting one where the exporter was sending.

Only requests answered with success while the client still waited are kept in
``trace_requests``.
"""

from __future__ import annotations

import http.server
import socket
import threading
import time
from concurrent import futures
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from tests.e2e.otlp_fakes import GRPCServing, HTTPServing, spans_of

__all__ = ["FaultyGRPC", "FaultyHTTP", "SLOW_S"]

SLOW_S = 2.0
FLAP_S = 0.4
_HOLD_MAX_S = 60.0


class _Faults:
    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.calls = 0
        self.trace_requests: list[Any] = []
        self.healed = threading.Event()
        self._lock = threading.Lock()
        self._born = time.monotonic()

    def heal(self) -> None:
        self.mode = "ok"
        self.healed.set()

    def fail_again(self, mode: str) -> None:
        """Back to ``mode`` after a :meth:`heal` (held requests are held again)."""
        self.healed.clear()
        self.mode = mode

    @property
    def spans(self) -> list[Any]:
        with self._lock:
            return spans_of(list(self.trace_requests))

    def decide(self) -> str:
        """What to answer now: "ok", "fail-retryable", "fail", or an HTTP "status-N"."""
        with self._lock:
            self.calls += 1
        mode = self.mode
        if mode == "hang":
            self.healed.wait(_HOLD_MAX_S)
            return "fail-retryable"
        if mode == "slow":
            self.healed.wait(SLOW_S)
            return "ok"
        if mode == "flapping":
            down = int((time.monotonic() - self._born) / FLAP_S) % 2 == 1
            return "fail-retryable" if down else "ok"
        if mode == "unavailable":
            return "fail-retryable"
        if mode == "error":
            return "fail"
        if mode.startswith("status-"):
            return mode
        return "ok"

    def keep(self, request: Any) -> None:
        with self._lock:
            self.trace_requests.append(request)


# an answer sent with less than this left before the client's deadline may arrive after it
_DEADLINE_MARGIN_S = 0.3


class FaultyGRPC(_Faults, GRPCServing):
    """OTLP/gRPC traces receiver with the modes above."""

    def start(self, port: int = 0) -> FaultyGRPC:
        outer = self

        class Traces(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC name)
                answer = outer.decide()
                if answer == "fail-retryable":
                    context.abort(grpc.StatusCode.UNAVAILABLE, "fake collector unavailable")
                if answer != "ok":
                    context.abort(grpc.StatusCode.INTERNAL, "fake collector error")
                # past the client's deadline the exporter has counted this batch failed:
                # keeping it too would count it twice (seen in CI, under load). The answer can
                # still miss a deadline that is close when it is checked: refuse the batch then,
                # so that it is counted failed and not kept, once
                remaining = context.time_remaining()
                if remaining is not None and remaining < _DEADLINE_MARGIN_S:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "too close to the deadline")
                if context.is_active():
                    outer.keep(request)
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Traces(), server)
        self.port = server.add_insecure_port(f"127.0.0.1:{port}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        self.healed.set()
        self.stop_serving()


class FaultyHTTP(_Faults, HTTPServing):
    """OTLP/HTTP (protobuf) traces receiver with the modes above."""

    def __init__(self, mode: str = "ok") -> None:
        super().__init__(mode)

    def start(self, port: int = 0) -> FaultyHTTP:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                return None

            def do_POST(self) -> None:  # noqa: N802 (http.server name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                answer = outer.decide()
                if answer == "fail-retryable":
                    return self._reply(503)
                if answer == "fail":
                    return self._reply(500)
                if answer.startswith("status-"):
                    return self._reply(int(answer.split("-", 1)[1]))
                request = trace_service_pb2.ExportTraceServiceRequest()
                request.ParseFromString(body)
                if self._client_gone():  # past its timeout: the exporter counted it failed
                    return None
                if self._reply(200, trace_service_pb2.ExportTraceServiceResponse()):
                    outer.keep(request)

            def _client_gone(self) -> bool:
                """The client closed the connection (a write to it could still succeed once)."""
                try:
                    return self.connection.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
                except BlockingIOError:
                    return False
                except OSError:
                    return True

            def _reply(self, status: int, message: Any = None) -> bool:
                data = message.SerializeToString() if message is not None else b""
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/x-protobuf")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    self.wfile.flush()
                except OSError:  # the client gave up (its timeout): it counts this as failed
                    return False
                return True

        self.serve(Handler, port, "faulty-otlp-http")
        return self

    def stop(self) -> None:
        self.healed.set()
        self.stop_serving()
