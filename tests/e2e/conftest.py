"""Fixtures for end-to-end export tests: a real Arize Phoenix server, fake OTLP collectors.

Phoenix is found through ``ATTNSCOPE_PHOENIX`` (path to the ``phoenix`` executable), else
``phoenix`` on PATH, else ``/opt/phoenix-venv/bin/phoenix``; the tests that need it skip with the
reason when it is missing or does not come up. It listens on 127.0.0.1 only, on free ports, with
its database in a temporary directory, and is terminated (then killed) at the end of the session.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.otlp_fakes import GRPCCollector, HTTPCollector, free_port

_PHOENIX_FALLBACK = "/opt/phoenix-venv/bin/phoenix"
_STARTUP_S = 60.0


@pytest.fixture(autouse=True)
def _bare(bare_env: None) -> None:
    """No OTEL_*/ATTNSCOPE_* variables from the outside (the root conftest resets attnscope)."""


def find_phoenix() -> str | None:
    candidates = (os.environ.get("ATTNSCOPE_PHOENIX"), shutil.which("phoenix"), _PHOENIX_FALLBACK)
    for candidate in candidates:
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class Phoenix:
    http_port: int
    grpc_port: int
    log_path: Path

    @property
    def http_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def grpc_endpoint(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def spans(self, trace_id: str | None = None) -> list[dict[str, Any]]:
        """Spans of the default project (all pages), optionally of one trace (32 hex digits)."""
        out: list[dict[str, Any]] = []
        cursor: str | None = None
        while True:
            url = f"{self.http_endpoint}/v1/projects/default/spans?limit=1000"
            if cursor:
                url += f"&cursor={cursor}"
            with urllib.request.urlopen(url, timeout=10) as resp:
                page = json.loads(resp.read())
            out.extend(page["data"])
            cursor = page.get("next_cursor")
            if not cursor:
                break
        if trace_id is not None:
            out = [s for s in out if s["context"]["trace_id"] == trace_id]
        return out

    def wait_for_spans(
        self, trace_id: str, count: int, timeout_s: float = 20.0
    ) -> list[dict[str, Any]]:
        """Poll until ``count`` spans of ``trace_id`` are stored (Phoenix stores asynchronously)."""
        deadline = time.monotonic() + timeout_s
        found: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            found = self.spans(trace_id)
            if len(found) >= count:
                return found
            time.sleep(0.25)
        return found

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(timeout=10)


@pytest.fixture(scope="session")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    """A running Phoenix on 127.0.0.1, stopped after the session; skips if it cannot start."""
    exe = find_phoenix()
    if exe is None:
        pytest.skip("Arize Phoenix not found: set ATTNSCOPE_PHOENIX, put `phoenix` on PATH or "
                    f"install it into {os.path.dirname(os.path.dirname(_PHOENIX_FALLBACK))} "
                    "(pip install arize-phoenix)")
    workdir = tmp_path_factory.mktemp("phoenix")
    px = Phoenix(http_port=free_port(), grpc_port=free_port(), log_path=workdir / "phoenix.log")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "PHOENIX_"))}
    env.update(
        PHOENIX_HOST="127.0.0.1",
        PHOENIX_PORT=str(px.http_port),
        PHOENIX_GRPC_PORT=str(px.grpc_port),
        PHOENIX_WORKING_DIR=str(workdir),
        PHOENIX_TELEMETRY_ENABLED="false",
        PHOENIX_ALLOW_EXTERNAL_RESOURCES="false",
    )
    with open(px.log_path, "wb") as log:
        proc = subprocess.Popen([exe, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + _STARTUP_S
        while not _healthy(f"{px.http_endpoint}/healthz"):
            if proc.poll() is not None:
                pytest.skip(f"Phoenix exited with {proc.returncode} at startup:\n{px.tail()}")
            if time.monotonic() > deadline:
                pytest.skip(f"Phoenix not healthy after {_STARTUP_S:.0f} s:\n{px.tail()}")
            time.sleep(0.25)
        yield px
    finally:
        _stop(proc)


@pytest.fixture
def grpc_collector(request: pytest.FixtureRequest) -> Iterator[GRPCCollector]:
    """A fake OTLP/gRPC collector; mode from ``@pytest.mark.parametrize(..., indirect=True)``."""
    collector = GRPCCollector(getattr(request, "param", "ok")).start()
    yield collector
    collector.stop()


@pytest.fixture
def http_collector(request: pytest.FixtureRequest) -> Iterator[HTTPCollector]:
    collector = HTTPCollector(getattr(request, "param", "ok")).start()
    yield collector
    collector.stop()
