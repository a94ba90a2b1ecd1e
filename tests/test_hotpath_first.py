"""No request pays attnscope's set-up (issue 37 goal 1): ``configure()`` returns once its thread
has imported the worker side, so that a first request made right after it does not share the GIL
with 100 ms and more of imports (the first instrumented ``generate()`` took 2x a later one on CPU,
``benchmarks/bench_first_call.py --generate 32``). The import itself stays on attnscope's thread,
never the caller's (tests/test_first_call.py)."""

from __future__ import annotations

import sys
import threading
import time

import pytest

from attnscope._runtime import runtime
from attnscope._worker import spare


class _SlowSpare:
    """A spare thread whose import takes ``delay_s`` (a loaded host)."""

    made: list[_SlowSpare] = []

    def __init__(self, delay_s: float = 0.3) -> None:
        self.loaded = threading.Event()
        self.started = time.monotonic()
        threading.Timer(delay_s, self.loaded.set).start()
        self.made.append(self)

    def take(self, job: object) -> bool:
        return False


@pytest.fixture
def slow(monkeypatch: pytest.MonkeyPatch) -> type[_SlowSpare]:
    _SlowSpare.made = []
    monkeypatch.setattr(spare, "Spare", _SlowSpare)
    monkeypatch.setattr(runtime.worker, "spare", None)
    monkeypatch.setattr(runtime.worker, "current", None)
    return _SlowSpare


def test_preload_returns_once_the_worker_side_is_imported(slow: type[_SlowSpare]) -> None:
    spare.preload()
    assert len(slow.made) == 1
    assert slow.made[0].loaded.is_set()  # before: configure() returned while it still imported
    assert runtime.worker.spare is slow.made[0]


def test_preload_waits_no_longer_than_its_bound(slow: type[_SlowSpare],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An import slower than the bound goes on in the background: configure() returns."""
    class VerySlow(_SlowSpare):
        def __init__(self) -> None:
            super().__init__(delay_s=30.0)

    monkeypatch.setattr(spare, "Spare", VerySlow)
    t = time.monotonic()
    spare.preload(wait_s=0.05)
    assert time.monotonic() - t < 20.0
    assert not slow.made[0].loaded.is_set()
    slow.made[0].loaded.set()


def test_preload_does_not_wait_inside_an_import(slow: type[_SlowSpare],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """``attnscope run`` configures from its hook right after torch executed, while torch's import
    lock is still held; the spare thread's import of the worker side needs torch, so a wait there
    waited out the whole bound: every ``attnscope run`` program took 10 s more (12.2 s against
    2.1 s for one that imports torch and exits)."""
    import types

    class Never(_SlowSpare):
        def __init__(self) -> None:
            super().__init__(delay_s=3600.0)

    importing = types.ModuleType("attnscope_test_importing")
    importing.__spec__ = types.SimpleNamespace(_initializing=True)  # type: ignore[assignment]
    monkeypatch.setitem(sys.modules, importing.__name__, importing)
    monkeypatch.setattr(spare, "Spare", Never)
    waited = threading.Event()
    done = threading.Thread(target=lambda: (spare.preload(wait_s=3600.0), waited.set()),
                            daemon=True)
    done.start()
    assert waited.wait(120.0), "preload waited for an import that needs this thread's import"
    assert not slow.made[0].loaded.is_set()
    slow.made[0].loaded.set()


def test_preload_waits_though_its_own_thread_is_importing(slow: type[_SlowSpare],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The spare's own import of the worker side is under way an instant after it starts: it
    looked like the caller's import, and ``configure()`` did not wait (most runs: 82 ms against
    262 ms for ``configure()`` in a fresh interpreter; the first line logged on a user's call
    then imported structlog there, 45 ms and more)."""
    import types

    engine = types.ModuleType("attnscope_test_engine")

    class Importing(_SlowSpare):
        def __init__(self) -> None:
            engine.__spec__ = types.SimpleNamespace(_initializing=True)  # type: ignore[assignment]
            monkeypatch.setitem(sys.modules, engine.__name__, engine)
            super().__init__(delay_s=0.3)

    monkeypatch.setattr(spare, "Spare", Importing)
    spare.preload()
    assert slow.made[0].loaded.is_set()  # before: returned at once


def test_configure_imports_structlog_so_no_call_logs_its_import() -> None:
    """The first line logged (the overhead budget's, a full queue's: often on a user's call)
    imported structlog there, 45 ms with rich installed; the spare thread imports it at set-up."""
    import subprocess

    code = ("import sys, attnscope; attnscope.configure(exporter='none'); "
            "print('structlog' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)
    assert (done.returncode, done.stdout.strip()) == (0, "True"), done.stderr[-2000:]


def test_configure_imports_what_the_pipeline_will_so_the_worker_builds_without_importing() -> None:
    """Building the pipeline imported the metrics SDK and the OTLP exporter on the worker's
    thread, right after the first sampled call, beside the first requests (152 modules, 137 ms
    for OTLP over gRPC); the spare thread imports them at set-up."""
    import os
    import subprocess

    code = (
        "import sys, attnscope\n"
        "attnscope.configure(exporter='otlp-http', sample_rate=1.0, warmup_calls=0)\n"
        "ahead = [m for m in ('opentelemetry.exporter.otlp.proto.http.trace_exporter',\n"
        "                     'opentelemetry.exporter.otlp.proto.http.metric_exporter',\n"
        "                     'opentelemetry.sdk.metrics.export') if m in sys.modules]\n"
        "before = set(sys.modules)\n"
        "attnscope.trace(name='f')(lambda: None)()\n"
        "from attnscope._runtime import runtime\n"
        "assert runtime.worker.current.built.wait(60)\n"
        "print(len(ahead), sorted(m for m in set(sys.modules) - before\n"
        "                         if m.startswith('opentelemetry')))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env["OTEL_EXPORTER_OTLP_ENDPOINT"] = "http://127.0.0.1:9"  # nothing sent in this test
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False, env=env)
    assert (done.returncode, done.stdout.strip()) == (0, "3 []"), (done.stdout, done.stderr[-2000:])
