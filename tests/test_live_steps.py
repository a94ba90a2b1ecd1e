"""One trace per declared step across the ranks of a job (docs/live.md).

In-process tests pose as rank 0 and rank 1 with ``RANK``/``WORLD_SIZE`` (and a ``HashStore`` as
the process group's store); the last ones run real ``torchrun --nproc-per-node 2`` jobs on CPU
(gloo, an all-reduce per step) — plain, ``--standalone`` and ``--rdzv-id`` — and merge the ranks'
Jaeger JSON files.
"""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import attnscope
from attnscope import _api, _dist
from attnscope._spans import run_id
from attnscope._spans.run_id import STORE_KEY, RunId
from attnscope._spans.steps import RANK_NAME, ROOT_NAME, step_ids
from attnscope.exporters import merge_jaeger_json
from attnscope.testing import capture_spans

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
    """Spans named ``name``; for the step and rank spans, ``name`` then their number."""
    numbered = name in (ROOT_NAME, RANK_NAME)
    return [s for s in spans if s.name == name or (numbered and s.name.startswith(name + " "))]


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
        assert (root.name, rank.name) == (f"attnscope.step {step}", "attnscope.rank 0")
        assert all(dict(c.attributes or {})["attnscope.rank"] == 0 for c in calls)
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
    assert dict(rank.attributes or {})["attnscope.rank"] == 1 and rank.name == "attnscope.rank 1"
    assert all(dict(c.attributes or {})["attnscope.rank"] == 1 for c in _by_name(spans, "layer"))


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
        in_trace = [s for s in spans if s.context.trace_id == trace_id]
        (root,) = _by_name(in_trace, ROOT_NAME)
        step = dict(root.attributes or {})["attnscope.step"]
        names = sorted(s.name for s in in_trace)
        assert names == sorted([f"attnscope.step {step}", "attnscope.rank 0", "layer", "layer"])
        # one process: no rank attribute on its spans
        calls = _by_name(in_trace, "layer")
        assert all("attnscope.rank" not in (s.attributes or {}) for s in calls)


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


def _job_store() -> Any:
    """A fresh store, as a new job's process group has (torch's in-memory one)."""
    if not dist.is_available():
        pytest.skip("torch.distributed is not available")
    from torch._C._distributed_c10d import HashStore

    return HashStore()


