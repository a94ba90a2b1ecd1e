"""Ctrl-Cs landing one after another in one profiled call (issue 35 §3; CI, 2026-12-06).

The storm test (``test_interrupt_storm.py``) failed once in CI with kineto left on: a first
SIGINT handled as kineto's enable returned, a second as the clean-up it started asked whether
kineto was on, before it switched it off. Here, deterministically: the profiler's C entry points,
torch's "is it on" flag and the session lock's release raise ``KeyboardInterrupt`` right after
they return (where CPython runs a signal's handler), at every combination of up to three of their
calls in one profiled call. Afterwards nothing may be left open, and the profile tier still works.

A session that Ctrl-Cs kept open anyway (one landing in each clean-up's first line) is closed by
the thread's next profiled call, and by the interpreter's exit.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import profiler_session, wrapper
from attnscope._record.capture import Capture
from attnscope._runtime import runtime
from attnscope.testing import capture_spans

_MAX_INTERRUPTS = 3
_KINETO_ON = torch._C._autograd._profiler_enabled


class _Interrupts:
    """Counts the calls of the wrapped functions; raises ``KeyboardInterrupt`` right after the
    chosen ones return (their result dropped, as by a signal handled there)."""

    def __init__(self) -> None:
        self.seen = 0
        self.at: set[int] = set()
        self.fired: list[str] = []
        self.names: list[str] = []

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            result = fn(*args, **kwargs)
            self.seen += 1
            self.names.append(name)
            if self.seen in self.at:
                self.fired.append(name)
                raise KeyboardInterrupt
            return result

        return call


class _Lock:
    """The session lock, its release wrapped. Its acquire is not: ``_interrupt_safe.take`` stores
    what a real (C) acquire returned before any signal is handled, which a Python wrapper
    raising inside the acquire would not model."""

    def __init__(self, real: Any, interrupts: _Interrupts) -> None:
        self.real = real
        self.acquire = real.acquire
        self.release = interrupts.wrap("release", real.release)
        self.locked = real.locked


@pytest.fixture
def interrupts() -> Iterator[_Interrupts]:
    p = runtime.profiler
    chosen = _Interrupts()
    real_lock, real_points = p.session_lock, dict(p.entry_points)
    real_enabled = _KINETO_ON
    try:
        p.session_lock = _Lock(real_lock, chosen)  # type: ignore[assignment]
        p.entry_points.update({n: chosen.wrap(n, f) for n, f in real_points.items()})
        torch._C._autograd._profiler_enabled = chosen.wrap("enabled", real_enabled)
        yield chosen
    finally:
        torch._C._autograd._profiler_enabled = real_enabled
        p.session_lock = real_lock
        p.entry_points.update(real_points)


def _left_open() -> list[str]:
    p = runtime.profiler
    real = getattr(p.session_lock, "real", p.session_lock)
    problems = []
    if p.active is not None or real.locked():
        problems.append("profiler session left open")
    if _KINETO_ON():  # torch's own flag, not the wrapped one
        problems.append("kineto left on")
    if wrapper.current.get() is not None:
        problems.append("a capture left current")
    return problems


def _attention(q: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)


@contextlib.contextmanager
def _profiled_call() -> Iterator[Callable[[], Any]]:
    """One sampled, profiled traced call to make, the profiler warm, spans captured."""
    traced = attnscope.trace(name="attn")(_attention)
    q = torch.ones(1, 2, 4, 8)
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1_000_000):
        traced(q)  # warm: the first session
        assert attnscope.flush(timeout_s=30)
        yield lambda: traced(q)


def _session_of_a_call() -> Capture:
    """A capture whose profiler session this thread started, as a call's start leaves it."""
    cap = Capture()
    assert profiler_session.start(cap, None) and cap.profile is not None
    return cap


def test_up_to_three_ctrl_cs_in_one_profiled_call_leave_nothing_open(
        interrupts: _Interrupts) -> None:
    with _profiled_call() as call:
        interrupts.seen, interrupts.names = 0, []
        call()  # counts the calls one profiled call makes
        assert attnscope.flush(timeout_s=30)
        calls = interrupts.seen
        # prepare, enable, disable, the lock's release, and "is it on" asked in between
        assert {"prepare", "enable", "disable", "release", "enabled"} <= set(interrupts.names)
        tried = 0
        for n in range(1, _MAX_INTERRUPTS + 1):
            for at in itertools.combinations(range(1, calls + 3), n):
                interrupts.seen, interrupts.at, interrupts.fired = 0, set(at), []
                interrupts.names = []
                try:
                    call()
                except KeyboardInterrupt:
                    pass
                else:  # every chosen call ran: the user's call saw one of them
                    assert not interrupts.fired, (at, interrupts.names)
                problems = _left_open()
                assert not problems, (at, interrupts.fired, interrupts.names, problems)
                tried += 1
        assert tried > 100
        interrupts.at = set()
        profiled = attnscope.stats()["profiled"]
        call()  # the profile tier still works
        assert attnscope.flush(timeout_s=30)
        assert attnscope.stats()["profiled"] == profiled + 1


