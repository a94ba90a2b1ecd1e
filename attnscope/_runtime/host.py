"""Host memory: the process handle the worker reads resident memory through, and its last
reading."""

from __future__ import annotations

from typing import Any

__all__ = ["HostMemory"]


class HostMemory:
    """psutil's Process (made on first use) and the last RSS reading, with when it was taken."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.process: Any = None  # psutil.Process: psutil is optional and loaded on first use
        self.rss_bytes: int | None = None
        self.rss_read_at = float("-inf")  # monotonic seconds

    def after_fork(self) -> None:
        """Nothing to renew: no lock, and a reading of the parent expires by its time."""
