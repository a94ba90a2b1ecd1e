"""`attnscope report`'s roofline and fallback figures against the spans' own attributes."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope.cli.report import run_report
from attnscope.cli.traces import SpanRow
from tests.support.browser import dom_of


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
        # each call's figures from its exact FLOPs, bytes and time (the spans' own are rounded)
        mine = []
        for s in spans:
            ns = s["attnscope." + s["attnscope.roofline.time_source"]]
            intensity = s["attnscope.flops"] / s["attnscope.bytes"]
            achieved = s["attnscope.flops"] / ns / 1e3
            roof = min(1.0, intensity * 20 / 1e3)  # min(1 TFLOP/s, intensity × 20 GB/s)
            mine.append((intensity, achieved, roof, achieved / roof))
            # the same figures the worker rounded to 4 digits
            assert s["attnscope.arithmetic_intensity"] == pytest.approx(intensity, rel=5e-4)
            assert s["attnscope.roofline.achieved_tflops"] == pytest.approx(achieved, rel=5e-4)
            assert s["attnscope.roofline.fraction"] == pytest.approx(achieved / roof, rel=5e-4)
        for i, key in enumerate(("intensity_flop_per_byte", "achieved_tflops", "roof_tflops",
                                 "fraction")):
            assert r[key] == pytest.approx(statistics.median(m[i] for m in mine), rel=1e-12)
        assert r["bound"] == "memory" and r["peak_source"] == "configured"
    assert groups["flash"]["fallbacks"] is None
    assert groups["math"]["fallbacks"] == {
        "calls": 3, "expected": "none",
        "reason": calls["math"][0]["attnscope.backend.reason"]}


def test_a_calls_roofline_figures_are_rounded_once() -> None:
    """1,234,549 FLOPs in 1 µs: 1.234549 TFLOP/s, which the span holds as 1.235 (4 digits); the
    report's 3 digits say 1.23 T (from the exact figures), not 1.24 (rounding 1.235 again)."""
    from attnscope.cli.render.units import si
    from attnscope.cli.roofline import roofline_of

    a = {"attnscope.flops": 1_234_549, "attnscope.bytes": 1_000, "attnscope.wall_ns": 1_000,
         "attnscope.arithmetic_intensity": 1235.0, "attnscope.roofline.achieved_tflops": 1.235,
         "attnscope.roofline.fraction": 0.001235, "attnscope.roofline.time_source": "wall_ns",
         "attnscope.roofline.peak_tflops": 1000.0, "attnscope.roofline.peak_gbps": 2000.0}
    row = SpanRow("a" * 32, "1" * 16, None, "Attention.forward", 0, 1000, a, "svc")
    r = roofline_of([row])
    assert r is not None
    assert r.intensity == 1234.549 and r.achieved_tflops == pytest.approx(1.234549, rel=1e-12)
    assert r.fraction == pytest.approx(1.234549 / 1000.0, rel=1e-12)
    assert si(r.achieved_tflops * 1e12, "FLOP/s") == "1.23 T FLOP/s"
    assert f"{r.intensity:.3g}" == "1.23e+03"
    # without the bytes, the span's own (rounded) figures
    del a["attnscope.bytes"]
    r = roofline_of([row])
    assert r is not None and (r.intensity, r.achieved_tflops) == (1235.0, 1.235)


# -- the HTML page's roofline plot, from synthetic spans with every figure known ----------------

def _call(n: int, module: str, phase: str, intensity: float, achieved: float, wall: int,
          peaks: tuple[float, float] | None = (100.0, 2000.0)) -> SpanRow:
    a: dict[str, Any] = {"attnscope.tier": "timing", "attnscope.module": module,
                         "attnscope.phase": phase, "attnscope.wall_ns": wall,
                         "attnscope.flops": 10 ** 9, "attnscope.num_heads": 4,
                         "attnscope.sample_rate": 1.0}
    if peaks is not None:
        roof = min(peaks[0], intensity * peaks[1] / 1e3)
        a |= {"attnscope.arithmetic_intensity": intensity,
              "attnscope.roofline.achieved_tflops": achieved,
              "attnscope.roofline.fraction": achieved / roof,
              "attnscope.roofline.peak_tflops": peaks[0], "attnscope.roofline.peak_gbps": peaks[1],
              "attnscope.roofline.peak_source": "configured", "attnscope.roofline.time_source":
              "wall_ns", "attnscope.roofline.bound": "memory" if roof < peaks[0] else "compute"}
    return SpanRow("a" * 32, f"{n:016x}", None, "Attention.forward", 1000 * n,
                   1000 * n + wall, a, "svc")


