"""Memory readings: allocator peaks (CUDA, faked on CPU), profiler memory events, host RSS."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import device
from attnscope._capture import profiler_session as profiler
from attnscope._derive import call as derive
from attnscope.testing import capture_spans

from .support.helpers import attrs

MIB = 1 << 20


class FakeAllocator:
    def __init__(self, allocated: int, peak: int) -> None:
        self.allocated = allocated
        self.peak = peak
        self.resets = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", self.stats)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)

    def stats(self, device: Any = None) -> dict[str, Any]:
        return {"allocated_bytes": {"all": {"current": self.allocated, "peak": self.peak}}}

    def reset(self, device: Any = None) -> None:
        self.resets += 1
        self.peak = self.allocated

    def alloc(self, n: int) -> None:
        self.allocated += n
        self.peak = max(self.peak, self.allocated)


def test_user_peak_statistics_are_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    alloc = FakeAllocator(allocated=10 * MIB, peak=50 * MIB)
    alloc.install(monkeypatch)
    mem = device.memory_before("cuda:0", reset_peak=False)
    alloc.alloc(3 * MIB)
    alloc.alloc(-2 * MIB)
    device.memory_after(mem)
    assert alloc.resets == 0 and alloc.peak == 50 * MIB
    assert mem.delta_bytes == 1 * MIB
    assert mem.peak_bytes is None  # hidden under the older 50 MiB peak: not claimed


def test_new_process_peak_gives_the_calls_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    alloc = FakeAllocator(allocated=10 * MIB, peak=12 * MIB)
    alloc.install(monkeypatch)
    mem = device.memory_before("cuda:0", reset_peak=False)
    alloc.alloc(8 * MIB)
    alloc.alloc(-8 * MIB)
    device.memory_after(mem)
    assert mem.peak_bytes == 8 * MIB
    assert mem.delta_bytes == 0


def test_reset_when_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    alloc = FakeAllocator(allocated=10 * MIB, peak=50 * MIB)
    alloc.install(monkeypatch)
    mem = device.memory_before("cuda:0", reset_peak=True)
    alloc.alloc(1 * MIB)
    device.memory_after(mem)
    assert alloc.resets == 1
    assert mem.peak_bytes == 1 * MIB


def test_host_rss() -> None:
    rss = derive.host_rss_bytes()
    assert isinstance(rss, int) and rss > 0


@attnscope.trace
def allocates(q: torch.Tensor, nbytes: int) -> torch.Tensor:
    scratch = torch.empty(nbytes, dtype=torch.uint8)
    scratch.fill_(1)
    del scratch
    return q + 1  # the result (a small tensor) stays allocated


def test_profile_tier_memory_peak_of_a_known_buffer() -> None:
    assert profiler.warm_up()
    q = torch.randn(16, 16)
    result_bytes = q.numel() * q.element_size()
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
        allocates(q, 4 * MIB)
    (span,) = [s for s in spans if "attnscope.tier" in (s.attributes or {})]
    a = attrs(span)
    assert a["attnscope.tier"] == "profile"
    peak = a["attnscope.memory.peak_bytes"]
    assert 4 * MIB <= peak <= 4 * MIB + result_bytes + 64 * 1024


def test_timing_tier_on_cpu_reports_no_device_memory() -> None:
    with capture_spans() as spans:
        allocates(torch.randn(4, 4), 1024)
    (span,) = spans
    a = attrs(span)
    assert "attnscope.memory.peak_bytes" not in a and "attnscope.memory.delta_bytes" not in a
    assert a["attnscope.memory.host_rss_bytes"] > 0
