"""The docs say where a call's roofline peaks come from as the worker decides it, and what the
fallback WARNING and report lines do (docs/attributes.md, configuration.md, profiling.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from attnscope._derive import roofline

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _section(path: Path, start: str, end: str) -> str:
    text = " ".join(path.read_text().split())
    return text.split(start, 1)[1].split(end, 1)[0]


def _source(monkeypatch: pytest.MonkeyPatch, device: str, *, calibrated: bool,
            table: bool) -> str | None:
    """The peak source the worker writes for a call with no ``device_peaks`` configured."""
    monkeypatch.setattr(roofline, "_calibrated",
                        lambda d, t: {"tflops": 1.0, "gbps": 10.0} if calibrated else None)
    monkeypatch.setattr(roofline, "_table_peaks",
                        lambda d: roofline.device_peaks_for("NVIDIA H200") if table else None)
    attrs: dict[str, Any] = {"attnscope.flops": 10**9, "attnscope.bytes": 10**7,
                             "attnscope.wall_ns": 10**6, "attnscope.device": device,
                             "attnscope.dtype": "bfloat16"}
    roofline.add_configured(attrs)
    source = attrs.get("attnscope.roofline.peak_source")
    return None if source is None else str(source)


def test_without_configured_peaks_calibrated_then_the_table_give_a_roofline(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What the two docs must say, from the code: unconfigured is not "no roofline"."""
    assert _source(monkeypatch, "cpu", calibrated=True, table=False) == "calibrated"
    assert _source(monkeypatch, "cuda:0", calibrated=True, table=True) == "calibrated"
    assert _source(monkeypatch, "cuda:0", calibrated=False, table=True) == "table"
    assert _source(monkeypatch, "cpu", calibrated=False, table=True) is None
    attributes = _section(DOCS / "attributes.md", "### The roofline", "| attribute |")
    assert "only while peaks are configured" not in attributes
    assert "otherwise they are left out" not in attributes
    for said in ("`device_peaks`", "`attnscope calibrate`", "built-in table", "CUDA"):
        assert said in attributes, said
    row = next(line for line in (DOCS / "configuration.md").read_text().splitlines()
               if line.startswith("| `device_peaks` |"))
    assert "none: no roofline attributes" not in row
    assert "`attnscope calibrate`" in row and "built-in table" in row


def test_profiling_md_says_one_warning_per_site_and_reason_and_the_bound() -> None:
    from attnscope._derive import fallback

    text = _section(DOCS / "profiling.md", "## What to do about each fallback reason",
                    "What the usual reasons mean")
    assert "one WARNING per fallback reason" in text
    assert f"At most {fallback._WARN_SITES} site-and-reason pairs" in text
    assert "counts a row's fallbacks per reason" in text