class _Asked:
    """The process group's store as :class:`RunId` sees it: counts the look-ups, may be absent."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.calls = 0
        self.threads: list[str] = []

    def __call__(self) -> Any:
        self.calls += 1
        self.threads.append(threading.current_thread().name)
        return self.store


def _none() -> str | None:
    return None


def test_ranks_agree_on_one_id_through_the_store_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    job = _job_store()
    rank0, rank1 = _Asked(job), _Asked(job)
    id0, id1 = RunId(_none, rank0), RunId(_none, rank1)
    agreed = id1()  # whichever rank asks first puts the id there: no rank waits for rank 0
    assert agreed == id0() == job.get(STORE_KEY + "0").decode()
    assert agreed not in (id0.own, id1.own) and re.fullmatch(r"[0-9a-f]{32}", agreed)
    assert id0() == id1() == agreed and (rank0.calls, rank1.calls) == (1, 1)  # asked once
    # the next job has a store of its own; a restarted attempt asks under its restart count
    assert RunId(_none, _Asked(_job_store()))() != agreed
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarted = RunId(_none, _Asked(job))()
    assert restarted != agreed and RunId(_none, _Asked(job))() == restarted
    # a run id from the setting or from torchrun wins: the store is never asked
    asked = _Asked(job)
    assert RunId(lambda: "mine", asked)() == "mine" and asked.calls == 0


def test_steps_before_init_process_group_keep_their_own_id() -> None:
    asked = _Asked(None)  # torch.distributed not initialised yet
    rid = RunId(_none, asked)
    assert rid() == rid.own and rid() == rid.own and asked.calls == 2  # asked again each step
    asked.store = _job_store()
    agreed = rid()
    assert agreed != rid.own and rid() == agreed and asked.calls == 3


class _HungStore:
    def __init__(self) -> None:
        self.release = threading.Event()
        self.asked = 0

    def compare_set(self, key: str, expected: str, desired: str) -> bytes:
        self.asked += 1
        self.release.wait(30)
        return desired.encode()


def test_a_hung_or_failing_store_falls_back_once_and_says_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    monkeypatch.setattr(run_id, "AGREE_TIMEOUT_S", 0.2)
    hung = _HungStore()
    rid = RunId(_none, _Asked(hung))
    try:
        started = time.monotonic()
        assert rid() == rid.own
        assert time.monotonic() - started < 5.0  # bounded: 0.2 s here, never the store's timeout
        assert rid() == rid.own and hung.asked == 1  # the failure is remembered
    finally:
        hung.release.set()

    def broken() -> Any:
        raise RuntimeError("store gone")

    failing = RunId(_none, broken)
    assert failing() == failing.own and failing() == failing.own
    warnings = [r for r in caplog.records if "could not agree on a run id" in r.getMessage()]
    assert len(warnings) == 1  # once (rate-limited): the first failure's


def test_the_store_is_asked_on_the_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    job = _job_store()
    asked = _Asked(job)
    monkeypatch.setattr(run_id, "default_store", asked)
    spans = _run_steps(InMemorySpanExporter(), steps=2, calls=1)
    # asked once, by attnscope's worker thread: never the calling thread
    assert asked.calls == 1 and asked.threads[0] != threading.current_thread().name
    assert asked.threads[0].startswith("attnscope")
    assert job.check([STORE_KEY + "0"])
    agreed = job.get(STORE_KEY + "0").decode()
    for step in range(2):
        trace_id = step_ids(agreed, step, 0)[0]
        (root,) = [s for s in _by_name(spans, ROOT_NAME) if s.context.trace_id == trace_id]
        assert dict(root.attributes or {})["attnscope.run_id"] == agreed


def _clean_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH")
                                     else "")
    env["OMP_NUM_THREADS"] = "1"
    for var in ("TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE"):
        env.pop(var, None)
    return env


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _torchrun(out: Path, launch: list[str], steps: int) -> tuple[list[str], str]:
    """Run tests/support/live_steps_job.py under ``torchrun <launch> --nproc-per-node 2``; check the
    merged ranks' files hold one trace per step with both ranks in it. Returns the traces' run ids
    (the root's ``attnscope.run_id``, in step order) and the job's stderr."""
    torchrun = Path(sys.executable).with_name("torchrun")
    if not torchrun.exists():
        pytest.skip("torchrun is not installed next to this Python")
    out.mkdir()
    proc = subprocess.run(
        [str(torchrun), *launch, "--nproc-per-node", "2",
         str(ROOT / "tests" / "support" / "live_steps_job.py"), str(out), str(steps)],
        check=False, capture_output=True, text=True, timeout=240, env=_clean_env(), cwd=out)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stderr.count("shutdown ok True") == 2, proc.stderr[-4000:]
    files = [out / "trace.rank0.json", out / "trace.rank1.json"]
    merged = out / "merged.json"
    assert merge_jaeger_json(merged, files) == steps, "the ranks' steps are not in one trace"
    document = json.loads(merged.read_text())
    run_ids: dict[int, str] = {}
    for trace in document["data"]:
        spans = trace["spans"]
        by_id = {s["spanID"]: s for s in spans}
        (root,) = [s for s in spans if s["operationName"].startswith(ROOT_NAME + " ")]
        ranks = [s for s in spans if s["operationName"].startswith(RANK_NAME + " ")]
        assert sorted(_tag(s, "attnscope.rank") for s in ranks) == [0, 1]
        assert sorted(s["operationName"] for s in ranks) == ["attnscope.rank 0", "attnscope.rank 1"]
        assert root["operationName"] == f"attnscope.step {_tag(root, 'attnscope.step')}"
        # the merge widens rank 0's root over every rank's spans of the step
        assert root["startTime"] == min(s["startTime"] for s in spans)
        assert root["startTime"] + root["duration"] == max(s["startTime"] + s["duration"]
                                                           for s in spans)
        # every span of a rank says which (the root spans the job)
        assert all(_tag(s, "attnscope.rank") in (0, 1) for s in spans if s is not root)
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
        run_ids[_tag(root, "attnscope.step")] = _tag(root, "attnscope.run_id")
    assert sorted(run_ids) == list(range(steps))
    return [run_ids[step] for step in range(steps)], proc.stderr


_LAUNCHES = {
    # torchrun's default launch: TORCHELASTIC_RUN_ID=none, the ranks agree through the store
    "plain": ([], r"[0-9a-f]{32}", "run id none"),
    # --standalone makes a fresh rendezvous id (a UUID) per job: TORCHELASTIC_RUN_ID/restart
    "standalone": (["--standalone"], r"[0-9a-f-]{36}/0", None),
    "rdzv-id": (["--rdzv-id", "job-x"], r"job-x/0", "run id job-x"),
}


@pytest.mark.slow
@pytest.mark.parametrize("launch", sorted(_LAUNCHES))
def test_torchrun_two_ranks_one_trace_per_step(tmp_path: Path, launch: str) -> None:
    args, pattern, said = _LAUNCHES[launch]
    port = [] if launch == "standalone" else ["--master-port", str(_free_port())]
    run_ids, stderr = _torchrun(tmp_path / "job", [*args, *port], steps=3)
    assert len(set(run_ids)) == 1 and re.fullmatch(pattern, run_ids[0]), run_ids
    if said:
        assert stderr.count(said) == 2, stderr[-4000:]


@pytest.mark.slow
def test_consecutive_plain_torchrun_jobs_on_one_port_get_different_run_ids(
        tmp_path: Path) -> None:
    port = ["--master-port", str(_free_port())]  # both jobs: the same address, the same env
    first, _ = _torchrun(tmp_path / "first", port, steps=1)
    second, _ = _torchrun(tmp_path / "second", port, steps=1)
    assert first != second, "two jobs share a run id: their steps would land in one trace"


def _tag(span: dict[str, Any], key: str) -> Any:
    return next(t["value"] for t in span["tags"] if t["key"] == key)


def _process_tag(process: dict[str, Any], key: str) -> Any:
    return next(t["value"] for t in process["tags"] if t["key"] == key)
