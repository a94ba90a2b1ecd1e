"""The roofline arithmetic and the device-peak table (attnscope/_derive/roofline.py)."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._derive import roofline
from attnscope._derive.roofline import device_peaks_for, dtype_peak_tflops, evaluate
from attnscope.testing import capture_spans
from tests.support.helpers import attrs


@pytest.mark.parametrize(("name", "expected"), [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H200", "H200 SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100-PCIE-40GB", "A100 40GB"),
    ("NVIDIA A100-SXM4-80GB", "A100 80GB SXM"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),
    ("NVIDIA A10", "A10"),
    ("AMD Instinct MI300X", "MI300X"),
])
def test_known_device_names_match(name: str, expected: str) -> None:
    peaks = device_peaks_for(name)
    assert peaks is not None and peaks.name == expected


@pytest.mark.parametrize("name", [
    "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A100", "NVIDIA L40", "NVIDIA A10G",
    "NVIDIA GeForce RTX 4090", "Tesla T4", "", "NVIDIA H100",
])
def test_unknown_or_ambiguous_names_give_none(name: str) -> None:
    assert device_peaks_for(name) is None


def test_dtype_peaks_are_the_dense_datasheet_figures() -> None:
    h100 = device_peaks_for("NVIDIA H100 80GB HBM3")
    assert h100 is not None
    assert dtype_peak_tflops(h100, "bfloat16") == 989.4
    assert dtype_peak_tflops(h100, "float16") == 989.4
    assert dtype_peak_tflops(h100, "float8_e4m3fn") == 1978.9
    assert dtype_peak_tflops(h100, "float32") == 67.0
    assert dtype_peak_tflops(h100, "float32", tf32=True) == 494.7
    assert dtype_peak_tflops(h100, "float64") is None
    a100 = device_peaks_for("NVIDIA A100-SXM4-80GB")
    assert a100 is not None and dtype_peak_tflops(a100, "float8_e5m2") is None
    assert a100.gbps == 2039.0


def test_memory_bound_by_hand() -> None:
    # Peaks 100 TFLOP/s, 1000 GB/s: ridge 100 FLOP/B. Intensity 10: memory roof 10 TFLOP/s.
    # 1e9 FLOPs over 1e8 bytes in 200 µs: 5 TFLOP/s achieved, 0.5 of the roof.
    r = evaluate(10**9, 10**8, 200e-6, 100.0, 1000.0)
    assert r is not None
    assert r.ridge == pytest.approx(100.0)
    assert r.bound == "memory"
    assert r.roof_flops_per_s == pytest.approx(1e13)
    assert r.achieved_flops_per_s == pytest.approx(5e12)
    assert r.achieved_bytes_per_s == pytest.approx(5e11)
    assert r.fraction == pytest.approx(0.5)


def test_compute_bound_by_hand() -> None:
    # Intensity 1000 > ridge 100: roof is the 100 TFLOP/s peak. 1e12 FLOPs in 40 ms: 25 TFLOP/s.
    r = evaluate(10**12, 10**9, 0.04, 100.0, 1000.0)
    assert r is not None
    assert r.bound == "compute"
    assert r.roof_flops_per_s == pytest.approx(1e14)
    assert r.fraction == pytest.approx(0.25)


def test_ridge_point_itself_is_compute_bound_and_just_below_is_memory() -> None:
    at = evaluate(100 * 10**6, 10**6, 1e-3, 100.0, 1000.0)
    below = evaluate(100 * 10**6 - 1, 10**6, 1e-3, 100.0, 1000.0)
    assert at is not None and at.bound == "compute"
    assert below is not None and below.bound == "memory"


@pytest.mark.parametrize("args", [
    (0, 10, 1.0, 1.0, 1.0), (10, 0, 1.0, 1.0, 1.0), (10, 10, 0.0, 1.0, 1.0),
    (10, 10, float("nan"), 1.0, 1.0), (10, 10, 1.0, 0.0, 1.0), (10, 10, 1.0, 1.0, -1.0),
])
def test_missing_figures_give_none(args: tuple[int, int, float, float, float]) -> None:
    assert evaluate(*args) is None



_PEAKS = {"tflops": 100.0, "gbps": 1000.0}


def _span_attrs(**extra: object) -> dict[str, object]:
    base: dict[str, object] = {"attnscope.flops": 10**9, "attnscope.bytes": 10**8,
                               "attnscope.wall_ns": 400_000}
    base.update(extra)
    return base


def test_span_attributes_by_hand_prefer_core_then_device_then_wall() -> None:
    a = _span_attrs(**{"attnscope.device_ns": 300_000, "attnscope.core_ns": 200_000})
    roofline.add_to(a, _PEAKS, "configured")
    assert a["attnscope.roofline.time_source"] == "core_ns"
    assert a["attnscope.roofline.achieved_tflops"] == pytest.approx(5.0)
    assert a["attnscope.roofline.achieved_gbps"] == pytest.approx(500.0)
    assert a["attnscope.roofline.bound"] == "memory"
    assert a["attnscope.roofline.fraction"] == pytest.approx(0.5)
    assert (a["attnscope.roofline.peak_tflops"], a["attnscope.roofline.peak_gbps"],
            a["attnscope.roofline.peak_source"]) == (100.0, 1000.0, "configured")
    b = _span_attrs(**{"attnscope.device_ns": 250_000})
    roofline.add_to(b, _PEAKS, "configured")
    assert b["attnscope.roofline.time_source"] == "device_ns"
    assert b["attnscope.roofline.fraction"] == pytest.approx(0.4)
    c = _span_attrs()
    roofline.add_to(c, _PEAKS, "configured")
    assert c["attnscope.roofline.time_source"] == "wall_ns"
    assert c["attnscope.roofline.fraction"] == pytest.approx(0.25)


@pytest.mark.parametrize("attrs", [
    _span_attrs(**{"attnscope.exact": False}),
    {"attnscope.flops": 10**9, "attnscope.wall_ns": 1000},  # no bytes
    {"attnscope.bytes": 10**9, "attnscope.wall_ns": 1000},  # no FLOPs
    {"attnscope.flops": 10**9, "attnscope.bytes": 10**8},  # no time
])
def test_span_without_exact_figures_gets_no_roofline(attrs: dict[str, object]) -> None:
    before = dict(attrs)
    roofline.add_to(attrs, _PEAKS, "configured")
    assert attrs == before


def test_span_without_peaks_gets_no_roofline() -> None:
    a = _span_attrs()
    roofline.add_to(a, None, "configured")
    assert not any(k.startswith("attnscope.roofline.") for k in a)


@attnscope.trace
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_real_call_with_configured_peaks() -> None:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 16, 8, generator=g) for _ in range(3))
    with capture_spans(device_peaks={"tflops": 0.5, "gbps": 20.0}) as spans:
        _attention(q, k, v)
    (span,) = spans
    a = attrs(span)
    flops, moved, wall = a["attnscope.flops"], a["attnscope.bytes"], a["attnscope.wall_ns"]
    # independently: achieved FLOP/s over min(peak, intensity × bandwidth), from the span's figures
    achieved = flops / (wall / 1e9)
    roof = min(0.5e12, flops / moved * 20e9)
    assert a["attnscope.roofline.time_source"] == "wall_ns"
    assert a["attnscope.roofline.fraction"] == pytest.approx(achieved / roof, rel=1e-3)
    ridge = 0.5e12 / 20e9
    assert a["attnscope.roofline.bound"] == ("memory" if flops / moved < ridge else "compute")
    assert a["attnscope.roofline.peak_source"] == "configured"
    with capture_spans() as plain:
        _attention(q, k, v)
    assert not any(k.startswith("attnscope.roofline.") for k in attrs(plain[0]))


def test_fraction_histogram_per_module_class_and_phase() -> None:
    from types import SimpleNamespace

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from attnscope._export import metrics as _metrics

    reader = InMemoryMetricReader()
    record = _metrics._instruments_for(MeterProvider(metric_readers=[reader])).record
    base = {"attnscope.wall_ns": 1000, "attnscope.module_class": "LlamaAttention"}
    record(SimpleNamespace(name="a", attrs={**base, "attnscope.phase": "decode",
                                            "attnscope.roofline.fraction": 0.25}))
    record(SimpleNamespace(name="a", attrs={**base, "attnscope.phase": "decode",
                                            "attnscope.roofline.fraction": 0.5}))
    record(SimpleNamespace(name="a", attrs={**base, "attnscope.phase": "prefill"}))  # none
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "attnscope.attention.roofline_fraction" for p in m.data.data_points]
    (point,) = points
    assert point.count == 2 and point.sum == pytest.approx(0.75)
    assert dict(point.attributes) == {"attnscope.module_class": "LlamaAttention",
                                      "attnscope.phase": "decode"}


@pytest.mark.parametrize(("name", "dtype", "precision", "tflops", "gbps"), [
    ("NVIDIA H100 80GB HBM3", "bfloat16", "highest", 989.4, 3350.0),
    ("NVIDIA H200", "float16", "highest", 989.4, 4800.0),
    ("NVIDIA A100-SXM4-80GB", "float32", "highest", 19.5, 2039.0),
    ("NVIDIA A100-SXM4-80GB", "float32", "high", 156.0, 2039.0),  # TF32 matmuls
    ("NVIDIA A10G", "bfloat16", "highest", None, None),  # not in the table: no roofline
])
def test_a_cuda_call_takes_its_devices_peaks_from_the_table(
        monkeypatch: pytest.MonkeyPatch, name: str, dtype: str, precision: str,
        tflops: float | None, gbps: float | None) -> None:
    _roofline = roofline
    _roofline._table_peaks.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    monkeypatch.setattr(torch, "get_float32_matmul_precision", lambda: precision)
    try:
        attrs: dict[str, Any] = {"attnscope.flops": 10**9, "attnscope.bytes": 10**7,
                                 "attnscope.wall_ns": 10**6, "attnscope.device": "cuda:0",
                                 "attnscope.dtype": dtype}
        _roofline.add_configured(attrs)
    finally:
        _roofline._table_peaks.cache_clear()
    if tflops is None:
        assert not any(k.startswith("attnscope.roofline.") for k in attrs)
        return
    assert attrs["attnscope.roofline.peak_source"] == "table"
    assert attrs["attnscope.roofline.peak_tflops"] == tflops
    assert attrs["attnscope.roofline.peak_gbps"] == gbps
    # 1 TFLOP/s achieved at intensity 100 FLOP/B: the roof is min(peak, 100 × bandwidth)
    roof = min(tflops * 1e12, 100 * gbps * 1e9)
    assert attrs["attnscope.roofline.fraction"] == pytest.approx(1e12 / roof, rel=1e-3)


def test_a_cpu_call_without_configured_peaks_gets_no_roofline() -> None:
    attrs: dict[str, Any] = {"attnscope.flops": 10**9, "attnscope.bytes": 10**7,
                             "attnscope.wall_ns": 10**6, "attnscope.device": "cpu",
                             "attnscope.dtype": "float32"}
    roofline.add_configured(attrs)
    assert not any(k.startswith("attnscope.roofline.") for k in attrs)
