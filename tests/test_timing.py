"""Timing tier: device timers resolved later by the worker, tested on CPU with fake CUDA events."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import device
from attnscope._capture.device import CudaEventPool, DeviceTimer
from attnscope._record.capture import DeviceMemory
from attnscope._runtime import runtime
from attnscope._worker import cuda as worker_cuda
from attnscope._worker import loop, stopping
from attnscope._worker.resolve import Resolver
from attnscope.testing import capture_spans

from .support.helpers import attrs, calls_on


class FakeGpu:
    """A device whose work completes when the test says so."""

    def __init__(self) -> None:
        self.clock_ms = 0.0
        self.done_until = -1  # events recorded with an index <= this are complete
        self.recorded = 0

    def finish_all(self) -> None:
        self.done_until = self.recorded


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.index = -1
        self.at_ms = 0.0
        self.queries = 0

    def record(self, stream: Any = None) -> None:
        self.gpu.recorded += 1
        self.index = self.gpu.recorded
        self.gpu.clock_ms += 1.5  # each recorded event is 1.5 ms of device time after the last
        self.at_ms = self.gpu.clock_ms

    def query(self) -> bool:
        self.queries += 1
        return self.index <= self.gpu.done_until

    def elapsed_time(self, end_event: FakeEvent) -> float:
        assert self.query() and end_event.query(), "elapsed_time before both events completed"
        return end_event.at_ms - self.at_ms

    def synchronize(self) -> None:
        raise AssertionError("attnscope must never wait on the device")


class FakeTimer:
    def __init__(self, ready_after: int | None = None, raises: bool = False) -> None:
        self.polls = 0
        self.ready_after = ready_after
        self.raises = raises

    def ready(self) -> bool:
        self.polls += 1
        if self.raises:
            raise RuntimeError("CUDA context is gone")
        return self.ready_after is not None and self.polls > self.ready_after


# ---- Resolver ---------------------------------------------------------------------------------

def test_resolver_hands_out_items_once_ready() -> None:
    timers = {"a": FakeTimer(ready_after=2), "b": FakeTimer(ready_after=0), "c": None}
    r: Resolver[str] = Resolver(lambda item: timers[item])  # type: ignore[arg-type,return-value]
    for item in "abc":
        r.add(item)
    assert r.poll() == [("b", False), ("c", False)]  # a later stream's event may finish first
    assert len(r) == 1
    assert r.poll() == []
    assert r.poll() == [("a", False)]
    assert len(r) == 0


def test_resolver_times_out_instead_of_waiting_forever() -> None:
    now = [100.0]
    r: Resolver[str] = Resolver(lambda item: FakeTimer(), timeout_s=5.0,  # type: ignore[arg-type,return-value]
                                clock=lambda: now[0])
    r.add("stuck")
    assert r.poll() == []
    now[0] += 5.1
    assert r.poll() == [("stuck", True)]


def test_resolver_bounds_pending_items() -> None:
    r: Resolver[int] = Resolver(lambda item: FakeTimer(), max_pending=3)  # type: ignore[arg-type,return-value]
    for i in range(5):
        r.add(i)
    out = r.poll()
    assert out == [(0, True), (1, True)]
    assert len(r) == 3


def test_resolver_survives_a_failing_query() -> None:
    r: Resolver[str] = Resolver(lambda item: FakeTimer(raises=True))  # type: ignore[arg-type,return-value]
    r.add("dead")
    assert r.poll() == [("dead", True)]


def test_resolver_drain_returns_everything() -> None:
    t = {"x": FakeTimer(ready_after=0), "y": FakeTimer()}
    r: Resolver[str] = Resolver(lambda item: t[item])  # type: ignore[arg-type,return-value]
    r.add("x")
    r.add("y")
    assert r.drain() == [("x", False), ("y", True)]
    assert len(r) == 0


# ---- events and the pool ----------------------------------------------------------------------

def test_pool_reuses_event_pairs() -> None:
    gpu = FakeGpu()
    made: list[FakeEvent] = []

    def make() -> FakeEvent:
        made.append(FakeEvent(gpu))
        return made[-1]

    pool = CudaEventPool(make_event=make, max_size=2)
    first = pool.get()
    first.release()
    first.release()  # a second release is a no-op
    assert len(pool) == 1
    again = pool.get()
    assert again is first and len(made) == 2
    timers = [pool.get() for _ in range(3)]
    for timer in timers:
        timer.release()
    assert len(pool) == 2  # bounded


def test_pool_is_per_device_and_records_on_the_devices_stream() -> None:
    gpu = FakeGpu()
    streams: list[Any] = []

    class StreamEvent(FakeEvent):
        def record(self, stream: Any = None) -> None:
            streams.append(stream)
            super().record(stream)

    pool = CudaEventPool(make_event=lambda: StreamEvent(gpu), stream_of=lambda d: f"stream-of-{d}")
    t0 = pool.get(torch.device("cuda", 0))
    t1 = pool.get(torch.device("cuda", 1))
    t1.record_start()
    t1.record_end()
    assert streams == ["stream-of-cuda:1", "stream-of-cuda:1"]
    t0.release()
    t1.release()
    assert pool.get(torch.device("cuda", 1)) is t1  # never handed to another device
    assert pool.get(torch.device("cuda", 0)) is t0
    assert pool.get(torch.device("cuda", 0)) is not t0


def test_device_timer_elapsed_ns() -> None:
    gpu = FakeGpu()
    timer = DeviceTimer(FakeEvent(gpu), FakeEvent(gpu))  # type: ignore[arg-type]
    timer.start.record()
    timer.end.record()
    assert not timer.ready()
    gpu.finish_all()
    assert timer.ready()
    assert timer.elapsed_ns() == 1_500_000


# ---- the timing tier end to end with fake CUDA events --------------------------------------------

@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpu]:
    """Make traced calls look like CUDA calls whose device work finishes when the test says."""
    gpu = FakeGpu()
    cuda0 = torch.device("cuda", 0)
    calls_on(monkeypatch, lambda _real: cuda0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(runtime.device, "event_pool",
                        CudaEventPool(make_event=lambda: FakeEvent(gpu)))
    readings = iter(range(1000))

    def before(dev: Any, reset: bool) -> DeviceMemory:
        return DeviceMemory(dev, 1000, 1000 + next(readings), reset)

    def after(mem: DeviceMemory) -> None:
        mem.allocated_after = mem.allocated_before + 256
        mem.peak_after = mem.allocated_before + 4096

    monkeypatch.setattr(device, "memory_before", before)
    monkeypatch.setattr(device, "memory_after", after)
    monkeypatch.setattr(torch.cuda, "synchronize", _no_sync, raising=False)
    # the worker's own device access (set_device, a side stream) is not what is tested here
    monkeypatch.setattr(worker_cuda.DeviceAccess, "prepare", lambda self, dev: None)
    monkeypatch.setattr(worker_cuda.DeviceAccess, "reading",
                        lambda self, dev: contextlib.nullcontext())
    yield gpu


def _no_sync(*args: Any) -> None:
    raise AssertionError("attnscope must never synchronize the device")


def attention_untraced(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


attention = attnscope.trace(attention_untraced)


def test_worker_waits_for_device_time_without_blocking(fake_cuda: FakeGpu) -> None:
    q = torch.randn(1, 2, 16, 8)
    with capture_spans() as spans:
        t0 = time.perf_counter()
        attention(q, q, q)
        call_s = time.perf_counter() - t0
        assert not stopping.flush(timeout_s=0.2)  # the device has not finished: span still pending
        assert loop.stats()["pending"] == 1
        fake_cuda.finish_all()
        assert stopping.flush(timeout_s=5.0)
    assert call_s < 0.2
    (span,) = spans
    a = attrs(span)
    assert a["attnscope.tier"] == "timing"
    assert a["attnscope.device_ns"] == 1_500_000
    flops = a["attnscope.flops"]
    assert a["attnscope.tflops"] == pytest.approx(flops / 1_500_000 / 1e3, rel=1e-3)
    assert a["attnscope.tokens_per_s"] == pytest.approx(a["attnscope.tokens"] * 1e9 / 1_500_000,
                                                        rel=1e-3)
    assert a["attnscope.memory.delta_bytes"] == 256
    assert a["attnscope.memory.peak_bytes"] == 4096
    assert len(runtime.device.event_pool) == 1  # the pair went back to the pool


def test_device_time_never_arrives_span_still_emitted(fake_cuda: FakeGpu,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    q = torch.randn(1, 2, 16, 8)
    with capture_spans() as spans:
        worker = loop.start(attnscope._api.current())
        worker.resolver._timeout = 0.05
        attention(q, q, q)
    (span,) = spans
    assert "attnscope.device_ns" not in attrs(span)  # nothing false recorded
    assert "attnscope.wall_ns" in attrs(span)


def test_cuda_graph_capture_passes_through(fake_cuda: FakeGpu,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    q = torch.randn(1, 2, 16, 8)
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
        out = attention(q, q, q)
    assert spans == []
    assert fake_cuda.recorded == 0  # no event was recorded into the graph
    assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(q, q, q))


def test_torch_compile_tracing_passes_through(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    # Tracing needs Dynamo imported; attnscope asks is_compiling() only from then on.
    monkeypatch.setattr(runtime.dynamo, "loaded", True)
    # Wrapped now: a wrapper made once Dynamo is loaded asks the is_compiling() torch had when
    # it was made (the module's `attention` may be one, made before the patch above).
    attention = attnscope.trace(attention_untraced)

    class Attn(torch.nn.Module):
        @attnscope.trace
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    q = torch.randn(1, 2, 16, 8)
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
        a = attention(q, q, q)
        b = Attn()(q)
    assert spans == []
    assert torch.equal(a, b)


def test_timer_type_satisfies_protocol() -> None:
    gpu = FakeGpu()
    event: device.Event = FakeEvent(gpu)
    event.record()
    assert event.query() is False


def test_span_covers_the_call_however_long_set_up_takes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The span's start and its length come from two clocks read back to back: set-up between
    them (slowed down here) must not end the span before the call did."""
    from attnscope._capture import retain

    kept = retain.keep_summary

    def slow_keep(cap: Any) -> None:
        kept(cap)
        time.sleep(0.02)

    monkeypatch.setattr(retain, "keep_summary", slow_keep)  # wrapper calls it through the module
    seen: list[int] = []

    @attnscope.trace
    def body() -> None:
        seen.append(time.time_ns())
        time.sleep(0.005)
        seen.append(time.time_ns())

    with capture_spans() as spans:
        body()
    (span,) = spans
    assert span.start_time is not None and span.end_time is not None
    assert span.start_time <= seen[0] and seen[1] <= span.end_time
