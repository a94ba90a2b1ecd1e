"""Loose ends of issue 35 (§4, §14).

- §4: ``merge_jaeger_json`` writes its output as every file attnscope writes
  (``attnscope._safe_files``): never through a link planted at its old predictable temporary name
  (``<out>.<pid>.tmp``) or at the output's name.
- §14: an unusable ``ATTNSCOPE_EXPORTER`` gets one line at load, the true one ("spans are exported
  nowhere"), not also the configuration's "ignoring invalid environment value".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from attnscope import _config
from attnscope._safe_files import UnsafePath
from attnscope.exporters import merge_jaeger_json
from tests.reliability.harness import clean_env, stderr_problems

VICTIM = b"the victim's own file\n"


def _rank_files(tmp_path: Path) -> list[Path]:
    process = {"p1": {"serviceName": "job", "tags": []}}
    files = []
    for rank in range(2):
        span = {"traceID": "t", "spanID": f"s{rank}", "operationName": f"rank {rank}",
                "references": [], "startTime": 1000 + rank, "duration": 10, "processID": "p1",
                "tags": []}
        path = tmp_path / f"trace.rank{rank}.json"
        path.write_text(json.dumps({"data": [{"traceID": "t", "processes": process,
                                              "spans": [span]}]}))
        files.append(path)
    return files


@pytest.mark.skipif(not hasattr(os, "symlink") or sys.platform == "win32", reason="POSIX links")
def test_merge_writes_nothing_through_a_link_at_its_old_temporary_name(tmp_path: Path) -> None:
    files = _rank_files(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    out = tmp_path / "merged.json"
    planted = Path(f"{out}.{os.getpid()}.tmp")  # the name it used to open, predictable
    planted.symlink_to(victim)
    assert merge_jaeger_json(out, files) == 1
    # before: the merged document was written into the victim through the link
    assert victim.read_bytes() == VICTIM
    assert planted.is_symlink() and os.readlink(planted) == str(victim)
    assert not out.is_symlink()
    (trace,) = json.loads(out.read_text())["data"]
    assert len(trace["spans"]) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [planted.name, out.name, victim.name, *(f.name for f in files)])


@pytest.mark.skipif(not hasattr(os, "symlink") or sys.platform == "win32", reason="POSIX links")
def test_merge_refuses_a_link_at_the_output_name(tmp_path: Path) -> None:
    files = _rank_files(tmp_path)
    victim = tmp_path / "victim.txt"
    victim.write_bytes(VICTIM)
    out = tmp_path / "merged.json"
    out.symlink_to(victim)
    with pytest.raises(UnsafePath, match="symbolic link"):
        merge_jaeger_json(out, files)
    assert victim.read_bytes() == VICTIM
    assert out.is_symlink() and os.readlink(out) == str(victim)
    # nothing left behind beside it
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [out.name, victim.name, *(f.name for f in files)])


def test_merge_replaces_an_existing_output_whole(tmp_path: Path) -> None:
    files = _rank_files(tmp_path)
    out = tmp_path / "merged.json"
    out.write_text("x" * 100_000)
    assert merge_jaeger_json(out, files) == 1
    assert len(json.loads(out.read_text())["data"][0]["spans"]) == 2


# ---- §14 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["jaeger-json:/nonexistent/x.json", "no-such-exporter"])
def test_an_unusable_attnscope_exporter_is_one_true_line(tmp_path: Path, value: str) -> None:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent("""
        import attnscope
        f = attnscope.trace(name="nowhere")(lambda x: x + 1)
        for i in range(5):
            f(i)
        attnscope.flush(10)
        s = attnscope.stats()
        print(s["exported"], s["export_failed"])
    """))
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120,
        env=clean_env(OMP_NUM_THREADS="1", ATTNSCOPE_EXPORTER=value, ATTNSCOPE_SAMPLE_RATE="1",
                      ATTNSCOPE_WARMUP_CALLS="0", ATTNSCOPE_PROFILE_RATE="0",
                      ATTNSCOPE_METRICS="false"))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["0", "5"], proc.stderr[-2000:]
    assert not stderr_problems(proc.stderr), proc.stderr[-2000:]
    named = [line for line in proc.stderr.splitlines() if value in line]
    # before: 2 lines, the first "ignoring invalid environment value" (it is not ignored)
    assert len(named) == 1, proc.stderr
    assert "exported nowhere" in named[0] and "ATTNSCOPE_EXPORTER" in named[0]
    assert "ignoring" not in proc.stderr


def test_from_env_leaves_an_unusable_exporter_to_the_export_side() -> None:
    warned: list[str] = []
    cfg = _config.from_env({"ATTNSCOPE_EXPORTER": "jaeger-json:/nonexistent/x.json",
                            "ATTNSCOPE_SAMPLE_RATE": "lots"}, strict=False,
                           warn=lambda key, message, fields: warned.append(key))
    assert cfg.exporter is None
    assert warned == ["env:ATTNSCOPE_SAMPLE_RATE"]  # other invalid values are still said
    with pytest.raises(ValueError, match="ATTNSCOPE_EXPORTER"):
        _config.from_env({"ATTNSCOPE_EXPORTER": "no-such-exporter"}, strict=True)


# ---- docs/architecture.md's module table -------------------------------------------------------


def test_the_module_table_names_real_modules_and_issue_35s_new_ones() -> None:
    import re

    root = Path(__file__).resolve().parents[1]
    rows = [line for line in (root / "docs" / "architecture.md").read_text().splitlines()
            if line.startswith("| `")]
    named = {name for row in rows for name in re.findall(r"`([^`]+\.py)`", row.split("|")[1])}
    package = root / "attnscope"
    assert [n for n in sorted(named) if not (package / n).is_file()] == []
    new = {"_safe_files.py", "_capture/fork_exit.py", "cli/_ending.py", "cli/run/_status.py"}
    assert new <= named, new - named
