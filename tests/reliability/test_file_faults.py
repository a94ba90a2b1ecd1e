"""Scenario 8: file exporter faults. A disk that fills, a file system remounted read-only, the
trace file replaced by a symbolic link, its directory removed, the file replaced, and a worker
restarted on the same path, under sampled traffic through ``configure(exporter="jaeger-json:...")``
and ``"otlp-json:..."`` (issue 20, section 5).

For each: ``stats()`` counts a span exported only once it is in the file, and at every
``flush()`` / ``shutdown()`` return every emitted span is exported, failed, dropped or still in
flight (``emitted == exported + export_failed + export_dropped + export_in_flight``); after
``shutdown()`` nothing is in flight, and what the file holds is what was counted exported.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import attnscope
from attnscope.exporters import read_otlp_json_lines
from tests.reliability.harness import Figures, sized

pytestmark = pytest.mark.reliability

CALLS = sized(ci=400, full=2_000)
BEFORE = CALLS // 4  # calls written before the fault


@attnscope.trace(name="step")
def step(x: int) -> int:
    return x + 1


def _configure(exporter: str, **kwargs: Any) -> None:
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0, metrics=False, **kwargs)


@pytest.fixture(autouse=True)
def _small_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    # many export() calls: a Jaeger exporter that buffers between its writes shows in the counts
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "16")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", str(4 * CALLS))


def _counts() -> dict[str, int]:
    s = attnscope.stats()
    keys = ("captured", "emitted", "pending", "exported", "export_failed", "export_dropped")
    return {**{k: s[k] for k in keys}, "export_in_flight": s["export_in_flight"]}


def _identity(c: dict[str, int]) -> None:
    assert c["pending"] == 0 and c["captured"] == c["emitted"], c
    assert c["emitted"] == (c["exported"] + c["export_failed"] + c["export_dropped"]
                            + c["export_in_flight"]), c


def _in_file(path: Path) -> int:
    if not path.is_file() or path.is_symlink():
        return 0
    if path.suffix == ".json":
        import json

        return sum(len(t["spans"]) for t in json.loads(path.read_text())["data"])
    return sum(len(ss.spans) for r in read_otlp_json_lines(path) for rs in r.resource_spans
               for ss in rs.scope_spans)


def _under(root: Path, target: Any) -> bool:
    return str(target).startswith(str(root))


@pytest.fixture
def inject(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[str], None]]:
    """``inject(fault)`` breaks the trace file's directory from now on."""
    real_write, real_open = os.write, os.open

    def full(fd: int, data: Any) -> int:
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if _under(tmp_path, target):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    def read_only(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if _under(tmp_path, path) and flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))
        return real_open(path, flags, *args, **kwargs)

    def apply(fault: str) -> None:
        if fault == "full disk":
            monkeypatch.setattr(os, "write", full)
            monkeypatch.setattr(os, "writev", lambda fd, buffers: full(fd, b"".join(buffers)))
        elif fault == "read-only":
            monkeypatch.setattr(os, "open", read_only)

    yield apply


JAEGER_FAULTS = ["full disk", "read-only", "symlink"]


def _rest_then_flush_and_shutdown(figures: Figures) -> tuple[bool, dict[str, int], bool,
                                                               dict[str, int]]:
    """The calls after the fault, then flush() and shutdown(): what each returned, the counts."""
    for i in range(CALLS - BEFORE):
        step(i)
    flushed = attnscope.flush(timeout_s=30)
    at_flush = _counts()
    shut = attnscope.shutdown(timeout_s=30)
    after = _counts()
    figures.lost = (f"{after['export_failed']} export_failed of {after['emitted']} emitted; "
                    f"{after['exported']} exported")
    return flushed, at_flush, shut, after


