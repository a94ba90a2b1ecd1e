"""Captures whose device timers have not finished yet, held until they have (worker side)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Generic, Protocol, TypeVar

__all__ = ["Resolver", "Timer"]


class Timer(Protocol):
    """What the resolver asks of a device timer (``capture.device.DeviceTimer`` satisfies it)."""

    def ready(self) -> bool: ...


T = TypeVar("T")


class Resolver(Generic[T]):
    """Holds items whose timers are not ready yet; hands them out in order once ready.

    An item whose timer stays unready past ``timeout_s`` (a hung stream, a destroyed context) is
    handed out anyway with ``timed_out=True`` so the worker's memory stays bounded.
    """

    def __init__(
        self,
        timer_of: Callable[[T], Timer | None],
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
