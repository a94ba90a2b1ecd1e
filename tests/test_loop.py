"""The worker sleeps while idle, is woken once per batch, and flush() never waits for a batch."""

from __future__ import annotations

import time
from typing import Any

import pytest

import attnscope
from attnscope._runtime import runtime
from attnscope._worker import loop
from attnscope._worker.loop import Worker

SETTINGS: dict[str, Any] = {"sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0,
                            "profile_rate": 0.0, "metrics": False, "exporter": "none"}


@attnscope.trace
def f(x: int) -> int:
    return x


def _asleep() -> None:
    """Wait until the worker has gone back to sleep (after a flush it still finishes its loop)."""
    deadline = time.monotonic() + 10
    while not runtime.worker.current._sleeping and time.monotonic() < deadline:
        time.sleep(0.001)
    assert runtime.worker.current._sleeping


def _count_steps(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    steps = [0]
    real = Worker._step

    def counting(self: Worker) -> bool:
        steps[0] += 1
        return real(self)

    monkeypatch.setattr(Worker, "_step", counting)
    return steps


def test_idle_worker_does_not_wake(monkeypatch: pytest.MonkeyPatch) -> None:
    attnscope.configure(**SETTINGS)
    f(1)
    assert attnscope.flush(timeout_s=5)
    _asleep()  # its last steps after the flush are not wakes
    steps = _count_steps(monkeypatch)
    time.sleep(0.5)  # the old worker polled 20 times a second
    assert steps[0] == 0


def test_one_wake_per_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    # one batch however slowly this machine makes the 200 calls (the flush below cuts it short)
    monkeypatch.setattr(loop, "_GATHER_S", 600.0)
    attnscope.configure(**SETTINGS)
    f(1)
    assert attnscope.flush(timeout_s=5)
    _asleep()  # asleep again
    wakes = [0]
    event = runtime.worker.current._wake
    real_set = event.set

    def counting_set() -> None:
        wakes[0] += 1
        real_set()

    monkeypatch.setattr(event, "set", counting_set)
    for i in range(200):
        f(i)
    assert wakes[0] == 1  # the first capture woke it; the others joined the batch
    assert attnscope.flush(timeout_s=5)
    assert attnscope.stats()["emitted"] == 201


def test_flush_and_shutdown_cut_the_gathering_short(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "_GATHER_S", 600.0)  # far longer than the timeouts below
    attnscope.configure(**SETTINGS)
    f(1)
    assert attnscope.flush(timeout_s=10)
    time.sleep(0.05)
    f(2)  # wakes the worker, which now gathers
    assert attnscope.flush(timeout_s=10)
    assert attnscope.stats()["emitted"] == 2
    time.sleep(0.05)
    f(3)
    assert attnscope.shutdown(timeout_s=10)
