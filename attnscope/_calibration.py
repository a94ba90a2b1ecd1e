"""Peaks measured on this machine by ``attnscope calibrate``: where they are kept, and reading them.

One JSON file per user (``$XDG_CACHE_HOME/attnscope/peaks.json``, else ``~/.cache/...``), one
entry per device identity: a CUDA device by the name torch reports, the CPU by its model name and
the number of threads torch uses (a CPU's peaks scale with them). An entry holds the memory
bandwidth and the matmul throughput per dtype, with what was timed, so that a figure can be
checked against its measurement. The worker reads the file (:func:`peaks_for`), the command writes
it (:func:`save`). Imports no torch: the device's identity is given by the caller.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
from typing import Any

from . import _safe_files

__all__ = ["path", "cpu_key", "cuda_key", "load", "save", "peaks_for"]

_VERSION = 1


def path() -> pathlib.Path:
    """Where the calibration file lives (it may not exist)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "attnscope" / "peaks.json"


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown cpu"


def cpu_key(threads: int) -> str:
    """The CPU's identity: its model and the threads torch runs on."""
    return f"cpu/{_cpu_model()}/{threads} threads"


def cuda_key(device_name: str) -> str:
    """A CUDA device's identity: the name torch reports for it."""
    return f"cuda/{device_name}"


def load(file: pathlib.Path | None = None) -> dict[str, Any]:
    """The file's entries by device identity; {} when there is none or it cannot be read."""
    try:
        doc = json.loads((file or path()).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    entries = doc.get("entries") if isinstance(doc, dict) else None
    return entries if isinstance(entries, dict) and doc.get("version") == _VERSION else {}


def save(key: str, dtype: str, entry: dict[str, Any],
         file: pathlib.Path | None = None) -> pathlib.Path:
    """Store one measurement (``gbps``, ``tflops`` and what was timed) for ``key`` at ``dtype``,
    keeping the others; written whole to a new file, then renamed over the old one (never
    through a link: :mod:`attnscope._safe_files`)."""
    target = file or path()
    entries = load(target)
    device = entries.setdefault(key, {})
    device["gbps"] = entry["gbps"]
    device["copy"] = entry["copy"]
    device.setdefault("tflops", {})[dtype] = entry["tflops"]
    device.setdefault("matmul", {})[dtype] = entry["matmul"]
    device["measured_at"] = entry["measured_at"]
    target.parent.mkdir(parents=True, exist_ok=True)
    _safe_files.write_text(target, json.dumps({"version": _VERSION, "entries": entries},
                                              indent=1, sort_keys=True))
    return target


def peaks_for(key: str, dtype: str, entries: dict[str, Any] | None = None
              ) -> dict[str, float] | None:
    """``{"tflops", "gbps"}`` measured for ``key`` at ``dtype``; None when not calibrated."""
    device = (load() if entries is None else entries).get(key)
    if not isinstance(device, dict):
        return None
    tflops = device.get("tflops", {}).get(dtype) if isinstance(device.get("tflops"), dict) \
        else None
    gbps = device.get("gbps")
    if not isinstance(tflops, (int, float)) or not isinstance(gbps, (int, float)) \
            or tflops <= 0 or gbps <= 0:
        return None
    return {"tflops": float(tflops), "gbps": float(gbps)}
