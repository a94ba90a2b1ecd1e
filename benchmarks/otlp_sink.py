"""A local OTLP trace receiver that takes requests and discards them, for benchmarks.

Serves OTLP/HTTP (``POST /v1/traces``) and OTLP/gRPC (``TraceService/Export``) on two ports,
answers each request with an empty success, never parses a body (its own CPU stays small), and
counts requests and bytes. Run in its own process, so the exporting program pays its own side of
an export (encoding, the transport) and nothing of the receiver's.

    python benchmarks/otlp_sink.py HTTP_PORT GRPC_PORT   # prints "ready" once both listen;
                                                          # on SIGTERM/SIGINT, one JSON line of
                                                          # {"requests": n, "bytes": n}
"""

from __future__ import annotations

import http.server
import json
import signal
import sys
import threading
from concurrent import futures
from typing import Any

import grpc

_counts = {"requests": 0, "bytes": 0}
_lock = threading.Lock()


def _count(size: int) -> None:
    with _lock:
        _counts["requests"] += 1
        _counts["bytes"] += size


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self) -> None:  # noqa: N802  (http.server's name)
        size = int(self.headers.get("Content-Length", 0))
        self.rfile.read(size)
        _count(size)
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:  # quiet
        pass


def _export(request: bytes, context: Any) -> bytes:
    _count(len(request))
    return b""  # an empty ExportTraceServiceResponse


def main(argv: list[str]) -> None:
    http_port, grpc_port = int(argv[0]), int(argv[1])
    web = http.server.ThreadingHTTPServer(("127.0.0.1", http_port), _Handler)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.unary_unary_rpc_method_handler(_export)  # bytes in, bytes out: no parsing
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(
        "opentelemetry.proto.collector.trace.v1.TraceService", {"Export": handler}),))
    server.add_insecure_port(f"127.0.0.1:{grpc_port}")
    server.start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    print("ready", flush=True)
    done.wait()
    server.stop(0)
    web.shutdown()
    print(json.dumps(_counts), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
