"""Numbers in units a person reads: durations, SI and binary prefixes, the ``kernel.top`` list.

Shared by the span summaries (:mod:`attnscope._spans.summary`) and the profile parser
(:mod:`attnscope._profiles`), which names the longest ops; imports nothing of attnscope's but the
name cap. Numbers have 3 significant digits and never print in exponent form.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._record.capture import MAX_NAME

__all__ = ["duration", "si", "flop_rate", "binary_bytes", "top_list"]

_SI = ((999.5e12, 1e15, "P"), (999.5e9, 1e12, "T"), (999.5e6, 1e9, "G"), (999.5e3, 1e6, "M"),
       (999.5, 1e3, "k"))
_BIN = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def _num(v: float) -> str:
    text = f"{v:.3g}"
    return f"{v:.0f}" if "e" in text else text


def duration(ns: float) -> str:
    """Nanoseconds in a unit: ``850 ns``, ``12.3 µs``, ``4.56 ms``, ``1.23 s``."""
    if ns >= 999.5e6:
        return f"{_num(ns / 1e9)} s"  # the one unit with no larger one: 12345 s, never 1.23e+04
    if ns >= 999.5e3:
        return f"{ns / 1e6:.3g} ms"  # below 999.5 of a unit: never an exponent
    if ns >= 999.5:
        return f"{ns / 1e3:.3g} µs"
    return f"{ns:.0f} ns"


def si(value: float, unit: str) -> str:
    """A value with an SI prefix and its unit: ``8.45 MFLOP``, ``1.69 GFLOP/s``, ``512 FLOP``."""
    magnitude = abs(value)
    for edge, scale, prefix in _SI:
        if magnitude >= edge:
            return f"{_num(value / scale)} {prefix}{unit}"
    return f"{_num(value)} {unit}"


def flop_rate(tflops: float) -> str:
    """A rate given in TFLOP/s with its prefix: ``1.69 GFLOP/s``, ``312 TFLOP/s``."""
    if tflops >= 999.5:
        return f"{_num(tflops / 1e3)} PFLOP/s"
    if tflops >= 0.9995:
        return f"{tflops:.3g} TFLOP/s"
    if tflops >= 0.9995e-3:
        return f"{tflops * 1e3:.3g} GFLOP/s"
    if tflops >= 0.9995e-6:
        return f"{tflops * 1e6:.3g} MFLOP/s"
    if tflops >= 0.9995e-9:
        return f"{tflops * 1e9:.3g} kFLOP/s"
    return f"{_num(tflops * 1e12)} FLOP/s"


def binary_bytes(n: float) -> str:
    """Bytes in KiB/MiB/GiB: ``417 KiB``, ``1.5 GiB``, ``512 B``."""
    for scale, unit in _BIN:
        if n >= scale:
            return f"{_num(n / scale)} {unit}"
    return f"{n:.0f} B"


def top_list(names: Sequence[Any], times: Sequence[Any]) -> list[str]:
    """``kernel.top``: ``kernel.top_names`` and ``kernel.top_ns`` as ``"name: time"`` entries."""
    pairs = zip(names, times, strict=False)
    return [f"{str(name)[:MAX_NAME]}: {duration(ns)}" for name, ns in pairs if type(ns) is int]
