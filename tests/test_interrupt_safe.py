"""A lock taken through ``_interrupt_safe`` is never held by no one after a Ctrl-C.

CPython handles a signal as a C call returns, before the line stores the result. A
``sys.setprofile`` hook raising ``KeyboardInterrupt`` at that call's ``c_return`` drops the result
the same way: deterministic, where a real SIGINT would hit that instant by chance.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import pytest

from attnscope import _interrupt_safe
from attnscope._runtime.worker import WorkerHandle


def _interrupt_as_returns(name: str, body: Callable[[], None]) -> None:
    """Run ``body``, raising ``KeyboardInterrupt`` as its first C call called ``name`` returns."""
    fired: list[str] = []

    def hook(frame: FrameType, event: str, arg: Any) -> None:
        if event == "c_return" and getattr(arg, "__name__", "") == name and not fired:
            fired.append(name)
            raise KeyboardInterrupt

    sys.setprofile(hook)
    try:
        with pytest.raises(KeyboardInterrupt):
            body()
    finally:
        sys.setprofile(None)
    assert fired == [name]


def test_the_plain_pattern_loses_a_lock_taken_the_fix_keeps_it() -> None:
    lock = threading.Lock()
    held = [False]

    def plain() -> None:
        held[0] = lock.acquire(blocking=False)

    _interrupt_as_returns("acquire", plain)
    assert lock.locked() and held == [False]  # taken, and no one knows: what the fix is for
    lock.release()

    got: list[bool] = []
    _interrupt_as_returns("extend", lambda: _interrupt_safe.take(lock, got))
    assert lock.locked() and got == [True]
    lock.release()


def test_take_says_whether_it_took_the_lock_and_waits_at_most_its_timeout() -> None:
    lock = threading.Lock()
    got: list[bool] = []
    _interrupt_safe.take(lock, got)
    assert got == [True] and lock.locked()
    _interrupt_safe.take(lock, got)  # held: not taken, without waiting
    t0 = time.monotonic()
    _interrupt_safe.take(lock, got, 0.05)
    assert got == [True, False, False]
    assert time.monotonic() - t0 >= 0.04  # it waited (a lower bound: no timing upper bound)
    lock.release()


def test_take_with_a_timeout_gets_a_lock_released_meanwhile() -> None:
    lock = threading.Lock()
    lock.acquire()
    threading.Timer(0.05, lock.release).start()
    got: list[bool] = []
    _interrupt_safe.take(lock, got, 30.0)
    assert got == [True]
    lock.release()


def test_call_into_keeps_what_returned_before_the_interrupt() -> None:
    done: list[Any] = []
    calls: list[tuple[int, str]] = []

    def prepare(a: int, b: str) -> None:
        calls.append((a, b))

    _interrupt_as_returns("extend", lambda: _interrupt_safe.call_into(done, prepare, 1, "x"))
    assert calls == [(1, "x")] and done == [None]  # ran, and the caller can tell


def test_call_into_leaves_the_list_empty_when_the_call_raised() -> None:
    done: list[Any] = []

    def broken() -> None:
        raise ValueError("refused")

    with pytest.raises(ValueError):
        _interrupt_safe.call_into(done, broken)
    assert done == []


def test_a_ctrl_c_as_the_fork_hook_takes_the_import_lock_does_not_keep_it() -> None:
    handle = WorkerHandle()
    _interrupt_as_returns("extend", handle.before_fork)
    assert handle.import_lock.locked()
    handle.after_fork_in_parent()  # before: the flag never set, the lock held for good
    assert not handle.import_lock.locked()
    handle.after_fork_in_parent()  # once only
    assert not handle.import_lock.locked()


def test_settle_runs_the_step_again_after_each_interrupt_and_returns_the_first() -> None:
    runs: list[int] = []
    raised = [KeyboardInterrupt("first"), KeyboardInterrupt("second")]

    def step(x: int) -> None:
        runs.append(x)
        if raised:
            raise raised.pop(0)

    first = _interrupt_safe.settle(step, 7)
    assert runs == [7, 7, 7]
    assert isinstance(first, KeyboardInterrupt) and str(first) == "first"
    assert _interrupt_safe.settle(step, 8) is None and runs[-1] == 8


def test_settle_gives_up_after_its_tries_and_raises_an_error_at_once() -> None:
    runs: list[int] = []

    def interrupted() -> None:
        runs.append(1)
        raise KeyboardInterrupt

    assert isinstance(_interrupt_safe.settle(interrupted), KeyboardInterrupt)
    assert len(runs) == _interrupt_safe.SETTLE_TRIES

    def broken() -> None:
        runs.append(2)
        raise ValueError("a bug")

    with pytest.raises(ValueError, match="a bug"):
        _interrupt_safe.settle(broken)
    assert runs.count(2) == 1
