"""Device timers and their deferred resolution.

The calling thread records a pair of CUDA events around a call and never waits for them; the
worker asks :meth:`DeviceTimer.ready` (``event.query()``) until the GPU has passed the end event.
Everything here except :class:`CudaEventPool` is plain Python and tested on CPU with fake events.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["Event", "DeviceTimer", "CudaEventPool", "Resolver"]


class Event(Protocol):
    """What a timing event offers (``torch.cuda.Event`` satisfies it)."""

    def record(self, stream: Any = None) -> None: ...
    def query(self) -> bool: ...
    def elapsed_time(self, end_event: Any) -> float: ...


class DeviceTimer:
    """A start/end event pair; the pool hands it out and takes it back."""

    __slots__ = ("start", "end", "_pool")

    def __init__(self, start: Event, end: Event, pool: CudaEventPool | None = None) -> None:
        self.start = start
        self.end = end
        self._pool = pool

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
    """Reuses timing events: creating them costs a driver call each."""

    def __init__(self, make_event: Callable[[], Event] | None = None, max_size: int = 256) -> None:
        self._make = make_event or _make_cuda_event
        self._free: deque[DeviceTimer] = deque()
        self._max = max_size
        self._lock = threading.Lock()

    def get(self) -> DeviceTimer:
        with self._lock:
            if self._free:
                timer = self._free.pop()
                timer._pool = self
                return timer
        return DeviceTimer(self._make(), self._make(), self)

    def put(self, timer: DeviceTimer) -> None:
        with self._lock:
            if len(self._free) < self._max:
                self._free.append(timer)

    def __len__(self) -> int:
        return len(self._free)


def _make_cuda_event() -> Event:
    import torch

    return torch.cuda.Event(enable_timing=True)  # type: ignore[no-any-return]


T = TypeVar("T")


class Resolver(Generic[T]):
    """Holds items whose timers are not ready yet; hands them out in order once ready.

    An item whose timer stays unready past ``timeout_s`` (a hung stream, a destroyed context) is
    handed out anyway with ``timed_out=True`` so the worker's memory stays bounded.
    """

    def __init__(
        self,
        timer_of: Callable[[T], DeviceTimer | None],
        timeout_s: float = 30.0,
        max_pending: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._timer_of = timer_of
        self._timeout = timeout_s
        self._max = max_pending
        self._clock = clock
        self._pending: deque[tuple[float, T]] = deque()

    def __len__(self) -> int:
        return len(self._pending)

    def add(self, item: T) -> None:
        self._pending.append((self._clock(), item))

    def poll(self) -> list[tuple[T, bool]]:
        """Items now resolvable, as ``(item, timed_out)``, oldest first.

        Events on one stream complete in order, but several streams may not: every pending
        item is checked, not just the head.
        """
        now = self._clock()
        done: list[tuple[T, bool]] = []
        keep: deque[tuple[float, T]] = deque()
        overflow = len(self._pending) - self._max
        for added, item in self._pending:
            timer = self._timer_of(item)
            try:
                ready = timer is None or timer.ready()
            except Exception:  # a dead CUDA context: give up on device time, keep the span
                ready = False
                added = -float("inf")
            if ready:
                done.append((item, False))
            elif now - added > self._timeout or overflow > 0:
                overflow -= 1
                done.append((item, True))
            else:
                keep.append((added, item))
        self._pending = keep
        return done

    def drain(self) -> list[tuple[T, bool]]:
        """Everything pending, resolved or not (shutdown)."""
        items = self.poll()
        items.extend((item, True) for _, item in self._pending)
        self._pending.clear()
        return items
