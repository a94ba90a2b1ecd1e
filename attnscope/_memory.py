"""Memory readings: device allocator peaks around a call, host RSS off the hot path."""

from __future__ import annotations

from typing import Any

__all__ = ["DeviceMemory", "cuda_before", "cuda_after", "host_rss_bytes"]

_process: Any = None


def host_rss_bytes() -> int | None:
    """Resident set size of this process (worker side: psutil costs ~10 µs)."""
    global _process
    try:
        if _process is None:
            import psutil

            _process = psutil.Process()
        return int(_process.memory_info().rss)
    except Exception:
        return None


class DeviceMemory:
    """Allocator readings taken on the calling thread; the worker derives peak and delta."""

    __slots__ = ("device", "allocated_before", "peak_before", "allocated_after", "peak_after", "reset")

    def __init__(self, device: Any, allocated_before: int, peak_before: int, reset: bool) -> None:
        self.device = device
        self.allocated_before = allocated_before
        self.peak_before = peak_before
        self.allocated_after = 0
        self.peak_after = 0
        self.reset = reset

    @property
    def delta_bytes(self) -> int:
        return self.allocated_after - self.allocated_before

    @property
    def peak_bytes(self) -> int | None:
        """Peak allocated during the call above what was allocated before it.

        Exact when the peak statistics were reset before the call or when the call set a new
        process-wide peak; otherwise the call's own peak is hidden under an older one: None.
        """
        if self.reset or self.peak_after > self.peak_before:
            return max(0, self.peak_after - self.allocated_before)
        return None


def cuda_before(device: Any, reset_peak: bool) -> DeviceMemory:
    """Host-side allocator queries only: no device synchronisation."""
    import torch

    allocated = torch.cuda.memory_allocated(device)
    if reset_peak:
        torch.cuda.reset_peak_memory_stats(device)
        peak = allocated
    else:
        peak = torch.cuda.max_memory_allocated(device)
    return DeviceMemory(device, allocated, peak, reset_peak)


def cuda_after(mem: DeviceMemory) -> None:
    import torch

    mem.allocated_after = torch.cuda.memory_allocated(mem.device)
    mem.peak_after = torch.cuda.max_memory_allocated(mem.device)
