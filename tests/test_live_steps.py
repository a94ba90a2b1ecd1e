"""One trace per declared step across the ranks of a job (docs/live.md).

In-process tests pose as rank 0 and rank 1 with ``RANK``/``WORLD_SIZE``; the last one runs a real
``torchrun --nproc-per-node 2`` job on CPU (gloo, an all-reduce per step) and merges the ranks'
Jaeger JSON files.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import attnscope
from attnscope import _api, _dist
from attnscope.exporters import merge_jaeger_json
from attnscope.testing import capture_spans
from attnscope.worker.steps import RANK_NAME, ROOT_NAME, step_ids

ROOT = Path(__file__).resolve().parents[1]


@attnscope.trace
def layer(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _run_steps(exporter: InMemorySpanExporter, steps: int = 2, calls: int = 2,
               **settings: Any) -> list[ReadableSpan]:
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, profile_rate=0.0,
                        overhead_budget=1.0,
                        **settings)
    for step in range(steps):
        attnscope.step(step)
        for _ in range(calls):
            layer(torch.ones(2))
    attnscope.step(None)
    assert attnscope.shutdown(timeout_s=10.0)
    return list(exporter.get_finished_spans())


def _by_name(spans: list[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_ids_are_a_function_of_run_step_and_rank() -> None:
    trace0, root0, rank0 = step_ids("job", 7, 0)
    trace1, root1, rank1 = step_ids("job", 7, 1)
    assert (trace0, root0) == (trace1, root1)  # every rank computes the same trace and root
    assert rank0 != rank1
    assert step_ids("job", 7, 0) == (trace0, root0, rank0)
    assert step_ids("job", 8, 0)[0] != trace0
    assert step_ids("other-job", 7, 0)[0] != trace0
    assert 0 < trace0 < 2**128 and 0 < root0 < 2**64 and 0 < rank0 < 2**64


def test_rank0_emits_root_rank_span_and_calls_under_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    spans = _run_steps(InMemorySpanExporter(), run_id="job-a")
    for step in range(2):
        trace_id, root_id, rank_id = step_ids("job-a", step, 0)
        in_trace = [s for s in spans if s.context.trace_id == trace_id]
        (root,) = _by_name(in_trace, ROOT_NAME)
        (rank,) = _by_name(in_trace, RANK_NAME)
        calls = _by_name(in_trace, "layer")
        assert root.context.span_id == root_id and root.parent is None
        assert rank.context.span_id == rank_id and rank.parent is not None
        assert rank.parent.span_id == root_id
        assert len(calls) == 2 and all(c.parent and c.parent.span_id == rank_id for c in calls)
        assert dict(root.attributes or {}) == {"attnscope.step": step, "attnscope.world_size": 2,
                                               "attnscope.run_id": "job-a"}
        attrs = dict(rank.attributes or {})
        assert attrs["attnscope.rank"] == 0 and attrs["attnscope.world_size"] == 2
        assert attrs["attnscope.step"] == step and attrs["host.name"] == _dist.host()
        # the step spans cover the rank's sampled calls of the step
        assert rank.start_time == min(c.start_time or 0 for c in calls) == root.start_time
        assert rank.end_time == max(c.end_time or 0 for c in calls) == root.end_time
    assert len(spans) == 2 * 4


def test_other_ranks_hang_under_the_same_root_without_emitting_it(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    spans = _run_steps(InMemorySpanExporter(), steps=1, run_id="job-a")
    trace_id, root_id, rank_id = step_ids("job-a", 0, 1)
    assert not _by_name(spans, ROOT_NAME)
    (rank,) = _by_name(spans, RANK_NAME)
    assert rank.context.trace_id == trace_id and rank.context.span_id == rank_id
    assert rank.parent is not None and rank.parent.span_id == root_id
    assert dict(rank.attributes or {})["attnscope.rank"] == 1


def test_torchrun_run_id_and_restart_count(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    assert _dist.run_id() == "abc/2"
    assert _dist.run_id("mine") == "mine"  # the setting wins
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "none")  # torchrun's default on several nodes
    assert _dist.run_id() is None
    monkeypatch.delenv("TORCHELASTIC_RUN_ID")
    assert _dist.run_id() is None
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    spans = _run_steps(InMemorySpanExporter(), steps=1, calls=1)
    assert {s.context.trace_id for s in spans} == {step_ids("abc/2", 0, 0)[0]}


def test_run_id_setting_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="run_id"):
        attnscope.configure(run_id="")
    with pytest.raises(ValueError, match="run_id"):
        attnscope.configure(run_id=3)
    assert attnscope.configure(run_id="r-1").run_id == "r-1"
    monkeypatch.setenv("ATTNSCOPE_RUN_ID", "from-env")
    assert attnscope._config.from_env().run_id == "from-env"


def test_without_a_run_id_each_step_is_still_one_trace() -> None:
    spans = _run_steps(InMemorySpanExporter(), steps=2, calls=2)
    traces = {s.context.trace_id for s in spans}
    assert len(traces) == 2
    for trace_id in traces:
        names = sorted(s.name for s in spans if s.context.trace_id == trace_id)
        assert names == sorted([ROOT_NAME, RANK_NAME, "layer", "layer"])


def test_calls_outside_a_step_and_under_an_app_span_keep_their_own_traces() -> None:
    with capture_spans(sample_rate=1.0, warmup_calls=0, profile_rate=0.0,
                       run_id="job-b") as spans:
        tracer = otel_trace.get_tracer("app", tracer_provider=_api.current().tracer_provider)
        layer(torch.ones(1))  # no step: a trace of its own
        attnscope.step(0)
        with tracer.start_as_current_span("request") as request:
            layer(torch.ones(1))  # the application's parent wins
        layer(torch.ones(1))
        attnscope.step(None)
        layer(torch.ones(1))  # no step again: closes step 0
    trace_id, root_id, _ = step_ids("job-b", 0, 0)
    calls = _by_name(spans, "layer")
    assert len(calls) == 4
    app = request.get_span_context()
    assert calls[1].parent is not None and calls[1].parent.span_id == app.span_id
    assert calls[1].context.trace_id == app.trace_id
    assert [c.context.trace_id == trace_id for c in calls] == [False, False, True, False]
    # The application's provider picks span ids itself: the rank span is its own span under the
    # step root's id, and no root is emitted (docs/live.md).
    (rank,) = _by_name(spans, RANK_NAME)
    assert calls[2].parent is not None and calls[2].parent.span_id == rank.context.span_id
    assert rank.context.trace_id == trace_id
    assert rank.parent is not None and rank.parent.span_id == root_id
    assert not _by_name(spans, ROOT_NAME)


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
    env["OMP_NUM_THREADS"] = "1"
    env.pop("TORCHELASTIC_RUN_ID", None)
    return env


@pytest.mark.slow
def test_torchrun_two_ranks_one_trace_per_step(tmp_path: Path) -> None:
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    steps = 3
    proc = subprocess.run(
        [str(torchrun), "--standalone", "--nproc-per-node", "2",
         str(ROOT / "tests" / "live_steps_job.py"), str(tmp_path), str(steps)],
        capture_output=True, text=True, timeout=240, env=_clean_env(), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("shutdown ok True") == 2, proc.stderr[-4000:]
    files = [tmp_path / "trace.rank0.json", tmp_path / "trace.rank1.json"]
    merged = tmp_path / "merged.json"
    assert merge_jaeger_json(merged, files) == steps
    document = json.loads(merged.read_text())
    for trace in document["data"]:
        spans = trace["spans"]
        by_id = {s["spanID"]: s for s in spans}
        (root,) = [s for s in spans if s["operationName"] == ROOT_NAME]
        ranks = [s for s in spans if s["operationName"] == RANK_NAME]
        assert sorted(_tag(s, "attnscope.rank") for s in ranks) == [0, 1]
        assert {_tag(s, "attnscope.step") for s in ranks + [root]} == {_tag(root, "attnscope.step")}
        for rank in ranks:
            assert rank["references"][0]["spanID"] == root["spanID"]
            calls = [s for s in spans if s["references"]
                     and s["references"][0]["spanID"] == rank["spanID"]]
            assert calls, f"no attention span under rank {_tag(rank, 'attnscope.rank')}"
        # every span's parent is in the merged trace; each rank's process is kept apart
        assert all(by_id.get(s["references"][0]["spanID"]) for s in spans if s["references"])
        procs = {_process_tag(p, "attnscope.rank") for p in trace["processes"].values()}
        assert procs == {0, 1}


def _tag(span: dict[str, Any], key: str) -> Any:
    return next(t["value"] for t in span["tags"] if t["key"] == key)


def _process_tag(process: dict[str, Any], key: str) -> Any:
    return next(t["value"] for t in process["tags"] if t["key"] == key)
