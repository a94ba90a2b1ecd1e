"""Host memory: the process handle resident memory is read through, and the last reading."""

from __future__ import annotations

import time
from typing import Any

__all__ = ["HostMemory", "RSS_EVERY_S"]

# One read costs psutil a /proc read (tens of µs): as much as the rest of a span.
RSS_EVERY_S = 0.25


class HostMemory:
    """psutil's Process (made on first use) and the last RSS reading, with when it was taken.
    Read by the worker only (one thread: no lock)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.process: Any = None  # psutil.Process: psutil is loaded on first use
        self.rss_bytes: int | None = None
        self.rss_read_at = float("-inf")  # monotonic seconds

    def after_fork(self) -> None:
        """Nothing to renew: no lock, and a reading of the parent expires by its time."""

    def rss(self) -> int | None:
        """Resident set size of this process, read at most every ``RSS_EVERY_S``.

        The value is the process's, not the call's, so a reading a fraction of a second old says
        the same. None when it cannot be read.
        """
        now = time.monotonic()
        if now - self.rss_read_at < RSS_EVERY_S:
            return self.rss_bytes
        self.rss_read_at = now
        try:
            if self.process is None:
                import psutil

                self.process = psutil.Process()
            self.rss_bytes = int(self.process.memory_info().rss)
        except Exception:
            self.rss_bytes = None
        return self.rss_bytes
