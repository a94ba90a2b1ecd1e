"""The plain record one sampled call produces on the calling thread.

A Capture holds only cheap, immutable facts (clock readings, shapes, dtypes, devices, handles) and
no OpenTelemetry objects; the worker turns it into spans.
"""

from __future__ import annotations

import itertools
from typing import Any

__all__ = ["Capture", "next_id", "TIER_NONE", "TIER_TIMING", "TIER_PROFILE", "TIER_NAMES"]

TIER_NONE = 0
TIER_TIMING = 1
TIER_PROFILE = 2
TIER_NAMES = {TIER_TIMING: "timing", TIER_PROFILE: "profile"}

# itertools.count is atomic under the GIL: ids are unique across threads without a lock.
next_id = itertools.count(1).__next__


class Capture:
    """One sampled call: filled on the calling thread, read by the worker."""

    __slots__ = (
        "capture_id",
        "parent_id",
        "site",
        "name",
        "tier",
        "sample_rate",
        "otel_parent",
        "start_epoch_ns",
        "start_perf_ns",
        "end_perf_ns",
        "summary",
        "instance",
        "extra",
        "error",
        "timer",
        "profile",
        "memory",
        "overhead_ns",
    )

    def __init__(self) -> None:
        self.capture_id: int = 0
        self.parent_id: int | None = None
        self.site: Any = None
        self.name: str = ""
        self.tier: int = TIER_TIMING
        self.sample_rate: float = 1.0
        self.otel_parent: Any = None  # opentelemetry SpanContext of the app's current span
        self.start_epoch_ns: int = 0
        self.start_perf_ns: int = 0
        self.end_perf_ns: int = 0
        self.summary: list[tuple[str, Any]] = []
        self.instance: Any = None  # the module for method/forward calls (to read its config)
        self.extra: dict[str, Any] | None = None  # attributes given by span(..., tokens=...)
        self.error: BaseException | None = None
        self.timer: Any = None  # device timer handle, resolved later by the worker
        self.profile: Any = None  # profiler session, parsed by the worker
        self.memory: Any = None  # device memory readings
        self.overhead_ns: int = 0

    @property
    def wall_ns(self) -> int:
        return self.end_perf_ns - self.start_perf_ns

    @property
    def end_epoch_ns(self) -> int:
        return self.start_epoch_ns + self.wall_ns
