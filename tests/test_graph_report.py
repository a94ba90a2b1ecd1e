"""`attnscope report` and `diff` on calls timed in CUDA graph replays: counted like any call, and
said to be replayed (terminal, JSON, HTML). The trace comes from the fake graph of
tests/test_graph_replay.py, written by attnscope's own Jaeger exporter."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.cli import main
from attnscope.cli.report import run_report

from .test_graph_replay import FakeGpu, Q, _capture, attention, gpu  # noqa: F401  (fixture)


def _trace(path: Path, gpu: FakeGpu, replays: int) -> None:  # noqa: F811
    """Two eager calls, then ``replays`` replays of a graph holding three calls, each read."""
    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=1.0, warmup_calls=0,
                        profile_rate=0.0, overhead_budget=1.0)
    try:
        for _ in range(2):
            attention(Q, Q, Q)
        gpu.finish_all()
        graph = _capture(gpu) if replays else None
        for _ in range(replays):
            assert graph is not None
            graph.replay()
            gpu.finish_all()
            assert attnscope.flush(timeout_s=30.0)  # read before the next replay overwrites it
    finally:
        assert attnscope.shutdown(timeout_s=30.0)


def test_report_counts_replayed_calls_and_says_so(tmp_path: Path, gpu: FakeGpu,  # noqa: F811
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    trace, page, doc = tmp_path / "t.json", tmp_path / "r.html", tmp_path / "r.json"
    _trace(trace, gpu, replays=2)
    assert run_report(trace, html=str(page), json_path=str(doc)) == 0
    out = capsys.readouterr().out
    assert "⟳ attention —: 6 of 8 calls ran in a CUDA graph replay" in out
    document = json.loads(doc.read_text())
    (group,) = document["groups"]
    assert group["calls"] == 8 and group["replayed_calls"] == 6
    assert document["overall"]["replayed_calls"] == 6
    assert {c["replayed"] for c in document["slowest"]} <= {True, False}
    html = page.read_text()
    assert "CUDA graph replays" in html and "6 of 8 calls ran in a CUDA graph replay" in html


def test_report_without_replays_says_nothing_of_them(tmp_path: Path, gpu: FakeGpu,  # noqa: F811
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    trace, doc = tmp_path / "t.json", tmp_path / "r.json"
    _trace(trace, gpu, replays=0)
    assert run_report(trace, json_path=str(doc)) == 0
    assert "⟳" not in capsys.readouterr().out
    assert json.loads(doc.read_text())["groups"][0]["replayed_calls"] == 0


def test_diff_says_which_side_ran_in_replays(tmp_path: Path, gpu: FakeGpu,  # noqa: F811
                                             capsys: pytest.CaptureFixture[str]) -> None:
    before, after = tmp_path / "b.json", tmp_path / "a.json"
    _trace(before, gpu, replays=0)
    _trace(after, gpu, replays=2)
    page, doc = tmp_path / "d.html", tmp_path / "d.json"
    code = main(["diff", str(before), str(after), "--html", str(page), "--json", str(doc)])
    out: Any = capsys.readouterr().out
    assert code == 0
    line = "⟳ attention: calls that ran in a CUDA graph replay: BEFORE 0 of 2, AFTER 6 of 8"
    assert line in out
    assert line in page.read_text()
    assert json.loads(doc.read_text())["replayed_calls"] == [
        {"module": "attention", "phase": None, "before": 0, "after": 6}]
