"""The budget of tensor bytes captures may keep alive by reference (masks until the worker counts
them): taken on the calling thread, given back by the worker."""

from __future__ import annotations

import threading

__all__ = ["Retention", "KEEP_TOTAL_BYTES"]

# Tensors all captures together may keep alive by reference.
KEEP_TOTAL_BYTES = 64 << 20


class Retention:
    """Bytes of tensors captures keep by reference, within :data:`KEEP_TOTAL_BYTES`."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.kept_bytes = 0

    def after_fork(self) -> None:
        # The count stays: a child still holds the captures it inherited until they are dropped.
        self.lock = threading.Lock()

    def take(self, n: int) -> bool:
        """Reserve ``n`` bytes of the budget; False if that would exceed it."""
        with self.lock:
            if self.kept_bytes + n > KEEP_TOTAL_BYTES:
                return False
            self.kept_bytes += n
            return True

    def give(self, n: int) -> None:
        """Return bytes reserved with :meth:`take` (the tensors are no longer kept)."""
        if n:
            with self.lock:
                self.kept_bytes = max(0, self.kept_bytes - n)
