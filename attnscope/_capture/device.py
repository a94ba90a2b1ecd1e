"""What the calling thread records on a GPU: CUDA event pairs and allocator readings.

The calling thread records a pair of CUDA events around a call and never waits for them; the
worker asks :meth:`DeviceTimer.ready` (``event.query()``) until the GPU has passed the end event.
Allocator readings are host-side queries, one per side of the call: no device synchronisation.
An allocator that gives no statistics turns the readings off for its device; timing goes on. The
timer, pool and reading logic is plain Python, tested on CPU with fakes.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from typing import Any, Protocol

from .. import _log
from .._record.capture import DeviceMemory
from .._runtime import runtime

__all__ = ["Event", "DeviceTimer", "CudaEventPool", "stream_capturing", "memory_before",
           "memory_after"]


class Event(Protocol):
    """What a timing event offers (``torch.cuda.Event`` satisfies it)."""

    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...


class DeviceTimer:
    """A start/end event pair for one device; the pool hands it out and takes it back."""

    __slots__ = ("start", "end", "device", "after", "_after_recorded", "_pool", "_stream_of",
                 "_make")

    def __init__(self, start: Event, end: Event, pool: CudaEventPool | None = None,
                 device: Any = None, stream_of: Callable[[Any], Any] | None = None,
                 make_event: Callable[[], Event] | None = None) -> None:
        self.start = start
        self.end = end
        self.device = device
        self.after: Event | None = None  # made on first use: most calls read nothing after
        self._after_recorded = False
        self._pool = pool
        self._stream_of = stream_of
        self._make = make_event

    def _stream(self) -> Any:
        return (None if self._stream_of is None or self.device is None
                else self._stream_of(self.device))

    def record_start(self) -> None:
        """Record the start event on the current stream of the timer's device (not the current
        device's: with layers spread over GPUs the two differ)."""
        self.start.record(self._stream())

    def record_end(self) -> None:
        self.end.record(self._stream())

    def record_after(self) -> None:
        """Record the third event, after the copies of counts enqueued behind the call: the
        worker reads those copies once it has passed."""
        if self.after is None:
            self.after = (self._make or _make_cuda_event)()
        self.after.record(self._stream())
        self._after_recorded = True

    def ready(self) -> bool:
        """True once the device has passed the end event, and the third event when recorded
        (non-blocking; on one stream, the later event passing implies the earlier did)."""
        if self._after_recorded and self.after is not None:
            return bool(self.after.query())
        return bool(self.end.query())

    def elapsed_ns(self) -> int:
        """Device time between the events; only valid once :meth:`ready`."""
        return int(self.start.elapsed_time(self.end) * 1_000_000)

    def release(self) -> None:
        self._after_recorded = False
        if self._pool is not None:
            self._pool.put(self)
            self._pool = None


class CudaEventPool:
    """Reuses timing events, per device: creating them costs a driver call each, and an event
    stays bound to the device it was first recorded on."""

    def __init__(self, make_event: Callable[[], Event] | None = None, max_size: int = 256,
                 stream_of: Callable[[Any], Any] | None = None) -> None:
        self._make = make_event or _make_cuda_event
        self._make_external = make_event or _make_external_event
        self._stream_of = (stream_of if stream_of is not None or make_event is not None
                           else _current_stream)
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
        return DeviceTimer(self._make(), self._make(), self, device, self._stream_of, self._make)

    def external(self, device: Any) -> DeviceTimer:
        """A pair recorded during a CUDA graph's capture: ``external=True`` makes each record an
        event node of the graph, recorded again by every replay. It belongs to its graph (its
        timestamps are the latest replay's), so it never comes back to the pool."""
        make = self._make_external
        return DeviceTimer(make(), make(), None, device, self._stream_of, make)

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


def _make_external_event() -> Event:
    import torch

    event: Event = torch.cuda.Event(enable_timing=True, external=True)  # type: ignore[no-untyped-call]
    return event


