"""CUDA state of the calling side: the event pool and what the CUDA allocator refused."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._capture.device import CudaEventPool

__all__ = ["DeviceState"]


class DeviceState:
    """The CUDA event pool (made on the first CUDA call) and the allocator calls switched off."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.event_pool: CudaEventPool | None = None
        # (device index, "stats" | "reset-peak"): what the CUDA allocator refused (pluggable ones)
        self.allocator_off: set[tuple[int, str]] = set()

    def after_fork(self) -> None:
        self.event_pool = None  # CUDA events of the parent are not valid in a child
