"""Shared fixtures: every test starts from a clean attnscope with no exporter on the network."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import signal
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

# A shell without job control starts a background command (`pytest &`, a CI step run under
# `nohup`) with SIGINT ignored, and children inherit that: Python then installs no
# KeyboardInterrupt handler, and the tests that send a child Ctrl-C wait for one in vain. A
# handler of ours is reset to the default in every child, so children get the usual Ctrl-C.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# The command line's tables take $COLUMNS for a file or a pipe: a shell or runner that exports it
# (pytest-xdist's workers set 80) wraps the tables the CLI tests read. Their width is the CLI's own.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)

# Tests never send to a collector unless they configure one themselves.
os.environ.setdefault("ATTNSCOPE_EXPORTER", "none")
os.environ.setdefault("ATTNSCOPE_METRICS", "false")
# Peaks an `attnscope calibrate` saved in the developer's own cache would put a roofline on every
# CPU span: the suite reads (and its calibrate tests write) a cache of its own.
# Removed at exit: each pytest process (an xdist worker too) makes one, and CI machines are reused.
_CACHE = tempfile.mkdtemp(prefix="attnscope-test-cache-")
os.environ["XDG_CACHE_HOME"] = _CACHE
atexit.register(shutil.rmtree, _CACHE, ignore_errors=True)

_OURS = ("ATTNSCOPE_", "OTEL_")


@pytest.fixture(autouse=True)
def _clean_attnscope(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from attnscope import _api

    for var in list(os.environ):
        if var.startswith(_OURS) and var not in ("ATTNSCOPE_EXPORTER", "ATTNSCOPE_METRICS"):
            monkeypatch.delenv(var, raising=False)
    from attnscope._runtime import runtime

    _api.reset_defaults()  # stops the worker, resets every piece of attnscope's state
    _api.current()
    # register_attention() classes outlive reset (they are user code's): a test's go with it
    registered = dict(runtime.instrumentation.attention_registry)
    yield
    runtime.instrumentation.attention_registry.clear()
    runtime.instrumentation.attention_registry.update(registered)
    _api.reset_defaults()
    _api.current()


# The message attnscope._log.internal_error logs (once per stage per minute; counted every time).
_INTERNAL_ERROR = "attnscope internal error"


class _InternalErrorRecords(logging.Handler):
    """Keeps the internal-error records of the ``attnscope`` logger, logged on any thread."""

    def __init__(self) -> None:
        super().__init__(logging.NOTSET)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith(_INTERNAL_ERROR):
            self.records.append(record)


@pytest.fixture(autouse=True)
def _internal_error_guard(request: pytest.FixtureRequest,
                          _clean_attnscope: None) -> Iterator[list[logging.LogRecord]]:
    """Fail a test whose run logged an attnscope internal error, unless it expects one.

    attnscope swallows its own errors so the host program never breaks; without this the suite
    would not see them either. A test expecting some says so with ``@pytest.mark.internal_errors``
    (any stage) or ``@pytest.mark.internal_errors("stage", ...)`` (those stages only), or by
    requesting the ``internal_errors`` fixture. Both signals are read: the count (errors are
    counted even when the logger is off for WARNING or the line is rate-limited) and the records
    (they survive a reset of the count inside the test, and say which thread logged).
    """
    from attnscope import _api
    from attnscope._log import LOGGER_NAME
    from attnscope._runtime import runtime

    handler = _InternalErrorRecords()
    logger = logging.getLogger(LOGGER_NAME)
    before = dict(runtime.log.errors_by_stage)
    logger.addHandler(handler)
    try:
        yield handler.records
        # The worker reports what it did for the test after the body returns: stop it (bounded,
        # as the reset after this does anyway) so its errors are this test's. A worker that
        # outlives that wait may log into the next test: its thread name is in the message.
        _api.shutdown(timeout_s=5.0)
    finally:
        logger.removeHandler(handler)
    counted = {stage: n - before.get(stage, 0) for stage, n in runtime.log.errors_by_stage.items()
               if n > before.get(stage, 0)}
    unexpected = _unexpected(request, counted, handler.records)
    if unexpected:
        pytest.fail(unexpected, pytrace=False)


def _unexpected(request: pytest.FixtureRequest, counted: dict[str, int],
                logged: list[logging.LogRecord]) -> str:
    """What the test did not declare, as a failure message ("" when all was expected)."""
    if "internal_errors" in request.fixturenames:
        return ""
    marker = request.node.get_closest_marker("internal_errors")
    if marker is not None and not marker.args:
        return ""
    allowed = set(marker.args) if marker is not None else set()
    stages = {s: n for s, n in counted.items() if s not in allowed}
    lines = [f"  [{r.threadName}] {r.getMessage()}" for r in logged
             if getattr(r, "attnscope", {}).get("stage") not in allowed]
    if not stages and not lines:
        return ""
    return "\n".join([
        "attnscope logged internal errors this test does not declare "
        "(@pytest.mark.internal_errors(...) or the internal_errors fixture):",
        f"  counted by stage: {stages}", *lines])


@pytest.fixture
def internal_errors(_internal_error_guard: list[logging.LogRecord]) -> list[logging.LogRecord]:
    """Declares that the test expects internal errors; the records logged so far (any thread)."""
    return _internal_error_guard


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTEL_*/ATTNSCOPE_* variables at all, not even the suite's exporter/metrics defaults."""
    from attnscope import _api

    for var in list(os.environ):
        if var.startswith(_OURS):
            monkeypatch.delenv(var, raising=False)
    _api.reset_defaults()
    yield


@pytest.fixture
def reader() -> Any:
    """An in-memory metric reader (the metrics tests')."""
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    return InMemoryMetricReader()


@pytest.fixture
def meter_provider(reader: Any) -> Iterator[Any]:
    """A meter provider over ``reader``, shut down after the test."""
    from opentelemetry.sdk.metrics import MeterProvider

    mp = MeterProvider(metric_readers=[reader])
    yield mp
    mp.shutdown()
