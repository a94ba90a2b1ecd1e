"""`attnscope report`'s roofline and fallback figures against the spans' own attributes."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

import attnscope
from attnscope.cli.report import run_report


def _trace(path: Path) -> None:
    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=1.0, warmup_calls=0,
                        profile_rate=1.0, profile_max_per_minute=1000.0, overhead_budget=1.0,
                        device_peaks={"tflops": 1.0, "gbps": 20.0})
    attnscope.instrument_sdpa()
    try:
        q = torch.randn(1, 2, 64, 32)
        for _ in range(3):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
            F.scaled_dot_product_attention(q, q, q, dropout_p=0.3)
    finally:
        attnscope.uninstrument_sdpa()
        assert attnscope.shutdown(timeout_s=30.0)


def _calls(path: Path) -> dict[str, list[dict[str, Any]]]:
    """The SDPA spans' tags, per backend, read straight from the file."""
    out: dict[str, list[dict[str, Any]]] = {}
    for trace in json.loads(path.read_text())["data"]:
        for span in trace["spans"]:
            tags = {t["key"]: t["value"] for t in span["tags"]}
            if "attnscope.flops" in tags:
                out.setdefault(tags["attnscope.backend"], []).append(tags)
    return out


def test_report_roofline_and_fallbacks_are_the_spans_medians(tmp_path: Path, capsys: Any) -> None:
    trace, report = tmp_path / "t.json", tmp_path / "r.json"
    _trace(trace)
    assert run_report(trace, json_path=str(report)) == 0
    text = capsys.readouterr().out
    assert "Roofline per attention layer" in text
    assert "ran the math kernel" in text and "dropout" in text
    groups = {g["backend"]: g for g in json.loads(report.read_text())["groups"]}
    calls = _calls(trace)
    assert set(groups) == set(calls) == {"flash", "math"}
    for backend, spans in calls.items():
        r = groups[backend]["roofline"]
        assert r["calls"] == len(spans) == 3
        assert r["fraction"] == statistics.median(s["attnscope.roofline.fraction"] for s in spans)
        assert r["intensity_flop_per_byte"] == statistics.median(
            s["attnscope.arithmetic_intensity"] for s in spans)
        # the roof of each call: min(1 TFLOP/s, intensity × 20 GB/s), in TFLOP/s
        assert r["roof_tflops"] == statistics.median(
            min(1.0, s["attnscope.arithmetic_intensity"] * 20 / 1e3) for s in spans)
        assert r["bound"] == "memory" and r["peak_source"] == "configured"
    assert groups["flash"]["fallbacks"] is None
    assert groups["math"]["fallbacks"] == {
        "calls": 3, "expected": "none",
        "reason": calls["math"][0]["attnscope.backend.reason"]}
