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
