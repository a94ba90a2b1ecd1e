"""The CUDA path's calling-thread work on CPU, with fakes: one allocator read per side of a call,
an allocator without statistics (CUDAPluggableAllocator: RMM and the like) that leaves timing on,
and the graph-capture check on the tensor's device rather than the current one."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import attnscope
from attnscope import _log
from attnscope._capture import device
from attnscope._capture.device import CudaEventPool
from attnscope._record.capture import DeviceMemory
from attnscope._runtime import runtime
from attnscope._worker import cuda as worker_cuda
from attnscope.testing import capture_spans

from .support.helpers import attrs, calls_on

MIB = 1 << 20
# What CUDAPluggableAllocator says (c10/cuda/CUDAPluggableAllocator.cpp)
NO_STATS = ("CUDAPluggableAllocator does not yet support getDeviceStats. If you need it, please "
            "file an issue describing your use case.")
NO_RESET = ("CUDAPluggableAllocator does not yet support resetPeakStats. If you need it, please "
            "file an issue describing your use case.")


class FakeEvent:
    """A timing event whose device work is done as soon as it is recorded: 2 ms per pair."""

    recorded = 0

    def __init__(self) -> None:
        self.at_ms = 0.0

    def record(self, stream: Any = None) -> None:
        FakeEvent.recorded += 1
        self.at_ms = FakeEvent.recorded * 1.0

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: FakeEvent) -> float:
        return end_event.at_ms - self.at_ms + 1.0


class FakeAllocator:
    """``torch.cuda.memory_stats_as_nested_dict`` and ``reset_peak_memory_stats``, counted.

    ``stats_error`` / ``reset_error``: raise it instead (a pluggable allocator raises both).
    """

    def __init__(self, allocated: int = 10 * MIB, peak: int = 50 * MIB) -> None:
        self.allocated = allocated
        self.peak = peak
        self.reads = 0
        self.resets = 0
        self.stats_error: Exception | None = None
        self.reset_error: Exception | None = None
        self.devices: list[Any] = []

    def stats(self, device: Any = None) -> dict[str, Any]:
        self.reads += 1
        self.devices.append(device)
        if self.stats_error is not None:
            raise self.stats_error
        pools = {pool: {"current": self.allocated, "peak": self.peak, "allocated": 0, "freed": 0}
                 for pool in ("all", "large_pool", "small_pool")}
        return {"allocated_bytes": pools, "reserved_bytes": pools, "num_alloc_retries": 0}

    def reset(self, device: Any = None) -> None:
        self.resets += 1
        if self.reset_error is not None:
            raise self.reset_error
        self.peak = self.allocated

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)


def _flattening_read(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a per-value read that builds and flattens the whole stats dict")


@pytest.fixture
def alloc(monkeypatch: pytest.MonkeyPatch) -> FakeAllocator:
    fake = FakeAllocator()
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", fake.stats)
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", fake.reset)
    for name in ("memory_stats", "memory_allocated", "max_memory_allocated"):
        monkeypatch.setattr(torch.cuda, name, _flattening_read)
    return fake


@pytest.fixture
def cuda_call(monkeypatch: pytest.MonkeyPatch, alloc: FakeAllocator) -> FakeAllocator:
    """Traced calls look like calls on cuda:0 of a one-GPU machine, with fake events."""
    cuda0 = torch.device("cuda", 0)
    calls_on(monkeypatch, lambda _real: cuda0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(runtime.device, "event_pool", CudaEventPool(make_event=FakeEvent))
    # the worker's own device access (set_device, a side stream) is not what is tested here
    monkeypatch.setattr(worker_cuda.DeviceAccess, "prepare", lambda self, dev: None)
    monkeypatch.setattr(worker_cuda.DeviceAccess, "reading",
                        lambda self, dev: contextlib.nullcontext())
    return alloc


@attnscope.trace
def attention(q: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)


def _allocating(alloc: FakeAllocator) -> Any:
    @attnscope.trace
    def attention_allocating(q: torch.Tensor) -> torch.Tensor:
        alloc.alloc(3 * MIB)
        alloc.alloc(-1 * MIB)
        return q + 1

    return attention_allocating


def _warnings(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.levelno == logging.WARNING and text in r.getMessage()]


# ---- one read per side ---------------------------------------------------------------------------

def test_one_allocator_read_per_side(cuda_call: FakeAllocator) -> None:
    q = torch.randn(1, 2, 8, 4)
    with capture_spans() as spans:
        for _ in range(5):
            attention(q)
    assert len(spans) == 5
    assert cuda_call.reads == 10 and cuda_call.resets == 0
    assert cuda_call.devices == [0] * 10  # the tensor's device, as an index
    for span in spans:
        a = attrs(span)
        assert a["attnscope.device_ns"] == 2_000_000
        assert a["attnscope.memory.delta_bytes"] == 0


def test_reset_peak_then_one_read(cuda_call: FakeAllocator) -> None:
    fn = _allocating(cuda_call)
    with capture_spans(reset_peak_memory_stats=True) as spans:
        fn(torch.randn(2, 2))
    assert (cuda_call.resets, cuda_call.reads) == (1, 2)
    a = attrs(spans[0])
    assert a["attnscope.memory.delta_bytes"] == 2 * MIB
    assert a["attnscope.memory.peak_bytes"] == 3 * MIB


def test_readings_semantics_unchanged(alloc: FakeAllocator) -> None:
    mem = device.memory_before(torch.device("cuda", 0), reset_peak=False)
    assert mem is not None
    alloc.alloc(8 * MIB)
    alloc.alloc(-8 * MIB)
    device.memory_after(mem)
    assert mem.delta_bytes == 0
    assert mem.peak_bytes is None  # 10 + 8 < the older 50 MiB peak: hidden, not claimed
    new_peak = device.memory_before(torch.device("cuda", 0), reset_peak=False)
    assert new_peak is not None
    alloc.alloc(45 * MIB)
    device.memory_after(new_peak)
    assert (new_peak.delta_bytes, new_peak.peak_bytes) == (45 * MIB, 45 * MIB)


def test_device_index_from_each_form(alloc: FakeAllocator) -> None:
    for dev in (torch.device("cuda", 1), "cuda:1", 1):
        assert device.memory_before(dev, reset_peak=False) is not None
    assert alloc.devices == [1, 1, 1]


# ---- an allocator without statistics ------------------------------------------------------------

def test_pluggable_allocator_keeps_timing_and_the_site(
    cuda_call: FakeAllocator, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="attnscope")
    cuda_call.stats_error = RuntimeError(NO_STATS)
    cuda_call.reset_error = RuntimeError(NO_RESET)
    q = torch.randn(1, 2, 8, 4)
    with capture_spans(reset_peak_memory_stats=True) as spans:
        for _ in range(20):  # well past the 5 internal errors that switch a site off
            attention(q)
    assert len(spans) == 20
    for span in spans:
        a = attrs(span)
        assert a["attnscope.device_ns"] == 2_000_000
        assert not any(key.startswith("attnscope.memory.")
                       and key != "attnscope.memory.host_rss_bytes"
                       for key in a)
    assert cuda_call.resets == 1 and cuda_call.reads == 1  # asked once, then left alone
    assert _log.error_count() == 0  # not an internal error: nothing counted against the site
    assert len(_warnings(caplog, "no memory statistics")) == 1
    assert not _warnings(caplog, "no longer traced")


def test_peak_reset_refused_alone(cuda_call: FakeAllocator,
                                  caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    cuda_call.reset_error = RuntimeError(NO_RESET)
    fn = _allocating(cuda_call)
    with capture_spans(reset_peak_memory_stats=True) as spans:
        for _ in range(3):
            fn(torch.randn(2, 2))
    assert cuda_call.resets == 1 and cuda_call.reads == 6
    for span in spans:
        a = attrs(span)
        assert a["attnscope.memory.delta_bytes"] == 2 * MIB
        assert "attnscope.memory.peak_bytes" not in a  # under the older 50 MiB peak: not claimed
        assert a["attnscope.device_ns"] == 2_000_000
    assert len(_warnings(caplog, "cannot reset its peak")) == 1


def test_failure_after_the_call_drops_that_calls_memory_only(cuda_call: FakeAllocator) -> None:
    real = cuda_call.stats

    def second_read_fails(dev: Any = None) -> dict[str, Any]:
        if cuda_call.reads == 1:
            cuda_call.reads += 1
            raise RuntimeError(NO_STATS)
        return real(dev)

    torch.cuda.memory_stats_as_nested_dict = second_read_fails  # type: ignore[assignment]  # fixture restores
    with capture_spans() as spans:
        attention(torch.randn(1, 2, 8, 4))
        attention(torch.randn(1, 2, 8, 4))
    a, b = (attrs(s) for s in spans)
    assert "attnscope.memory.delta_bytes" not in a and "attnscope.memory.peak_bytes" not in a
    assert a["attnscope.device_ns"] == 2_000_000
    assert "attnscope.memory.delta_bytes" not in b  # the device's readings are off from then on
    assert b["attnscope.device_ns"] == 2_000_000
    assert cuda_call.reads == 2


def test_unknown_stats_shape_turns_readings_off(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def odd(dev: Any = None) -> dict[str, Any]:
        calls.append(dev)
        return {"bytes": 1}

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", odd)
    assert device.memory_before(torch.device("cuda", 0), reset_peak=False) is None
    assert device.memory_before(torch.device("cuda", 0), reset_peak=False) is None
    assert len(calls) == 1
    assert (0, "stats") in runtime.device.allocator_off


def test_uninitialised_cuda_is_not_a_refusal(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []

    def uninitialised(dev: Any = None) -> dict[str, Any]:
        calls.append(dev)
        return {}  # what memory_stats_as_nested_dict gives before CUDA is initialised

    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", uninitialised)
    for _ in range(3):
        assert device.memory_before(torch.device("cuda", 0), reset_peak=False) is None
    assert len(calls) == 3 and not runtime.device.allocator_off


def test_refusal_is_per_device(alloc: FakeAllocator) -> None:
    real = alloc.stats

    def only_gpu1_refuses(dev: Any = None) -> dict[str, Any]:
        if dev == 1:
            raise RuntimeError(NO_STATS)
        return real(dev)

    torch.cuda.memory_stats_as_nested_dict = only_gpu1_refuses  # type: ignore[assignment]
    assert device.memory_before(torch.device("cuda", 1), reset_peak=False) is None
    assert device.memory_before(torch.device("cuda", 0), reset_peak=False) is not None


def test_record_without_after_reading() -> None:
    mem = DeviceMemory("cuda:0", 10, 20, reset=True)
    assert mem.delta_bytes is None and mem.peak_bytes is None


# ---- the capture check: the tensor's device ------------------------------------------------------

class FakeDevices:
    """Two GPUs; the current device is switched with ``torch.cuda.device(i)``; ``capturing``
    holds the devices whose current stream is capturing a graph."""

    def __init__(self) -> None:
        self.current = 0
        self.capturing: set[int] = set()
        self.switches = 0

    @contextlib.contextmanager
    def device(self, index: int) -> Iterator[None]:
        before, self.current = self.current, index
        self.switches += 1
        try:
            yield
        finally:
            self.current = before

    def install(self, monkeypatch: pytest.MonkeyPatch, count: int = 2) -> None:
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "current_device", lambda: self.current)
        monkeypatch.setattr(torch.cuda, "device", self.device)
        monkeypatch.setattr(torch.cuda, "is_current_stream_capturing",
                            lambda: self.current in self.capturing)


def test_capture_check_asks_the_tensors_device(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = FakeDevices()
    gpus.install(monkeypatch)
    gpus.capturing = {1}
    assert device.stream_capturing(torch.device("cuda", 1))  # current device 0 is not capturing
    assert gpus.current == 0  # switched back
    assert not device.stream_capturing(torch.device("cuda", 0))
    gpus.current = 1
    assert not device.stream_capturing(torch.device("cuda", 0))


def test_capture_check_switches_nothing_on_the_current_device(
        monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = FakeDevices()
    gpus.install(monkeypatch)
    gpus.capturing = {0}
    assert device.stream_capturing(torch.device("cuda", 0))
    gpus.install(monkeypatch, count=1)
    assert device.stream_capturing(torch.device("cuda", 0))
    assert gpus.switches == 0


def test_call_on_a_capturing_second_gpu_passes_through(
    cuda_call: FakeAllocator, monkeypatch: pytest.MonkeyPatch
) -> None:
    gpus = FakeDevices()
    gpus.install(monkeypatch)
    gpus.capturing = {1}
    calls_on(monkeypatch, lambda _real: torch.device("cuda", 1))
    recorded = FakeEvent.recorded
    q = torch.randn(1, 2, 8, 4)
    with capture_spans() as spans:
        out = attention(q)
    assert spans == [] and FakeEvent.recorded == recorded and cuda_call.reads == 0
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))
    gpus.capturing = set()
    with capture_spans() as spans:
        attention(q)
    assert len(spans) == 1 and cuda_call.devices == [1, 1]
