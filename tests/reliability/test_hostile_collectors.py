"""Collectors that misbehave on purpose (issue 35 §6, §7).

§6: an OTLP/HTTP collector that answers 200 with an endless body made the exporter read it all
(memory without bound, the export never ending); one that trickles its answer a byte at a time
held the exporter forever (the timeout applied per read). What is read is bounded and each
request ends by the export's timeout.

§7: a program that exits while its collector hangs, resets connections or answers 429/503 lost
every span without a line on stderr. At exit, undelivered spans get one WARNING: how many, where.
"""

from __future__ import annotations

import logging
import re
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import attnscope
from tests.reliability.collectors import FaultyGRPC, FaultyHTTP
from tests.reliability.harness import Figures, clean_env

CALLS = 20
_HOLD_MAX_S = 60.0


class HostileHTTP:
    """An HTTP server that reads each request, then answers in one of these ways:

    - ``endless``: 200, chunked, 64 KiB chunks for as long as the client reads (at most
      ``_ENDLESS_CAP`` bytes); ``sent`` counts what went out;
    - ``trickle-body``: 200 with ``Content-Length: 100000``, then a byte every 0.2 s;
    - ``trickle-headers``: ``HTTP/1.1 200 OK`` then a header, a byte every 0.2 s;
    - ``reset``: no answer: the connection is reset (RST).
    """

    _ENDLESS_CAP = 512 << 20

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sent = 0
        self.requests = 0
        self._stop = threading.Event()
        self._listener = socket.socket()
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = self._listener.getsockname()[1]
        self._threads: list[threading.Thread] = []
        accept = threading.Thread(target=self._accept, daemon=True)
        accept.start()
        self._threads.append(accept)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        self._stop.set()
        try:
            self._listener.close()
        except OSError:
            pass
        for t in self._threads:
            t.join(10)

    def _accept(self) -> None:
        self._listener.settimeout(0.2)
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(_HOLD_MAX_S)
            while not self._stop.is_set() and self._read_request(conn):
                self.requests += 1
                self._answer(conn)
                if self.mode != "endless":
                    break
        except OSError:
            pass
        finally:
            conn.close()

    def _read_request(self, conn: socket.socket) -> bool:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length:\s*(\d+)", head).group(1))  # type: ignore[union-attr]
        while len(body) < length:
            chunk = conn.recv(65536)
            if not chunk:
                return False
            body += chunk
        return True

    def _answer(self, conn: socket.socket) -> None:
        if self.mode == "reset":
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return
        if self.mode == "endless":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\n"
                         b"Transfer-Encoding: chunked\r\n\r\n")
            chunk = b"10000\r\n" + b"\0" * 0x10000 + b"\r\n"
            while not self._stop.is_set() and self.sent < self._ENDLESS_CAP:
                conn.sendall(chunk)
                self.sent += len(chunk)
            return
        head = (b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" if self.mode == "trickle-body"
                else b"HTTP/1.1 200 OK\r\nX-Slow: ")
        conn.sendall(head)
        while not self._stop.wait(0.2):
            conn.sendall(b"a")
            self.sent += 1


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[HostileHTTP]:
    server = HostileHTTP(request.param)
    try:
        yield server
    finally:
        server.stop()


def _configure(monkeypatch: pytest.MonkeyPatch, endpoint: str, timeout_s: str = "1") -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", timeout_s)
    attnscope.configure(exporter="otlp-http", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0,
                        metrics=False)


def _received(collector: Any, n: int, wait_s: float = 30.0) -> int:
    """The spans the collector kept, once it has ``n`` or ``wait_s`` passed: it answers 200
    before its handler thread keeps the batch, so the exporter can count it first."""
    deadline = time.monotonic() + wait_s
    while len(collector.spans) < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return len(collector.spans)


def _traffic(n: int = CALLS) -> None:
    f = attnscope.trace(name="hostile")(lambda x: x + 1)
    for i in range(n):
        assert f(i) == i + 1