def stream_capturing(device: Any) -> bool:
    """True while the current stream of ``device`` (the tensor's, where the events would go) is
    capturing a CUDA graph.

    ``torch.cuda.is_current_stream_capturing()`` looks at the current device's current stream;
    with layers spread over GPUs that is not always the tensor's. With one visible GPU the two are
    the same and nothing is switched.
    """
    import torch

    index = getattr(device, "index", None)
    if index is None or torch.cuda.device_count() <= 1 or index == torch.cuda.current_device():
        return bool(torch.cuda.is_current_stream_capturing())
    with torch.cuda.device(index):  # switches back on exit; the tensor's context already exists
        return bool(torch.cuda.is_current_stream_capturing())


# ---- allocator readings ------------------------------------------------------------------------
# One read per side of the call: the allocator's nested statistics, of which two numbers are kept.
# torch.cuda.memory_allocated() and max_memory_allocated() each go through memory_stats(), which
# flattens and sorts the whole (~120-key) dictionary to return one value.
# An allocator without statistics (CUDAPluggableAllocator: RMM and the like raise on device stats
# and on a peak reset) turns the memory readings off for its device, once and said once: spans
# carry no memory attributes there, and device timing goes on.

_STATS = "stats"
_RESET = "reset-peak"


def memory_before(device: Any, reset_peak: bool) -> DeviceMemory | None:
    """Allocator readings before a call (host-side queries only); None: no readings on this
    device. Never raises."""
    try:
        index = _device_index(device)
    except Exception as exc:
        _log.internal_error("allocator", exc)
        return None
    off = runtime.device.allocator_off
    if (index, _STATS) in off:
        return None
    reset = reset_peak and (index, _RESET) not in off and _reset_peak(index, device)
    reading = _read(index, device)
    if reading is None:
        return None
    return DeviceMemory(device, reading[0], reading[1], reset)


def memory_after(mem: DeviceMemory) -> None:
    """The readings after the call. Without them the record reports no delta and no peak."""
    try:
        reading = _read(_device_index(mem.device), mem.device)
    except Exception as exc:
        _log.internal_error("allocator", exc)
        return
    if reading is not None:
        mem.allocated_after, mem.peak_after = reading


def _device_index(device: Any) -> int:
    index = getattr(device, "index", None)
    if isinstance(index, int):
        return index
    if isinstance(device, int):
        return device
    import torch

    if isinstance(device, str):
        index = torch.device(device).index
        if index is not None:
            return int(index)
    return int(torch.cuda.current_device())


def _read(index: int, device: Any) -> tuple[int, int] | None:
    """(allocated, peak) bytes from one allocator query; None if the allocator gave none."""
    import torch

    try:
        # torch._C._cuda_memoryStats behind an "is CUDA initialised" check, without the flattening
        stats = torch.cuda.memory_stats_as_nested_dict(index)
        if not stats:  # CUDA not initialised yet: nothing to read this time
            return None
        pool = stats["allocated_bytes"]["all"]
        return int(pool["current"]), int(pool["peak"])
    except Exception as exc:  # the allocator raised, or answered in a shape not known here
        _turn_off(index, _STATS, device, exc)
        return None


def _reset_peak(index: int, device: Any) -> bool:
    import torch

    try:
        torch.cuda.reset_peak_memory_stats(index)
    except Exception as exc:
        _turn_off(index, _RESET, device, exc)
        return False
    return True


def _turn_off(index: int, what: str, device: Any, exc: Exception) -> None:
    runtime.device.allocator_off.add((index, what))
    if what == _STATS:
        message = ("attnscope: the CUDA allocator gives no memory statistics on this device (a "
                   "pluggable allocator?); its spans carry no memory attributes, "
                   "device time goes on")
    else:
        message = ("attnscope: the CUDA allocator cannot reset its peak statistics on this device; "
                   "a call's peak is reported only when it sets a new process-wide peak")
    _log.warn_once(f"allocator-{what}:{index}", message, device=str(device),
                   error=repr(exc)[:200])
