"""``attnscope diff --json``: the diary as JSON, checked against the statistics computed directly
from the same trace files (a real program calling both implementations in turn, as in
tests/test_cli_diff.py)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from attnscope.cli import main
from attnscope.cli.diff._groups import diary
from attnscope.cli.traces import attention_calls, load_spans
from tests.test_cli_diff import _paired


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _paired(tmp_path_factory.mktemp("diffjson"), {"sdpa": "sdpa", "slowed": "slowed"},
                   calls=80)


def _strict_json(text: str) -> Any:
    """JSON as a strict parser reads it: NaN and Infinity are refused."""
    def refuse(name: str) -> None:
        raise AssertionError(f"{name} is not JSON")
    return json.loads(text, parse_constant=refuse)


def test_json_on_stdout_replaces_the_table_and_carries_the_gate(
        traces: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["diff", str(traces["sdpa"]), str(traces["slowed"]), "--json", "-",
                 "--fail-if-slower", "5", "--call-level-gate"])
    out, err = capsys.readouterr()
    assert code == 1 and not err, out
    doc = _strict_json(out)  # nothing but the document on stdout
    assert doc["before"] == str(traces["sdpa"]) and doc["after"] == str(traces["slowed"])
    assert doc["gate"] == {"fail_if_slower": 0.05, "passed": False, "judged": True,
                           "exit_code": 1, "inconclusive": []}
    assert doc["min_change"] == 0.05 and doc["confidence"] == 0.95
    [group] = doc["groups"]
    assert (group["module"], group["phase"], group["gate_failed"]) == ("attention", None, True)
    assert group["gate_inconclusive"] is False
    assert [m["metric"] for m in group["metrics"]] == [
        "p50", "p95", "p99", "tokens/s p50", "memory peak p50"]
    assert [m["unit"] for m in group["metrics"]] == ["ns", "ns", "ns", "tokens/s", "bytes"]
    assert group["metrics"][0]["verdict"] == "slower"
    assert doc["only_before"] == doc["only_after"] == []


def test_json_numbers_are_the_diarys_unrounded(traces: dict[str, Path], tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "diff.json"
    code = main(["diff", str(traces["sdpa"]), str(traces["slowed"]), "--json", str(path)])
    out, _ = capsys.readouterr()
    assert code == 0 and "p50" in out  # no gate asked: exit 0; the table is still printed
    doc = _strict_json(path.read_text())
    assert doc["gate"] is None and doc["groups"][0]["gate_failed"] is False
    expected = diary(attention_calls(load_spans(traces["sdpa"])),
                     attention_calls(load_spans(traces["slowed"])), min_change=0.05)
    group, want = doc["groups"][0], expected.groups[0]
    assert (group["calls_before"], group["calls_after"]) == (want.calls_before, want.calls_after)
    assert (group["clock_before"], group["clock_after"]) == ("wall", "wall")
    for got, change in zip(group["metrics"], want.changes, strict=True):
        assert (got["calls_before"], got["calls_after"]) == (change.n_before, change.n_after)
        for key, value in (("before", change.before), ("after", change.after),
                           ("change", change.change)):
            assert got[key] == (value if math.isfinite(value) else None), (got, key)
        low, high = got["interval"]
        if math.isnan(change.low):  # p99 on 80 calls (p95 too, if few were timed): no verdict
            assert low is high is None and got["verdict"].startswith("too few calls (< ")
        else:
            assert (low, high) == (change.low, change.high)
            assert got["verdict"] == change.verdict


def test_an_unwritable_json_path_is_one_stderr_line(traces: dict[str, Path], tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "missing" / "diff.json"
    code = main(["diff", str(traces["sdpa"]), str(traces["sdpa"]), "--json", str(target)])
    out, err = capsys.readouterr()
    assert code == 2 and not out
    assert err.strip().splitlines() == [
        f"attnscope diff: error: --json {target}: the directory {target.parent} does not exist"]