# ---- §6 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hostile", ["endless"], indirect=True)
def test_an_endless_answer_is_read_to_a_bound(monkeypatch: pytest.MonkeyPatch,
                                             caplog: pytest.LogCaptureFixture,
                                             hostile: HostileHTTP, figures: Figures) -> None:
    figures.set("collector answers 200 with an endless body", f"{CALLS} spans, otlp-http",
                "endless chunked body")
    _configure(monkeypatch, hostile.endpoint, timeout_s="30")
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        _traffic()
        flushed = attnscope.flush(30)
    stats = attnscope.stats()
    figures.add(bytes_sent_by_collector=hostile.sent, exported=stats["exported"],
                in_flight=stats["export_in_flight"])
    # the exporter stopped reading after a bounded amount (kernel buffers hold a few MiB more):
    # before the fix it read until the collector's cap of 512 MiB
    assert hostile.sent < 64 << 20
    assert flushed
    assert stats["export_in_flight"] == 0
    assert stats["exported"] == CALLS  # the status was 200: the collector took them
    assert any("longer than" in r.getMessage() for r in caplog.records if r.name == "attnscope")


@pytest.mark.parametrize("hostile", ["trickle-body", "trickle-headers"], indirect=True)
def test_a_trickling_answer_ends_by_the_export_timeout(monkeypatch: pytest.MonkeyPatch,
                                                      hostile: HostileHTTP,
                                                      figures: Figures) -> None:
    figures.set("collector trickles its answer (1 byte / 0.2 s)", f"{CALLS} spans, otlp-http, "
                "OTEL_EXPORTER_OTLP_TIMEOUT=1", hostile.mode)
    _configure(monkeypatch, hostile.endpoint)
    _traffic()
    # before the fix the export never ended (each byte came within the per-read timeout):
    # this flush returned False with every span in flight
    attnscope.flush(30)
    stats = attnscope.stats()
    figures.add(in_flight=stats["export_in_flight"], failed=stats["export_failed"])
    assert stats["export_in_flight"] == 0
    assert stats["export_failed"] == CALLS and stats["exported"] == 0


def test_the_bounded_session_keeps_a_complete_answer(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = FaultyHTTP("ok").start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
        attnscope.configure(exporter="otlp-http", sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0,
                            profile_rate=0.0, metrics=False)
        _traffic()
        assert attnscope.flush(30)
        assert attnscope.stats()["exported"] == CALLS
        assert _received(collector, CALLS) == CALLS
    finally:
        collector.stop()


# ---- §7 ----------------------------------------------------------------------------------------

_EXITING_APP = textwrap.dedent("""
    import os, sys
    import attnscope
    attnscope.configure(sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0, metrics=False,
                        exporter=sys.argv[1])
    f = attnscope.trace(name="exits")(lambda x: x + 1)
    for i in range(300):
        f(i)
    print("done", flush=True)
""")


def _exit_line(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "at exit," in line and "attnscope" in line]


@pytest.mark.parametrize("case", ["http-hang", "http-status-429", "http-status-503", "http-reset",
                                  "grpc-hang"])
def test_spans_lost_at_exit_get_one_line(tmp_path: Path, case: str, figures: Figures) -> None:
    proto, mode = case.split("-", 1)
    collector: Any
    if mode == "reset":
        collector = HostileHTTP("reset")
    elif proto == "http":
        collector = FaultyHTTP(mode).start()
    else:
        collector = FaultyGRPC(mode).start()
    script = tmp_path / "app.py"
    script.write_text(_EXITING_APP)
    endpoint = f"http://127.0.0.1:{collector.port}"
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OMP_NUM_THREADS="1")
    figures.set("program exits while its collector misbehaves", f"300 spans, otlp-{proto}",
                mode)
    try:
        proc = _run(script, "otlp-http" if proto == "http" else "otlp-grpc", env)
    finally:
        collector.stop()
    lines = _exit_line(proc.stderr)
    figures.add(exit_lines=len(lines), rc=proc.returncode)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "done" in proc.stdout
    # before the fix: nothing on stderr at all
    assert len(lines) == 1, proc.stderr[-2000:]
    match = re.search(r"at exit, (\d+) of (\d+) spans were not delivered to (\S+): ", lines[0])
    assert match is not None, lines[0]
    assert int(match.group(1)) == int(match.group(2)) > 0
    assert match.group(3).startswith(endpoint)


def test_no_line_at_exit_when_every_span_was_delivered(tmp_path: Path) -> None:
    collector = FaultyHTTP("ok").start()
    script = tmp_path / "app.py"
    script.write_text(_EXITING_APP)
    env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{collector.port}",
                    OMP_NUM_THREADS="1")
    try:
        proc = _run(script, "otlp-http", env)
    finally:
        collector.stop()
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert _exit_line(proc.stderr) == [], proc.stderr[-2000:]
    assert _received(collector, 300) == 300


def _run(script: Path, exporter: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(script), exporter], capture_output=True,
                          text=True, timeout=120, env=env)
