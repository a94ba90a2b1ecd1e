"""The worker sleeps while idle, is woken once per batch, and flush() never waits for a batch."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

import attnscope
from attnscope._runtime import runtime
from attnscope._runtime.retention import KEEP_TOTAL_BYTES
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


class _Hurry:
    """The worker's ``_hurry`` event, counting the slices waited on it (never waiting)."""

    def __init__(self, cut_short: bool = False) -> None:
        self.cut_short, self.waits = cut_short, 0

    def wait(self, timeout: float) -> bool:
        assert timeout == loop._GATHER_SLICE_S
        self.waits += 1
        return self.cut_short


def _gathering(monkeypatch: pytest.MonkeyPatch, queued: int, kept_bytes: int = 0,
               cut_short: bool = False) -> int:
    """How many slices a gather waits, with ``queued`` captures in a queue of 8 (a quarter: 2)."""
    monkeypatch.setattr(runtime.retention, "kept_bytes", kept_bytes)
    hurry = _Hurry(cut_short)
    worker = SimpleNamespace(queue=[None] * queued, max_queue=8, _hurry=hurry)
    Worker._gather(worker)  # type: ignore[arg-type]
    return hurry.waits


def test_a_gather_waits_its_time_in_slices_until_enough_has_come(
        monkeypatch: pytest.MonkeyPatch) -> None:
    slices = round(loop._GATHER_S / loop._GATHER_SLICE_S)
    assert slices > 1
    assert _gathering(monkeypatch, queued=1) == slices  # the whole gather
    # a quarter of the queue, or of the kept tensors' budget, is a batch worth taking now: a
    # fast model sampled at every call would fill the queue (and drop captures) in a long gather
    assert _gathering(monkeypatch, queued=2) == 1
    assert _gathering(monkeypatch, queued=1, kept_bytes=KEEP_TOTAL_BYTES // 4) == 1
    assert _gathering(monkeypatch, queued=1, kept_bytes=KEEP_TOTAL_BYTES // 4 - 1) == slices
    assert _gathering(monkeypatch, queued=1, cut_short=True) == 1  # flush(), shutdown()


def test_a_quarter_full_queue_ends_the_gather(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loop, "_GATHER_S", 600.0)  # only a full enough queue ends it here
    attnscope.configure(**SETTINGS, queue_size=8)
    f(1)
    assert attnscope.flush(timeout_s=10)
    _asleep()
    f(2)  # wakes the worker, which gathers
    f(3)  # a quarter of the queue: it stops gathering at its next look, with no flush
    deadline = time.monotonic() + 60
    while attnscope.stats()["emitted"] < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert attnscope.stats()["emitted"] == 3