def test_a_session_left_open_is_closed_by_the_threads_next_profiled_call() -> None:
    p = runtime.profiler
    with _profiled_call() as call:
        # what a Ctrl-C in every clean-up leaves: a session whose call ended, never stopped
        cap = _session_of_a_call()
        cap.end_perf_ns = 1
        assert p.active is cap.profile and torch._C._autograd._profiler_enabled()
        profiled = attnscope.stats()["profiled"]
        call()
        assert attnscope.flush(timeout_s=30)
        assert p.active is None and not p.session_lock.locked()
        assert not torch._C._autograd._profiler_enabled()
        # the call's own session only: the orphan's call went out timed, with no profile
        assert attnscope.stats()["profiled"] == profiled + 1
        assert attnscope.stats()["profile_skipped_nested"] == 0


def test_a_session_still_open_at_exit_is_closed() -> None:
    # registered before attnscope's: atexit runs it after attnscope's own handler
    script = textwrap.dedent("""
        import atexit, sys
        import torch
        atexit.register(lambda: print("on at exit:", torch._C._autograd._profiler_enabled(),
                                      flush=True))
        import attnscope
        from attnscope._capture import profiler_session
        from attnscope._record.capture import Capture
        attnscope.configure(exporter="none", profile_rate=1.0)
        assert profiler_session.warm_up()
        assert profiler_session.start(Capture(), None)
        print("on before exit:", torch._C._autograd._profiler_enabled(), flush=True)
    """)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["on before exit: True", "on at exit: False"], \
        (proc.stdout, proc.stderr[-2000:])


def test_ctrl_cs_in_the_profilers_warm_up_leave_nothing_open(interrupts: _Interrupts) -> None:
    # warm_up runs on the main thread at import or configure() without CUDA: a Ctrl-C can land
    p = runtime.profiler
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1_000_000):
        assert profiler_session.warm_up(cuda=False)
        interrupts.seen, interrupts.at, interrupts.names = 0, set(), []
        p.warm_cpu = False
        assert profiler_session.warm_up(cuda=False)
        calls = interrupts.seen
        assert {"prepare", "enable", "disable", "release"} <= set(interrupts.names)
        for n in range(1, _MAX_INTERRUPTS + 1):
            for at in itertools.combinations(range(1, calls + 3), n):
                interrupts.seen, interrupts.at, interrupts.fired = 0, set(at), []
                interrupts.names = []
                p.warm_cpu = False
                try:
                    profiler_session.warm_up(cuda=False)
                except KeyboardInterrupt:
                    pass
                problems = _left_open()
                assert not problems, (at, interrupts.fired, interrupts.names, problems)
        interrupts.at = set()
        p.warm_cpu = False
        assert profiler_session.warm_up(cuda=False)
        assert not p.broken


@pytest.mark.internal_errors("profile-stop")
def test_a_session_stopped_on_another_thread_stays_open_for_its_own() -> None:
    # kineto's state is per thread: released from elsewhere, a second session could start
    # beside the first (a crash); it stays open until its own thread's next profiled call
    p = runtime.profiler
    with _profiled_call() as call:
        cap = _session_of_a_call()
        session = cap.profile
        stopper = threading.Thread(target=profiler_session.stop, args=(session,))
        stopper.start()
        stopper.join(timeout=30)
        assert p.active is session and p.session_lock.locked()
        assert torch._C._autograd._profiler_enabled()
        other: list[str] = []

        def on_another_thread() -> None:
            call()
            other.append("called")

        worker = threading.Thread(target=on_another_thread)
        worker.start()
        worker.join(timeout=30)
        assert other == ["called"]
        assert attnscope.stats()["profile_skipped_busy"] >= 1  # timed, not a second session
        cap.end_perf_ns = 1  # its call ended: the thread's next profiled call closes it
        call()
        assert attnscope.flush(timeout_s=30)
        assert p.active is None and not p.session_lock.locked()
        assert not torch._C._autograd._profiler_enabled()
