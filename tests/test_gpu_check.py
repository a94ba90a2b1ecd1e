"""``scripts/gpu_check.py``, the GPU acceptance run, checked where there is no GPU.

It must not waste a lent GPU's few minutes: on CPU it runs the same steps (every CUDA test skips),
writes the same JSON with ``status: no-cuda`` and exits 2; its pieces (JUnit outcomes, the tests'
figure lines, the time budget) are checked here on made-up input.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from .support import figures
from .support.helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _script() -> ModuleType:
    return load_script(SCRIPT, "gpu_check")


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest" tests="5">
 <testcase classname="tests.gpu.test_a" name="test_ok" time="0.1"/>
 <testcase classname="tests.gpu.test_a" name="test_bad" time="0.1">
  <failure message="assert 1 == 2">long text</failure></testcase>
 <testcase classname="tests.gpu.test_b" name="test_broken" time="0.1">
  <error message="fixture failed">trace</error></testcase>
 <testcase classname="tests.gpu.test_b" name="test_later" time="0.0">
  <skipped message="needs CUDA"/></testcase>
 <testcase classname="tests.gpu.test_b" name="test_ok_too" time="0.1"/>
</testsuite></testsuites>
"""


def test_junit_outcomes_are_counted_with_their_ids(tmp_path: Path) -> None:
    gc = _script()
    path = tmp_path / "r.xml"
    path.write_text(JUNIT)
    found = gc.junit_summary(path)
    assert (found["passed"], found["failed"], found["errors"], found["skipped"]) == (2, 1, 1, 1)
    assert found["failures"] == [
        {"id": "tests.gpu.test_a::test_bad", "message": "assert 1 == 2"},
        {"id": "tests.gpu.test_b::test_broken", "message": "fixture failed"}]
    assert found["skips"] == [{"id": "tests.gpu.test_b::test_later", "reason": "needs CUDA"}]
    missing = gc.junit_summary(tmp_path / "absent.xml")
    assert missing["passed"] == 0 and "unreadable" in missing
    both = gc.merge_summaries([found, found, missing])
    assert (both["passed"], both["failed"], both["skipped"]) == (4, 2, 2)
    assert len(both["failures"]) == 4 and len(both["unreadable"]) == 1


def test_the_tests_figures_reach_the_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gc = _script()
    path = tmp_path / "figures.jsonl"
    monkeypatch.setenv(figures.ENV, str(path))
    figures.record("memory_peak", backend="flash", attnscope_bytes=136_315_904)
    figures.record("device_ns", ratio=1.001)
    with path.open("a") as out:
        out.write("not json\n\n")
    assert gc.read_figures(path) == [
        {"check": "memory_peak", "backend": "flash", "attnscope_bytes": 136_315_904},
        {"check": "device_ns", "ratio": 1.001},
        {"check": "unreadable", "line": "not json"}]
    assert gc.read_figures(tmp_path / "none.jsonl") == []


def test_a_spent_budget_runs_no_step_and_says_so(tmp_path: Path) -> None:
    gc = _script()
    rc = gc.main(["--out", str(tmp_path), "--steps", "env,tests", "--budget", "0"])
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [s["name"] for s in doc["steps"]] == ["tests/gpu",
                                                 "tests/test_device_acceptance.py (cuda)"]
    assert all(s["rc"] is None and s["not_run"] for s in doc["steps"])
    assert doc["failed_steps"] == [s["name"] for s in doc["steps"]]
    if torch.cuda.is_available():
        assert rc == 1 and doc["status"] == "fail"
    else:
        assert rc == 2 and doc["status"] == "no-cuda"
    with pytest.raises(SystemExit):
        gc.main(["--out", str(tmp_path), "--steps", "env,nonsense"])


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the benchmarks would run")
def test_benchmark_steps_without_cuda_run_nothing(tmp_path: Path) -> None:
    gc = _script()
    assert gc.main(["--out", str(tmp_path), "--steps", "env,bench,issue37"]) == 2
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["steps"] == [] and doc["benchmarks"] == {} and doc["status"] == "no-cuda"
    log = (tmp_path / "gpu_check.log").read_text()
    assert "== bench: no CUDA device" in log and "== issue37: no CUDA device" in log


@pytest.mark.skipif(torch.cuda.is_available(), reason="with CUDA the run is the acceptance itself")
def test_without_cuda_the_whole_run_says_no_cuda(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 2, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert doc["status"] == "no-cuda" and doc["environment"]["cuda_available"] is False
    assert [s["rc"] for s in doc["steps"]] == [0, 0]  # pytest ran both: every CUDA test skipped
    tests = doc["tests"]
    assert tests["passed"] == tests["failed"] == tests["errors"] == 0
    # every test of tests/gpu and every CUDA case of the acceptance file was collected and skipped
    ids = {s["id"] for s in tests["skips"]}
    assert any("test_gpu_acceptance" in i for i in ids)
    assert any("test_device_acceptance" in i and "cuda" in i for i in ids)
    assert tests["skipped"] >= 40
    assert doc["benchmarks"] == {}
    assert "no CUDA device" in (tmp_path / "gpu_check.log").read_text()
