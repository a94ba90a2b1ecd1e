"""Device peaks and where one call sits under them: the roofline of a call.

Values and arithmetic on the worker (torch is read only for a CUDA device's name): a table of
accelerators' dense peaks from the vendors' datasheets, matched from the name torch reports for a
device, the peak that applies to a call's dtype, and a call's bound and fraction of its roof.

A roofline has two roofs: memory, ``intensity × peak_bw``, and compute, ``peak_flops``. They meet
at the ridge point ``peak_flops / peak_bw`` (FLOP/byte): a call below it is memory-bound, at or
above it compute-bound. Its roof is ``min(peak_flops, intensity × peak_bw)``; the fraction is the
achieved FLOP/s over that roof. Nothing here guesses: an unknown device or a dtype the device has
no peak for gives None.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Mapping
from typing import Any, NamedTuple

from .. import _calibration
from .. import _schema as schema
from .._runtime import runtime
from .result import sig4

__all__ = ["DevicePeaks", "Roofline", "add_configured", "add_to", "device_peaks_for",
           "dtype_peak_tflops", "evaluate", "reset_calibration"]

_FLOPS, _BYTES, _EXACT = schema.FLOPS.name, schema.BYTES.name, schema.EXACT.name
_DEVICE, _DTYPE = schema.DEVICE.name, schema.DTYPE.name
_AUTOCAST_DTYPE = schema.AUTOCAST_DTYPE.name
# The time a call's FLOPs and bytes are divided by, best first: the attention core's own time in
# a profile (FLOPs and bytes are the core's), then the call's device time, then its wall time.
_TIMES = tuple((a.name, a.key) for a in (schema.CORE_NS, schema.DEVICE_NS, schema.WALL_NS))


class DevicePeaks(NamedTuple):
    """Dense (not sparse) peaks of one accelerator; None: the device has no such peak."""

    name: str
    gbps: float  # memory bandwidth, GB/s (10⁹ bytes/s)
    fp32: float  # TFLOP/s, plain FP32 (no tensor-float)
    tf32: float | None
    bf16: float | None
    fp16: float | None
    fp8: float | None


# Sources (dense figures; the datasheets print sparse ones next to them, twice as large):
# - NVIDIA H100 datasheet (nvidia.com/en-us/data-center/h100, "H100 Tensor Core GPU Datasheet"):
#   SXM 67 FP32 / 494.7 TF32 / 989.4 BF16, FP16 / 1978.9 FP8, 3.35 TB/s;
#   PCIe 51 / 378 / 756 / 1513, 2.0 TB/s.
# - NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): SXM, H100 SXM's compute, 4.8 TB/s.
# - NVIDIA A100 datasheet (nvidia.com/en-us/data-center/a100): 19.5 FP32 / 156 TF32 / 312 BF16,
#   FP16, no FP8; 40GB SXM and PCIe 1555 GB/s, 80GB SXM 2039 GB/s, 80GB PCIe 1935 GB/s.
# - NVIDIA L4 datasheet: 30.3 FP32 / 60 TF32 / 121 BF16, FP16 / 242.5 FP8, 300 GB/s.
# - NVIDIA L40S datasheet: 91.6 FP32 / 183 TF32 / 362.05 BF16, FP16 / 733 FP8, 864 GB/s.
# - NVIDIA A10 datasheet: 31.2 FP32 / 62.5 TF32 / 125 BF16, FP16, 600 GB/s. The A10G (AWS's
#   part) has no vendor datasheet with these figures, so it is not matched (no guess).
# - AMD Instinct MI300X datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x):
#   163.4 FP32 (vector) / 653.7 TF32 / 1307.4 BF16, FP16 / 2614.9 FP8, 5.3 TB/s.
_H100_SXM = DevicePeaks("H100 SXM", 3350.0, 67.0, 494.7, 989.4, 989.4, 1978.9)
_H100_PCIE = DevicePeaks("H100 PCIe", 2000.0, 51.0, 378.0, 756.0, 756.0, 1513.0)
_H200 = DevicePeaks("H200 SXM", 4800.0, 67.0, 494.7, 989.4, 989.4, 1978.9)
_A100_40 = DevicePeaks("A100 40GB", 1555.0, 19.5, 156.0, 312.0, 312.0, None)
_A100_80_SXM = DevicePeaks("A100 80GB SXM", 2039.0, 19.5, 156.0, 312.0, 312.0, None)
_A100_80_PCIE = DevicePeaks("A100 80GB PCIe", 1935.0, 19.5, 156.0, 312.0, 312.0, None)
_L4 = DevicePeaks("L4", 300.0, 30.3, 60.0, 121.0, 121.0, 242.5)
_L40S = DevicePeaks("L40S", 864.0, 91.6, 183.0, 362.05, 362.05, 733.0)
_A10 = DevicePeaks("A10", 600.0, 31.2, 62.5, 125.0, 125.0, None)
_MI300X = DevicePeaks("MI300X", 5300.0, 163.4, 653.7, 1307.4, 1307.4, 2614.9)


def device_peaks_for(device_name: str) -> DevicePeaks | None:
    """The table's entry for a device name as torch reports it, e.g. ``NVIDIA H100 80GB HBM3``.

    None for a device the table does not hold, or a name that does not say which variant it is
    (an H100 NVL, an A100 without its memory size): a near match would be a guess.
    """
    words = device_name.upper().replace("-", " ").replace("_", " ").split()
    has = words.__contains__
    if has("MI300X"):
        return _MI300X
    if has("H200"):
        return _H200 if not has("NVL") else None  # H200 NVL: lower clocks, other figures
    if has("H100"):
        if has("NVL"):
            return None
        if has("PCIE"):
            return _H100_PCIE
        # The SXM part reports "NVIDIA H100 80GB HBM3"; the PCIe part always says PCIe.
        return _H100_SXM if (has("SXM5") or has("HBM3")) else None
    if has("A100"):
        if has("40GB"):
            return _A100_40
        if has("80GB"):
            return _A100_80_PCIE if has("PCIE") else _A100_80_SXM
        return None
    if has("L40S"):
        return _L40S
    if has("L4"):
        return _L4
    if has("A10"):
        return _A10
    return None


def dtype_peak_tflops(peaks: DevicePeaks, dtype: str, *, tf32: bool = False) -> float | None:
    """The peak for a call's dtype (``str(dtype)`` without ``torch.``): float32 is plain FP32
    unless ``tf32`` (torch's matmul precision is ``high``/``medium``: tensor-float matmuls)."""
    if dtype in ("bfloat16",):
        return peaks.bf16
    if dtype in ("float16", "half"):
        return peaks.fp16
    if dtype in ("float32", "float"):
        return peaks.tf32 if tf32 else peaks.fp32
    if dtype.startswith("float8_"):
        return peaks.fp8
    return None


class Roofline(NamedTuple):
    """One call under its roofs."""

    achieved_flops_per_s: float
    achieved_bytes_per_s: float
    ridge: float  # FLOP/byte where the two roofs meet
    roof_flops_per_s: float  # min(peak_flops, intensity × peak_bw)
    bound: str  # "memory" or "compute"
    fraction: float  # achieved ÷ roof


def evaluate(flops: int, bytes_moved: int, seconds: float, peak_tflops: float,
             peak_gbps: float) -> Roofline | None:
    """A call of ``flops`` and ``bytes_moved`` that took ``seconds`` under the given peaks.

    None when a figure is missing its sense (no bytes, no time, no peak): no ratio is made up.
    """
    if flops <= 0 or bytes_moved <= 0 or not seconds > 0 or not peak_tflops > 0 \
            or not peak_gbps > 0:
        return None
    peak_flops = peak_tflops * 1e12
    peak_bw = peak_gbps * 1e9
    intensity = flops / bytes_moved
    ridge = peak_flops / peak_bw
    roof = min(peak_flops, intensity * peak_bw)
    achieved = flops / seconds
    return Roofline(achieved, bytes_moved / seconds, ridge, roof,
                    "memory" if intensity < ridge else "compute", achieved / roof)


def add_to(attrs: dict[str, Any], peaks: Mapping[str, float] | None, source: str) -> None:
    """Add the roofline attributes of one call span under ``peaks`` (``{"tflops", "gbps"}``).

    Only where FLOPs and bytes are exact and peaks are known: otherwise nothing is added.
    """
    if peaks is None:
        return
    flops, moved = attrs.get(_FLOPS), attrs.get(_BYTES)
    if not isinstance(flops, int) or not isinstance(moved, int) or attrs.get(_EXACT) is False:
        return
    timed = next(((attrs[name], label) for name, label in _TIMES
                  if isinstance(attrs.get(name), int) and attrs[name] > 0), None)
    if timed is None:
        return
    ns, label = timed
    r = evaluate(flops, moved, ns / 1e9, peaks["tflops"], peaks["gbps"])
    if r is None:
        return
    attrs[schema.ROOFLINE_ACHIEVED_TFLOPS.name] = sig4(r.achieved_flops_per_s / 1e12)
    attrs[schema.ROOFLINE_ACHIEVED_GBPS.name] = sig4(r.achieved_bytes_per_s / 1e9)
    attrs[schema.ROOFLINE_TIME_SOURCE.name] = label
    attrs[schema.ROOFLINE_BOUND.name] = r.bound
    attrs[schema.ROOFLINE_FRACTION.name] = sig4(r.fraction)
    attrs[schema.ROOFLINE_PEAK_TFLOPS.name] = peaks["tflops"]
    attrs[schema.ROOFLINE_PEAK_GBPS.name] = peaks["gbps"]
    attrs[schema.ROOFLINE_PEAK_SOURCE.name] = source


def add_configured(attrs: dict[str, Any]) -> None:
    """:func:`add_to` under the ``device_peaks`` setting in force (read per span, on the worker);
    without it, the peaks ``attnscope calibrate`` measured for the call's device and dtype
    (``peak_source=calibrated``); else a CUDA call's device from the table (``table``), at its
    dtype's peak. The dtype is autocast's for float32 inputs under ``torch.autocast``
    (``attnscope.autocast_dtype``): the dtype their matmuls ran in. Otherwise nothing is added."""
    cfg = runtime.config.current
    configured = cfg.device_peaks if cfg is not None else None
    if configured is not None:
        add_to(attrs, configured, "configured")
        return
    device, dtype = attrs.get(_DEVICE), attrs.get(_DTYPE)
    if not isinstance(device, str) or not isinstance(dtype, str):
        return
    autocast = attrs.get(_AUTOCAST_DTYPE)
    if dtype == "float32" and isinstance(autocast, str):  # autocast casts float32 inputs only
        dtype = autocast
    measured = _calibrated(device, dtype)
    if measured is not None:
        add_to(attrs, measured, "calibrated")
        return
    if not device.startswith("cuda"):
        return
    peaks = _table_peaks(device)
    if peaks is None:
        return
    tflops = dtype_peak_tflops(peaks, dtype, tf32=_tf32())
    if tflops is not None:
        add_to(attrs, {"tflops": tflops, "gbps": peaks.gbps}, "table")


class _Calibration:
    """The calibration file's entries, read at most once per ``_RELOAD_S`` (a file written by
    ``attnscope calibrate`` meanwhile is seen by then), and each call device's identity."""

    def __init__(self) -> None:
        self.entries: dict[str, Any] = {}
        self.read_at = -_RELOAD_S
        self.keys: dict[str, str | None] = {}


_RELOAD_S = 5.0
_calibration_state = _Calibration()


def reset_calibration() -> None:
    """Forget what was read (tests; a process that changed its thread count)."""
    c = _calibration_state
    c.entries, c.read_at, c.keys = {}, -_RELOAD_S, {}


def _calibrated(device: str, dtype: str) -> dict[str, float] | None:
    c = _calibration_state
    now = time.monotonic()
    if now - c.read_at >= _RELOAD_S:
        c.entries, c.read_at = _calibration.load(), now
    if not c.entries:
        return None
    if device not in c.keys:
        c.keys[device] = _device_key(device)
    key = c.keys[device]
    return None if key is None else _calibration.peaks_for(key, dtype, c.entries)


def _device_key(device: str) -> str | None:
    """The calibration identity of a call's device (torch read on the worker)."""
    try:
        import torch

        if device == "cpu":
            return _calibration.cpu_key(torch.get_num_threads())
        if device.startswith("cuda"):
            return _calibration.cuda_key(torch.cuda.get_device_name(torch.device(device)))
    except Exception:  # noqa: BLE001 - no identity, no calibrated peaks: never a guess
        pass
    return None


@functools.lru_cache(maxsize=16)
def _table_peaks(device: str) -> DevicePeaks | None:
    """The table's entry for a CUDA device (``cuda:1``), by the name torch reports: read once
    per device, on the worker (the calling thread's call already initialised CUDA)."""
    try:
        import torch

        return device_peaks_for(torch.cuda.get_device_name(torch.device(device)))
    except Exception:  # noqa: BLE001 - no name, no peaks: never a guess
        return None


def _tf32() -> bool:
    """float32 matmuls on tensor-float cores: torch's matmul precision below ``highest``."""
    try:
        import torch

        return torch.get_float32_matmul_precision() != "highest"
    except Exception:  # noqa: BLE001
        return False
