"""How the reports write numbers: durations, SI prefixes, bytes and times, shared by the
terminal and HTML renderers."""

from __future__ import annotations

import math
from datetime import datetime, timezone

__all__ = ["duration", "si", "bytes_", "when"]


def duration(ns: float | None) -> str:
    """Nanoseconds in a human unit: ``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.23 s``."""
    if ns is None or not math.isfinite(ns):
        return "—"
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if abs(ns) >= scale:
            return f"{_sig3(ns / scale)} {unit}"
    return f"{ns:.0f} ns"


def si(value: float | None, unit: str = "") -> str:
    """A value with an SI prefix and 3 significant digits: ``12.3 k``, ``1.66 M``."""
    if value is None or not math.isfinite(value):
        return "—"
    for prefix, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{_sig3(value / scale)} {prefix}{unit}"
    return f"{_sig3(value)} {unit}".rstrip()


def _sig3(v: float) -> str:
    return f"{v:.3g}" if abs(v) < 1000 else f"{v:.0f}"


def bytes_(n: int | None) -> str:
    """Bytes in KiB/MiB/GiB, 3 significant digits."""
    if n is None:
        return "—"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{_sig3(n / scale)} {unit}"
    return f"{n} B"


def when(ns: int) -> str:
    """A unix-epoch nanosecond time as ISO 8601 UTC, to the millisecond."""
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")
