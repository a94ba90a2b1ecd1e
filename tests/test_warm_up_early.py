"""The CUDA profiler warm-up starts at set-up when CUDA is up already (issue 37 goal 1).

CUPTI's start-up took 4.5 s on an H200. Started at the first sampled call it ran during the first
requests; started by ``configure()`` or ``instrument(model)`` in a process whose CUDA is
initialised, the program's own set-up after it can hide it; started by them before CUDA is up,
it waits in torch's queue for the program to bring CUDA up. Only the wiring is checked here (no
GPU): which set-up calls start it, and which must not (no CUDA context made, profile tier off,
warm already). What it saves is measured by ``benchmarks/bench_first_call.py --device cuda``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import early_warmup, profiler_session
from attnscope._runtime import runtime


@pytest.fixture
def started(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The warm-ups started (their ``cuda`` argument), none run; CUDA initialised."""
    calls: list[Any] = []
    monkeypatch.setattr(profiler_session, "warm_up_async",
                        lambda cuda=None, target=None: calls.append(cuda))
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


def test_not_again_once_cuda_is_warm(started: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runtime.profiler, "warm_cuda", True)
    attnscope.configure(exporter="none")
    attnscope.instrument(_model())
    assert started == []


def test_not_without_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    monkeypatch.setattr(profiler_session, "warm_up_async",
                        lambda cuda=None, target=None: calls.append(cuda))
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


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """A CUDA build whose CUDA is not up yet: what set-up queues with torch for its start-up."""
    calls: list[Any] = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(torch.version, "cuda", "13.0")
    monkeypatch.setattr(torch.cuda, "_lazy_call", calls.append)
    monkeypatch.setattr(runtime.profiler, "cuda_init_queued", False)
    monkeypatch.setattr(runtime.profiler, "warm_cuda", False)
    return calls


def test_torch_still_has_the_queue_it_is_put_in() -> None:
    # a torch that renames it makes the early warm-up fall back to the worker's: tell us
    assert callable(getattr(torch.cuda, "_lazy_call", None))


def test_set_up_before_cuda_queues_it_once_for_cudas_start_up(
        queued: list[Any], started: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    attnscope.configure(exporter="none")
    attnscope.configure(exporter="none")
    attnscope.instrument(_model())
    assert queued == [early_warmup._on_cuda_init] and started == []


def test_not_queued_on_a_build_without_cuda_nor_with_the_tier_off(
        queued: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    attnscope.configure(exporter="none", profile_rate=0.0)
    assert queued == []
    monkeypatch.setattr(torch.version, "cuda", None)
    attnscope.configure(exporter="none")
    assert queued == []


def test_when_cuda_comes_up_a_helper_waits_for_it_then_warms_up(
        queued: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    attnscope.configure(exporter="none")
    (on_cuda_init,) = queued
    warmed: list[Any] = []
    monkeypatch.setattr(profiler_session, "warm_up", lambda cuda=None: warmed.append(cuda) or True)
    polls = iter([False, False, True])
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: next(polls))
    on_cuda_init()  # inside torch's _lazy_init, on the thread bringing CUDA up
    helper = runtime.profiler.warming
    assert helper is not None and helper.name == "attnscope-profiler-warmup"
    helper.join(timeout=30)
    assert warmed == [True]


def test_at_cudas_start_up_the_configuration_then_decides(
        queued: list[Any], started: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    attnscope.configure(exporter="none")
    attnscope.configure(exporter="none", profile_max_per_minute=0)  # turned off meanwhile
    queued[0]()
    assert started == []
    attnscope.configure(profile_max_per_minute=10)  # configure() changes what it is given
    queued[0]()
    assert started == [True]


@pytest.mark.internal_errors("profile-warmup")
def test_it_never_fails_cudas_start_up(queued: list[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope import _log

    attnscope.configure(exporter="none")
    errors = _log.error_count()

    def broken(cfg: Any) -> bool:
        raise RuntimeError("boom")

    monkeypatch.setattr(profiler_session, "profile_tier_on", broken)
    queued[0]()  # an exception here would be torch's DeferredCudaCallError in the program
    assert _log.error_count() == errors + 1


def test_the_helper_gives_up_when_cuda_never_comes_up(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    monkeypatch.setattr(early_warmup, "_CUDA_UP_WAIT_S", 0.05)
    monkeypatch.setattr(profiler_session, "warm_up", lambda cuda=None: pytest.fail("warmed"))
    assert early_warmup._once_cuda_is_up(True) is False
