"""The ``requests`` session attnscope gives its OTLP/HTTP exporters: what one request may cost is
bounded.

``requests`` reads an answer whole, however long (a collector answering 200 with an endless body
grew memory by gigabytes), and its timeout applies to each read of the socket, not to the request
(one trickling a byte a second held the export thread forever, spans stuck in flight). This
session:

- reads at most :data:`MAX_BODY_BYTES` of an answer (an OTLP answer is a few bytes; its status and
  headers, all the exporter looks at, are kept) and drops the connection past that;
- gives each request an overall deadline, the timeout the exporter passes (what is left of its
  ``OTEL_EXPORTER_OTLP_TIMEOUT``): once it passes, a timer shuts the connection's socket down,
  which wakes the read blocked on it, and the request fails as a timeout (its spans are counted in
  ``export_failed``). The exporter's retries stay within the same timeout, so an export ends
  within it.

Proxies (``HTTPS_PROXY``) keep the bound on the body; the deadline covers plain HTTP proxies too,
not SOCKS ones.
"""

from __future__ import annotations

import socket
import threading
from typing import Any

import requests
import urllib3
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from .. import _log

__all__ = ["MAX_BODY_BYTES", "BoundedSession"]

MAX_BODY_BYTES = 1 << 20
_CHUNK = 64 << 10
_DEFAULT_DEADLINE_S = 10.0  # the OTLP exporters' default timeout, for a request given none
_MIN_DEADLINE_S = 0.001
_local = threading.local()  # .watch: the deadline of the request this thread is sending


class _Watch:
    """One request's deadline: once it passes, the socket of its connection is shut down."""

    def __init__(self, timeout_s: float) -> None:
        self.fired = False
        self._conn: Any = None
        self._lock = threading.Lock()
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True
        self._timer.name = "attnscope-http-deadline"

    def start(self) -> None:
        self._timer.start()

    def cancel(self) -> None:
        self._timer.cancel()

    def attach(self, conn: Any) -> None:
        """The connection the request uses (again after it connected: it has a socket now)."""
        with self._lock:
            self._conn = conn
            if self.fired:
                _shut(conn)

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._conn is not None:
                _shut(self._conn)


def _shut(conn: Any) -> None:
    # shutdown, not close: a read blocked in another thread wakes only on shutdown
    sock = getattr(conn, "sock", None)
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def _attach(conn: Any) -> None:
    watch = getattr(_local, "watch", None)
    if watch is not None:
        watch.attach(conn)


class _Connection(HTTPConnection):
    def connect(self) -> None:
        super().connect()
        _attach(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self)  # a pooled connection, already connected
        super().request(*args, **kwargs)


class _TLSConnection(HTTPSConnection):
    def connect(self) -> None:
        super().connect()
        _attach(self)

    def request(self, *args: Any, **kwargs: Any) -> None:
        _attach(self)
        super().request(*args, **kwargs)


class _Pool(HTTPConnectionPool):
    ConnectionCls = _Connection


class _TLSPool(HTTPSConnectionPool):
    ConnectionCls = _TLSConnection


_POOLS = {"http": _Pool, "https": _TLSPool}


class _Adapter(HTTPAdapter):
    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if type(manager) is urllib3.ProxyManager:  # SOCKS managers have pools of their own
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


class BoundedSession(requests.Session):
    """A ``requests.Session`` whose requests end by their timeout and read a bounded answer."""

    def __init__(self) -> None:
        super().__init__()
        adapter = _Adapter()
        self.mount("http://", adapter)
        self.mount("https://", adapter)

    def request(self, method: str | bytes, url: str | bytes,
                *args: Any, **kwargs: Any) -> requests.Response:
        timeout = kwargs.get("timeout")
        if isinstance(timeout, tuple):
            timeout = sum(t for t in timeout if isinstance(t, (int, float)))
        deadline_s = float(timeout) if isinstance(timeout, (int, float)) else _DEFAULT_DEADLINE_S
        kwargs["stream"] = True  # the body is read here, bounded
        watch = _Watch(max(_MIN_DEADLINE_S, deadline_s))
        _local.watch = watch
        watch.start()
        try:
            response = super().request(method, url, *args, **kwargs)  # type: ignore[arg-type]
            try:
                _read_bounded(response)
            finally:
                if watch.fired:
                    response.close()
            if watch.fired:
                raise requests.exceptions.ReadTimeout(f"no complete answer within {deadline_s} s")
            return response
        except Exception:  # requests' errors, and whatever a socket shut down under urllib3 raises
            if watch.fired:
                raise requests.exceptions.ReadTimeout(
                    f"no complete answer within {deadline_s} s") from None
            raise
        finally:
            _local.watch = None
            watch.cancel()


def _read_bounded(response: requests.Response) -> None:
    """Read the answer's body into ``response.content``, at most ``MAX_BODY_BYTES`` of it."""
    chunks: list[bytes] = []
    size = 0
    for chunk in response.iter_content(_CHUNK):
        if size + len(chunk) > MAX_BODY_BYTES:
            chunks.append(chunk[:MAX_BODY_BYTES - size])
            response.close()  # the rest is never read: the connection is not reused
            _log.warn_once("export-answer-too-long", "attnscope: the OTLP endpoint's answer was "
                           f"longer than {MAX_BODY_BYTES} bytes; the rest was not read",
                           endpoint=str(response.url)[:200], status=response.status_code)
            break
        chunks.append(chunk)
        size += len(chunk)
    # as requests does for a body it read itself: .content returns it, the stream is consumed
    response._content = b"".join(chunks)
    response._content_consumed = True
