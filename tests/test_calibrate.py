"""attnscope calibrate: measured peaks, saved, and used by the worker's roofline."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope import _calibration
from attnscope._derive import roofline
from attnscope.cli import main
from attnscope.testing import capture_spans


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    roofline.reset_calibration()
    yield
    roofline.reset_calibration()


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["calibrate", "--n", "128", "--copy-mib", "4", "--repeats", "3", *argv]) == 0
    return capsys.readouterr().out


def test_the_printed_peaks_are_the_saved_measurements(capsys: pytest.CaptureFixture[str]) -> None:
    out = _run(capsys)
    doc = json.loads(_calibration.path().read_text())
    (key, entry), = doc["entries"].items()
    assert key == _calibration.cpu_key(torch.get_num_threads()) and key in out
    mm, cp = entry["matmul"]["float32"], entry["copy"]
    # independent: the throughputs from what was timed
    assert mm["flops"] == 2 * 128 ** 3 and mm["best_s"] == min(mm["runs_s"])
    assert len(mm["runs_s"]) == 3
    assert cp["bytes"] == 2 * 4 * (1 << 20) and cp["best_s"] == min(cp["runs_s"])
    assert entry["tflops"]["float32"] == pytest.approx(mm["flops"] / mm["best_s"] / 1e12)
    assert entry["gbps"] == pytest.approx(cp["bytes"] / cp["best_s"] / 1e9)
    tflops = float(re.search(r"-> ([\d.e+-]+) TFLOP/s", out).group(1))
    gbps = float(re.search(r"-> ([\d.e+-]+) GB/s", out).group(1))
    assert tflops == pytest.approx(entry["tflops"]["float32"], rel=1e-3)
    assert gbps == pytest.approx(entry["gbps"], rel=1e-3)
    assert "best of 3" in out and str(_calibration.path()) in out


def test_a_second_dtype_is_kept_beside_the_first(capsys: pytest.CaptureFixture[str]) -> None:
    _run(capsys)
    _run(capsys, "--dtype", "bfloat16")
    (entry,) = _calibration.load().values()
    assert set(entry["tflops"]) == {"float32", "bfloat16"}


def test_bad_devices_are_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["calibrate", "--device", "tpu"]) == 2
    assert "--device must be cpu or cuda" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert main(["calibrate", "--device", "cuda"]) == 2
        assert "no CUDA device here" in capsys.readouterr().err


@attnscope.trace
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def _spans() -> list[Any]:
    q = torch.randn(1, 2, 64, 16)
    with capture_spans() as spans:
        for _ in range(3):
            _attention(q, q, q)
    return [s for s in spans if "attnscope.flops" in s.attributes]


def test_a_cpu_call_gets_its_roofline_from_the_calibration_and_configured_peaks_win(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert all("attnscope.roofline.fraction" not in s.attributes for s in _spans())
    _run(capsys)
    roofline.reset_calibration()
    want = _calibration.peaks_for(_calibration.cpu_key(torch.get_num_threads()), "float32")
    assert want is not None
    calls = _spans()
    assert calls
    for s in calls:
        a = s.attributes
        assert a["attnscope.roofline.peak_source"] == "calibrated"
        assert a["attnscope.roofline.time_source"] == "wall_ns"
        assert a["attnscope.roofline.peak_tflops"] == want["tflops"]
        assert a["attnscope.roofline.peak_gbps"] == want["gbps"]
        roof = min(want["tflops"] * 1e12, a["attnscope.arithmetic_intensity"] * want["gbps"] * 1e9)
        achieved = a["attnscope.flops"] / (a["attnscope.wall_ns"] / 1e9)
        assert a["attnscope.roofline.fraction"] == pytest.approx(achieved / roof, rel=2e-3)
    attnscope.configure(device_peaks={"tflops": 1.0, "gbps": 10.0})
    try:
        q = torch.randn(1, 2, 64, 16)
        with capture_spans(device_peaks={"tflops": 1.0, "gbps": 10.0}) as spans:
            _attention(q, q, q)
        (call,) = [s for s in spans if "attnscope.flops" in s.attributes]
        assert call.attributes["attnscope.roofline.peak_source"] == "configured"
    finally:
        attnscope.configure(device_peaks=None)


def test_under_autocast_a_float32_call_takes_the_peak_of_autocasts_dtype(
        capsys: pytest.CaptureFixture[str]) -> None:
    # torch.autocast runs float32 inputs' SDPA in bfloat16: the call's roof is bfloat16's
    _run(capsys)
    _run(capsys, "--dtype", "bfloat16")
    roofline.reset_calibration()
    key = _calibration.cpu_key(torch.get_num_threads())
    fp32, bf16 = _calibration.peaks_for(key, "float32"), _calibration.peaks_for(key, "bfloat16")
    assert fp32 is not None and bf16 is not None and fp32["tflops"] != bf16["tflops"]
    q = torch.randn(1, 2, 64, 16)
    with capture_spans() as spans:
        _attention(q, q, q)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _attention(q, q, q)
    plain, cast = sorted((s for s in spans if "attnscope.flops" in s.attributes),
                         key=lambda s: s.start_time)
    assert plain.attributes["attnscope.dtype"] == cast.attributes["attnscope.dtype"] == "float32"
    assert "attnscope.autocast_dtype" not in plain.attributes
    assert cast.attributes["attnscope.autocast_dtype"] == "bfloat16"
    assert "fp32 (autocast bf16)" in cast.attributes["attnscope.summary"]
    assert "autocast" not in plain.attributes["attnscope.summary"]
    assert plain.attributes["attnscope.roofline.peak_tflops"] == fp32["tflops"]
    assert cast.attributes["attnscope.roofline.peak_tflops"] == bf16["tflops"]
