"""Latency and rates leave out every call the profiler ran over: profiled calls, and calls timed
inside a profiled one (``attnscope.profiled_by``).

A profile that lands on a decoder layer (``attnscope run`` traces them) slows the attention call
inside it about 5x on CPU (1,851 µs against a median of 341 µs, a prefill layer of a small Llama),
and that call used to count in the layer's p99 and max, its tokens/s and ``attnscope diff``'s
time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

import attnscope
from attnscope._profiles.optree import METADATA_OPS
from attnscope.cli.diff._groups import per_call_values
from attnscope.cli.summary import latency_rows, time_ns
from attnscope.cli.traces import load_spans

from .support.helpers import traced_to_file


class _Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = torch.nn.MultiheadAttention(32, 4, batch_first=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.attn(x, x, x, need_weights=False)[0]
        return out


def _trace(tmp_path: Path) -> tuple[Path, list[Any]]:
    block = attnscope.instrument(_Block())
    x = torch.randn(2, 16, 32)
    path = tmp_path / "t.json"

    def run() -> None:
        with torch.no_grad():
            for _ in range(30):
                block(x)
            for _ in range(3):  # the profile lands on the enclosing block: the call is timed
                with attnscope.sampling(force=True, profile=True), attnscope.span("layer"):
                    block(x)

    rows = traced_to_file(path, "jaeger-json", run, profile_max_per_minute=1000)
    attnscope.uninstrument(block)
    return path, [r for r in rows if r.attributes.get("attnscope.module") == "attn"]


def test_calls_timed_inside_a_profiled_call_are_not_timed_calls(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli import main

    path, calls = _trace(tmp_path)
    inside = [r for r in calls if r.attributes.get("attnscope.profiled_by") == "enclosing"]
    alone = [r for r in calls if "attnscope.profiled_by" not in r.attributes]
    assert len(inside) == 3 and len(alone) == 30
    assert all(r.attributes["attnscope.tier"] == "timing" for r in calls)
    assert latency_rows(calls) == alone
    assert per_call_values(calls)["time"] == [float(time_ns(r)) for r in alone]

    assert main(["report", str(path), "--json", "-"]) == 0
    (group,) = [g for g in json.loads(capsys.readouterr().out)["groups"]
                if g["module"] == "attn"]
    assert group["calls"] == 33 and group["latency_calls"] == 30
    assert group["latency_of"] == "timed"
    walls = sorted(int(r.attributes["attnscope.wall_ns"]) for r in alone)
    assert group["wall_ns"]["max"] == walls[-1] and group["wall_ns"]["min"] == walls[0]


def test_the_report_says_how_many_calls_a_profile_ran_over(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli import main

    path, calls = _trace(tmp_path)
    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert "33 attention calls sampled (sample rate 1): 30 timed, 0 profiled, 3 timed inside a " \
        "profiled call." in " ".join(out.split())


def test_a_call_timed_inside_a_profiled_one_has_its_kernels_from_that_profile(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli import main
    from attnscope.cli.summary import operator_spans

    path, calls = _trace(tmp_path)
    inside = [r for r in calls if r.attributes.get("attnscope.profiled_by") == "enclosing"]
    rows = load_spans(path)
    for call in inside:
        a = call.attributes
        names, times = a["attnscope.kernel.top_names"], a["attnscope.kernel.top_ns"]
        assert names and len(names) == len(times) and times == sorted(times, reverse=True)
        assert 0 < sum(times) <= a["attnscope.kernel.total_ns"] <= a["attnscope.wall_ns"] * 1.5
        # each a CPU op that ran in it: among its operator spans from the same profile, the ops
        # merged into one of them, or the metadata ops folded into one (optree's rule)
        ran = set(METADATA_OPS)
        for op in operator_spans(rows, call):
            ran.add(op.name.split(" (", 1)[0])
            ran.update(op.attributes.get("attnscope.kernel.inner") or ())
        assert set(names) <= ran, (names, ran)
    assert all("attnscope.kernel.top_names" not in r.attributes for r in calls
               if r not in inside)  # timed on their own: no profile, no kernels
    assert main(["report", str(path), "--html", str(tmp_path / "r.html")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Top kernels/ops of the 3 calls timed inside a profiled call" in out
    # its timeline: one of those calls, its operators from the profile around it
    page = (tmp_path / "r.html").read_text()
    timeline = page[page.index("Timeline of one profiled call"):]
    timeline = timeline[:timeline.index("</section>")]
    assert "timed inside a profiled call (no attention call was profiled on its own)" in timeline
    assert "<svg" in timeline and "No profiled call with operator spans" not in timeline
