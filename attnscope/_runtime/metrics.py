"""Metric totals that survive worker restarts, and the instruments made per meter provider."""

from __future__ import annotations

import threading
import weakref
from typing import Any

__all__ = ["MetricTotals"]


class MetricTotals:
    """Counter totals by key, the last value seen per source, instruments per meter provider.

    ``reset()`` keeps the instruments and whether the Prometheus server started: they are
    registered with the application's meter providers and cannot be taken back.
    """

    def __init__(self) -> None:
        self.reset()
        self.instruments: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.prometheus_started = False

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.last: dict[str, tuple[Any, int]] = {}  # key -> (weak source, its last value)
        self.totals: dict[str, int] = {}

    def after_fork(self) -> None:
        self.lock = threading.Lock()

    def add(self, key: str, source: Any, value: int) -> int:
        """Process-lifetime total of a count that restarts (a new worker, a reset): ``value`` is
        ``source``'s count now; a new source, or one whose count went down, starts over."""
        with self.lock:
            last_ref, last_value = self.last.get(key, (None, 0))
            same = last_ref is not None and last_ref() is source
            delta = value - last_value if same and value >= last_value else value
            self.last[key] = (weakref.ref(source) if source is not None else _none_ref, value)
            self.totals[key] = self.totals.get(key, 0) + max(0, delta)
            return self.totals[key]

    def current(self, key: str) -> int:
        """The total of ``key`` so far."""
        with self.lock:
            return self.totals.get(key, 0)


def _none_ref() -> None:
    return None