def _synthetic() -> list[SpanRow]:
    rows, n = [], 0
    for layer in range(3):
        for i in range(3):
            for phase, intensity, achieved, wall in (("prefill", 300.0, 40.0, 900_000),
                                                     ("decode", 1.5, 1.2, 50_000)):
                n += 1
                rows.append(_call(n, f"layers.{layer}.attn", phase,
                                  intensity * (1 + layer / 5) + i, achieved / (1 + layer) - i / 10,
                                  wall + 1000 * i * layer))
    # another dtype's peaks on one layer's prefill: a second roof
    rows.append(_call(n + 1, "layers.0.attn", "prefill", 310.0, 30.0, 800_000, (50.0, 2000.0)))
    return rows


def test_the_html_roofline_plots_each_rows_medians_under_the_spans_roofs() -> None:
    from attnscope.cli.report._roofline_plot import roofline_figure, roofline_points
    from attnscope.cli.roofline import roofs_of
    from attnscope.cli.summary import summarize
    from attnscope.cli.traces import attention_calls

    rows = _synthetic()
    calls = attention_calls(rows)
    points = roofline_points(summarize(calls, top=5, rows=rows), calls)
    by_row: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for r in rows:
        by_row.setdefault((r.attributes["attnscope.module"], r.attributes["attnscope.phase"]),
                          []).append(dict(r.attributes))
    total = sum(a["attnscope.wall_ns"] for r in by_row.values() for a in r)
    want = {key: (statistics.median(a["attnscope.arithmetic_intensity"] for a in attrs),
                  statistics.median(a["attnscope.roofline.achieved_tflops"] for a in attrs),
                  sum(a["attnscope.wall_ns"] for a in attrs) / total)
            for key, attrs in by_row.items()}
    got = {(p.label, p.phase): (p.stats.intensity, p.stats.achieved_tflops, p.share)
           for p in points}
    assert set(got) == set(want)
    for key, figures in got.items():
        assert figures == pytest.approx(want[key]), key
    roofs = roofs_of(calls)
    assert [(r.peak_tflops, r.peak_gbps, r.calls) for r in roofs] == [(100.0, 2000.0, 18),
                                                                       (50.0, 2000.0, 1)]
    fig = roofline_figure(points, roofs)
    (ax,) = fig.axes
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    plotted = [float(v) for c in ax.collections for v in c.get_offsets()[0]]
    assert plotted == pytest.approx([v for p in points for v in want[(p.label, p.phase)][:2]])
    labels = sorted(t.get_text() for t in ax.texts if not t.get_text().startswith("ridge"))
    assert labels == sorted(f"{m} · {ph}" for m, ph in by_row)
    for line, (peak_t, peak_g) in zip(ax.get_lines(), ((100.0, 2000.0), (50.0, 2000.0)),
                                      strict=True):
        xs, ys = line.get_xdata(), line.get_ydata()
        assert list(ys) == pytest.approx([min(peak_t, x * peak_g / 1e3) for x in xs])
        assert peak_t * 1e3 / peak_g in list(xs)  # the ridge: 50 and 25 FLOP/B
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["roof: 100 TFLOP/s, 2 TB/s (configured; 18 calls)",
                      "roof: 50 TFLOP/s, 2 TB/s (configured; 1 calls)", "prefill", "decode"]


def test_the_html_page_has_the_roofline_plot_or_says_why_not(tmp_path: Path) -> None:
    from attnscope.cli.report._html import render_html
    from attnscope.cli.summary import summarize
    from attnscope.cli.traces import attention_calls

    for rows, plotted in ((_synthetic(), True),
                          ([_call(1, "layers.0.attn", "decode", 1.0, 1.0, 10, None)], False)):
        calls = attention_calls(rows)
        text = render_html(summarize(calls, top=5, rows=rows), rows, source="t", top=5)
        section = text.split("<h2>Roofline per attention layer</h2>", 1)[1].split("</section>")[0]
        assert ("<svg" in section) is plotted
        assert ("No call in this trace carries device peaks" in section) is not plotted
        if plotted:
            assert "source: configured" in section and "wall_ns on 19" in section
            page = tmp_path / "roof.html"
            page.write_text(text)
            assert "Roofline per attention layer" in dom_of(page)
