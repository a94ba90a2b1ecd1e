"""How every command writes numbers: durations, SI prefixes, bytes, rates and times, in the
terminal tables and the HTML pages alike (3 significant digits; ``MISSING`` for no value)."""

from __future__ import annotations

import math
from datetime import datetime, timezone

__all__ = ["MISSING", "duration", "si", "bytes_", "quantity", "when"]

# A cell with no value. One mark for every command: an ASCII "-" reads as a minus sign next to
# signed changes (diff) and negative figures.
MISSING = "—"

def _sig3(v: float) -> str:
    text = f"{v:.3g}"
    return f"{v:.0f}" if "e" in text else text  # 999.7 rounds to "1e+03": written whole


def _reaches(value: float, scale: float) -> bool:
    """Whether ``value``, rounded to the 3 digits shown, is at least ``scale``: 999.7 µs is
    shown as 1 ms, not as 1000 µs."""
    return abs(float(f"{value:.3g}")) >= scale

def duration(ns: float | None) -> str:
    """Nanoseconds in a human unit: ``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.23 s``."""
    if ns is None or not math.isfinite(ns):
        return MISSING
    for unit, scale in (("s", 1e9), ("ms", 1e6), ("µs", 1e3)):
        if _reaches(ns, scale):
            return f"{_sig3(ns / scale)} {unit}"
    return f"{ns:.0f} ns"

def si(value: float | None, unit: str = "") -> str:
    """A value with an SI prefix: ``12.3 k``, ``1.66 M``; with a unit ``279 k tok/s``."""
    if value is None or not math.isfinite(value):
        return MISSING
    number, prefix = _sig3(value), ""
    for p, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if _reaches(value, scale):
            number, prefix = _sig3(value / scale), p
            break
    return " ".join(part for part in (number, prefix, unit) if part)

def bytes_(n: float | None) -> str:
    """Bytes in KiB/MiB/GiB: ``417 KiB``, ``1.5 GiB``, ``512 B``."""
    if n is None or not math.isfinite(n):
        return MISSING
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(n) >= scale:  # 1023.6 KiB is written whole ("1024 KiB"), not rounded up
            return f"{_sig3(n / scale)} {unit}"
    return f"{n:.0f} B"

def quantity(value: float | None, kind: str) -> str:
    """A value of a metric kind: ``time`` (ns), ``memory`` (bytes), else tokens per second."""
    if kind == "time":
        return duration(value)
    if kind == "memory":
        return bytes_(value)
    return si(value, "tok/s")

def when(ns: int) -> str:
    """A unix-epoch nanosecond time as ISO 8601 UTC, to the millisecond."""
    return datetime.fromtimestamp(ns / 1e9, tz=timezone.utc).isoformat(timespec="milliseconds")
