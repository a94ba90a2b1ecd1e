"""The CUDA profiler warm-up starts at set-up when CUDA is up already (issue 37 goal 1).

CUPTI's start-up took 4.5 s on an H200. Started at the first sampled call it ran during the first
requests; started by ``configure()`` or ``instrument(model)`` in a process whose CUDA is
initialised, the program's own set-up after it can hide it. Only the wiring is checked here (no
GPU): which set-up calls start it, and which must not (no CUDA context made, profile tier off,
warm already). What it saves is measured by ``benchmarks/bench_first_call.py --device cuda``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import profiler_session
from attnscope._runtime import runtime


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The warm-ups started (their ``cuda`` argument), none run; CUDA initialised."""
    calls: list[Any] = []
    monkeypatch.setattr(profiler_session, "warm_up_async", lambda cuda=None: calls.append(cuda))
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    return calls


def _model() -> torch.nn.Module:
    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(16, 2, batch_first=True)

    return Block()


def test_configure_starts_the_cuda_warm_up_when_cuda_is_up(started: list[Any]) -> None:
    attnscope.configure(exporter="none")
    assert started == [True]


def test_instrument_starts_it_for_a_model_made_after_configure(
        started: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    attnscope.configure(exporter="none")
    assert started == []  # no CUDA yet: nothing to warm, and no context made for it
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)  # the model moved to a GPU
    attnscope.instrument(_model())
    assert started == [True]


def test_instrument_reads_the_environment_when_nothing_was_configured(
        started: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    runtime.config.current = None
    monkeypatch.setenv("ATTNSCOPE_PROFILE_RATE", "0")
    attnscope.instrument(_model())
    assert started == []
    monkeypatch.delenv("ATTNSCOPE_PROFILE_RATE")
    attnscope.instrument(_model())
    assert started == [True]


@pytest.mark.parametrize("settings", [{"profile_rate": 0.0}, {"profile_max_per_minute": 0},
                                      {"enabled": False}])
def test_not_when_the_profile_tier_cannot_be_asked(started: list[Any],
                                                   settings: dict[str, Any]) -> None:
    attnscope.configure(exporter="none", **settings)
    attnscope.instrument(_model())
    assert started == []


def test_not_again_once_cuda_is_warm(started: list[Any]) -> None:
    runtime.profiler.warm_cuda = True
    attnscope.configure(exporter="none")
    attnscope.instrument(_model())
    assert started == []


def test_not_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(profiler_session, "warm_up_async", lambda cuda=None: calls.append(cuda))
    if torch.cuda.is_initialized():  # a GPU machine's earlier tests
        pytest.skip("CUDA is initialised in this process")
    attnscope.configure(exporter="none")
    attnscope.instrument(_model())
    assert calls == []


def test_a_warm_up_under_way_is_awaited_not_refused() -> None:
    # set-up started one on a helper thread; a caller that needs the profiler warm (the GPU
    # tests, after configure()) gets its outcome instead of "busy"
    import threading
    import time

    p = runtime.profiler
    assert profiler_session.warm_up(cuda=False)  # loaded, kineto's first session done
    prepare = p.entry_points["prepare"]
    started = threading.Event()

    def slow_prepare(*args: Any) -> Any:
        started.set()  # the helper holds the session lock from here
        time.sleep(0.3)
        return prepare(*args)

    p.entry_points["prepare"] = slow_prepare
    try:
        p.warm_cpu = False
        profiler_session.warm_up_async(cuda=False)
        assert started.wait(timeout=30)
        assert profiler_session.warm_up(cuda=False)
        assert p.warming is not None and not p.warming.is_alive()
    finally:
        p.entry_points["prepare"] = prepare
    assert not p.session_lock.locked() and p.warm_cpu


def test_the_worker_leaves_a_warm_up_under_way_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(profiler_session, "warm_up", lambda cuda=None: calls.append(cuda))

    class Running:
        def is_alive(self) -> bool:
            return True

    attnscope.configure(exporter="none")
    cfg = runtime.config.current
    monkeypatch.setattr(runtime.profiler, "warming", Running())
    profiler_session.on_worker_start(cfg)
    assert calls == []  # it would wait out CUPTI's start-up before building a span
    monkeypatch.setattr(runtime.profiler, "warming", None)
    profiler_session.on_worker_start(cfg)
    assert calls == [None]
