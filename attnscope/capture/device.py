"""What the calling thread records on a GPU: CUDA event pairs and allocator readings.

The calling thread records a pair of CUDA events around a call and never waits for them; the
worker asks :meth:`DeviceTimer.ready` (``event.query()``) until the GPU has passed the end event.
Allocator readings are host-side queries: no device synchronisation. The timer and pool logic is
plain Python, tested on CPU with fake events.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .record import DeviceMemory

__all__ = ["Event", "DeviceTimer", "CudaEventPool", "memory_before", "memory_after"]


class Event(Protocol):
    """What a timing event offers (``torch.cuda.Event`` satisfies it)."""

    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...


class DeviceTimer:
    """A start/end event pair for one device; the pool hands it out and takes it back."""

    __slots__ = ("start", "end", "device", "_pool", "_stream_of")

    def __init__(self, start: Event, end: Event, pool: CudaEventPool | None = None,
                 device: Any = None, stream_of: Callable[[Any], Any] | None = None) -> None:
        self.start = start
        self.end = end
        self.device = device
        self._pool = pool
        self._stream_of = stream_of

    def _stream(self) -> Any:
        return None if self._stream_of is None or self.device is None else self._stream_of(self.device)

    def record_start(self) -> None:
        """Record the start event on the current stream of the timer's device (not the current
        device's: with layers spread over GPUs the two differ)."""
        self.start.record(self._stream())

    def record_end(self) -> None:
        self.end.record(self._stream())

    def ready(self) -> bool:
        """True once the device has passed the end event (non-blocking)."""
        return bool(self.end.query())

    def elapsed_ns(self) -> int:
        """Device time between the events; only valid once :meth:`ready`."""
        return int(self.start.elapsed_time(self.end) * 1_000_000)

    def release(self) -> None:
        if self._pool is not None:
            self._pool.put(self)
            self._pool = None


class CudaEventPool:
    """Reuses timing events, per device: creating them costs a driver call each, and an event
    stays bound to the device it was first recorded on."""

    def __init__(self, make_event: Callable[[], Event] | None = None, max_size: int = 256,
                 stream_of: Callable[[Any], Any] | None = None) -> None:
        self._make = make_event or _make_cuda_event
        self._stream_of = stream_of if stream_of is not None or make_event is not None else _current_stream
        self._free: dict[Any, deque[DeviceTimer]] = {}
        self._max = max_size
        self._lock = threading.Lock()

    def get(self, device: Any = None) -> DeviceTimer:
        key = _device_key(device)
        with self._lock:
            free = self._free.get(key)
            if free:
                timer = free.pop()
                timer._pool = self
                return timer
        return DeviceTimer(self._make(), self._make(), self, device, self._stream_of)

    def put(self, timer: DeviceTimer) -> None:
        with self._lock:
            free = self._free.setdefault(_device_key(timer.device), deque())
            if len(free) < self._max:
                free.append(timer)

    def __len__(self) -> int:
        return sum(len(free) for free in self._free.values())


def _device_key(device: Any) -> Any:
    if device is None:
        return None
    index = getattr(device, "index", None)
    return (getattr(device, "type", str(device)), index)


def _current_stream(device: Any) -> Any:
    import torch

    return torch.cuda.current_stream(device)


def _make_cuda_event() -> Event:
    import torch

    event: Event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
    return event


def memory_before(device: Any, reset_peak: bool) -> DeviceMemory:
    """Allocator readings before a call (host-side queries only)."""
    import torch

    allocated = torch.cuda.memory_allocated(device)
    if reset_peak:
        torch.cuda.reset_peak_memory_stats(device)
        peak = allocated
    else:
        peak = torch.cuda.max_memory_allocated(device)
    return DeviceMemory(device, allocated, peak, reset_peak)


def memory_after(mem: DeviceMemory) -> None:
    import torch

    mem.allocated_after = torch.cuda.memory_allocated(mem.device)
    mem.peak_after = torch.cuda.max_memory_allocated(mem.device)