@pytest.mark.parametrize("fault", JAEGER_FAULTS)
def test_jaeger_counts_only_what_reaches_the_file(fault: str, tmp_path: Path, figures: Figures,
                                                  inject: Callable[[str], None]) -> None:
    figures.set("8 file faults", f"{CALLS} sampled calls ({BEFORE} before the fault), batches of "
                "16", f"jaeger-json {fault}" + (" (the file replaced by a link mid-run)"
                                                if fault == "symlink" else " mid-run"))
    path = tmp_path / "t.json"
    _configure(f"jaeger-json:{path}")
    for i in range(BEFORE):
        step(i)
    assert attnscope.flush(timeout_s=30) is True
    assert _counts()["exported"] == BEFORE == _in_file(path)
    if fault == "symlink":
        target = tmp_path / "elsewhere.json"
        target.write_text("keep")
        path.unlink()
        path.symlink_to(target)
    inject(fault)
    flushed, at_flush, shut, after = _rest_then_flush_and_shutdown(figures)
    figures.add(flush_returned=flushed, in_flight_at_flush=at_flush["export_in_flight"],
                exported_at_flush=at_flush["exported"], shutdown_returned=shut)

    assert flushed is False
    _identity(at_flush)
    assert at_flush["exported"] == BEFORE, at_flush  # the rest is not in any file
    assert at_flush["export_in_flight"] == CALLS - BEFORE, at_flush  # kept for the next write
    assert shut is False
    _identity(after)
    assert after["export_in_flight"] == 0, after
    assert after["exported"] == BEFORE and after["export_failed"] == CALLS - BEFORE, after
    if fault == "symlink":
        assert path.is_symlink() and (tmp_path / "elsewhere.json").read_text() == "keep"


@pytest.mark.parametrize("kind", ["jaeger-json", "otlp-json"])
def test_directory_removed_mid_run(kind: str, tmp_path: Path, figures: Figures) -> None:
    figures.set("8 file faults", f"{CALLS} sampled calls ({BEFORE} before the fault)",
                f"{kind} directory removed mid-run")
    directory = tmp_path / "traces"
    directory.mkdir()
    path = directory / ("t.json" if kind == "jaeger-json" else "t.jsonl")
    _configure(f"{kind}:{path}")
    for i in range(BEFORE):
        step(i)
    assert attnscope.flush(timeout_s=30) is True
    shutil.rmtree(directory)
    flushed, at_flush, shut, after = _rest_then_flush_and_shutdown(figures)
    figures.add(flush_returned=flushed, exported_at_flush=at_flush["exported"],
                failed_at_flush=at_flush["export_failed"],
                in_flight_at_flush=at_flush["export_in_flight"], shutdown_returned=shut)

    assert flushed is False
    _identity(at_flush)
    assert at_flush["exported"] == BEFORE, at_flush
    _identity(after)
    assert after["export_in_flight"] == 0
    assert after["exported"] == BEFORE and after["export_failed"] == CALLS - BEFORE, after
    assert not directory.exists()  # attnscope creates no directories


def test_otlp_json_file_replaced_mid_run(tmp_path: Path, figures: Figures) -> None:
    figures.set("8 file faults", f"{CALLS} sampled calls ({BEFORE} before the fault)",
                "otlp-json file deleted and a new one put at its path mid-run")
    path = tmp_path / "t.jsonl"
    _configure(f"otlp-json:{path}")
    for i in range(BEFORE):
        step(i)
    assert attnscope.flush(timeout_s=30) is True
    path.unlink()
    path.write_text("")  # e.g. a log rotation: a new file where the old one was
    for i in range(CALLS - BEFORE):
        step(i)
    flushed = attnscope.flush(timeout_s=30)
    in_new = _in_file(path)
    attnscope.shutdown(timeout_s=30)
    after = _counts()
    figures.lost = f"none; {in_new} spans in the new file"
    figures.add(flush_returned=flushed, in_new_file=in_new, exported=after["exported"])
    assert flushed is True
    assert in_new == CALLS - BEFORE  # not appended to the deleted file
    _identity(after)
    assert after["exported"] == CALLS and after["export_failed"] == 0


@pytest.mark.parametrize("restart", ["shutdown", "configure"])
def test_jaeger_restarted_worker_keeps_the_file(restart: str, tmp_path: Path,
                                                figures: Figures) -> None:
    how = ("shutdown() then more traced calls" if restart == "shutdown"
           else "configure(queue_size=...) with the same path")
    figures.set("8 file faults", f"2 x {CALLS // 2} sampled calls", f"jaeger-json worker "
                f"restarted: {how}")
    path = tmp_path / "t.json"
    _configure(f"jaeger-json:{path}")
    for i in range(CALLS // 2):
        step(i)
    if restart == "shutdown":
        assert attnscope.shutdown(timeout_s=30) is True
    else:
        assert attnscope.flush(timeout_s=30) is True
        _configure(f"jaeger-json:{path}", queue_size=1000)  # not the default: a new worker
    for i in range(CALLS // 2):
        step(i)
    assert attnscope.shutdown(timeout_s=30) is True
    after = _counts()
    in_file = _in_file(path)
    figures.lost = f"none; {in_file} of {after['emitted']} spans in the file"
    figures.add(in_file=in_file, exported=after["exported"])
    _identity(after)
    assert in_file == after["exported"] == after["emitted"] == 2 * (CALLS // 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json"]  # no per-process file
