"""The file exporters' safety rules (attnscope._export.files): what they refuse, what a failing
disk does to export()/force_flush(), permissions, and one writer per file (issue 10, items 4-5)."""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import attnscope
from attnscope._export import files
from attnscope.exporters import (
    JaegerJSONFileExporter,
    OTLPJSONFileExporter,
    read_otlp_json_lines,
)

Exporter = JaegerJSONFileExporter | OTLPJSONFileExporter
KINDS = ("jaeger-json", "otlp-json")


def make(kind: str, path: Path | str, **kwargs: Any) -> Exporter:
    if kind == "jaeger-json":
        return JaegerJSONFileExporter(path, flush_interval_s=0, **kwargs)
    return OTLPJSONFileExporter(path, **kwargs)


def spans(n: int, prefix: str = "s") -> list[ReadableSpan]:
    provider = TracerProvider(resource=Resource.create({"service.name": "t"}),
                              shutdown_on_exit=False)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    for i in range(n):
        provider.get_tracer("t").start_span(f"{prefix}{i}").end()
    return list(memory.get_finished_spans())


def names_in(path: Path) -> list[str]:
    """Span names in a file either exporter wrote."""
    if path.name.endswith(".json"):
        doc = json.loads(path.read_text())
        return [s["operationName"] for t in doc["data"] for s in t["spans"]]
    return [s.name for r in read_otlp_json_lines(path) for rs in r.resource_spans
            for ss in rs.scope_spans for s in ss.spans]


def suffix(kind: str) -> str:
    return ".json" if kind == "jaeger-json" else ".jsonl"


def warnings_about(caplog: pytest.LogCaptureFixture, text: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if text in r.getMessage()]


# -- refused at configure() and by the constructors ------------------------------------------

def _bad_paths(tmp_path: Path) -> dict[str, Path]:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "real.json").write_text("keep")
    here = tmp_path / "here"
    here.mkdir()
    (here / "a-directory").mkdir()
    os.mkfifo(here / "a-fifo")
    (here / "link-out").symlink_to(elsewhere / "real.json")
    (here / "sibling.json").write_text("keep")
    (here / "link-beside").symlink_to(here / "sibling.json")
    (here / "dangling").symlink_to(elsewhere / "missing.json")
    (here / "a-file").write_text("")
    return {
        "directory": here / "a-directory",
        "fifo": here / "a-fifo",
        "symlink out of the directory": here / "link-out",
        "symlink in the same directory": here / "link-beside",
        "dangling symlink": here / "dangling",
        "missing directory": here / "no-such-dir" / "t.json",
        "parent is a file": here / "a-file" / "t.json",
    }


BAD = ["directory", "fifo", "symlink out of the directory", "symlink in the same directory",
       "dangling symlink", "missing directory", "parent is a file"]


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("kind", KINDS)
def test_configure_refuses_what_is_not_a_regular_file(tmp_path: Path, kind: str,
                                                      case: str) -> None:
    path = _bad_paths(tmp_path)[case]
    before = sorted(p.name for p in path.parent.iterdir()) if path.parent.is_dir() else None
    with pytest.raises(ValueError, match=r"exporter") as info:
        attnscope.configure(exporter=f"{kind}:{path}")
    assert repr(str(path)) in str(info.value)  # names the path
    # Nothing was created, and nothing a link points to was touched.
    if before is not None:
        assert sorted(p.name for p in path.parent.iterdir()) == before
    assert (tmp_path / "elsewhere" / "real.json").read_text() == "keep"
    assert not (tmp_path / "here" / "no-such-dir").exists()


@pytest.mark.parametrize("case", BAD)
@pytest.mark.parametrize("kind", KINDS)
def test_constructors_refuse_the_same_paths(tmp_path: Path, kind: str, case: str) -> None:
    path = _bad_paths(tmp_path)[case]
    with pytest.raises(ValueError, match="Exporter path"):
        make(kind, path)
    assert not list(tmp_path.rglob("*.lock"))


@pytest.mark.skipif(not os.path.exists("/dev/null"), reason="no /dev/null")
@pytest.mark.parametrize("kind", KINDS)
def test_a_device_node_is_never_replaced(kind: str) -> None:
    with pytest.raises(ValueError, match=r"exporter: '/dev/null' is a character device"):
        attnscope.configure(exporter=f"{kind}:/dev/null")
    with pytest.raises(ValueError, match="character device"):
        make(kind, "/dev/null")


@pytest.mark.parametrize("kind", KINDS)
def test_a_regular_file_or_a_new_name_is_accepted(tmp_path: Path, kind: str) -> None:
    existing = tmp_path / f"old{suffix(kind)}"
    existing.write_text("")
    attnscope.configure(exporter=f"{kind}:{existing}")
    attnscope.configure(exporter=f"{kind}:{tmp_path / ('new' + suffix(kind))}")
    assert not (tmp_path / f"new{suffix(kind)}").exists()  # configure() writes nothing


# -- refused at write time, when the path changes after the check ------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_link_planted_later_is_not_written_through(tmp_path: Path, kind: str) -> None:
    target = tmp_path / "elsewhere" / "precious.txt"
    target.parent.mkdir()
    target.write_text("keep")
    (tmp_path / "out").mkdir()
    path = tmp_path / "out" / f"t{suffix(kind)}"
    exporter = make(kind, path)
    path.symlink_to(target)
    assert exporter.export(spans(2)) is SpanExportResult.FAILURE
    assert exporter.force_flush() is False
    exporter.shutdown()
    assert path.is_symlink() and target.read_text() == "keep"
    assert os.listdir(tmp_path / "out") == [path.name]  # no temp file, lock removed


@pytest.mark.parametrize("kind", KINDS)
def test_a_fifo_planted_later_fails_without_blocking(tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"t{suffix(kind)}"
    exporter = make(kind, path)
    os.mkfifo(path)
    result: list[SpanExportResult] = []
    writer = threading.Thread(target=lambda: result.append(exporter.export(spans(1))),
                              daemon=True)
    writer.start()
    writer.join(10)
    assert not writer.is_alive(), "export() blocked on a FIFO"
    assert result == [SpanExportResult.FAILURE]
    exporter.shutdown()


def test_rotation_never_replaces_a_directory(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    (tmp_path / "t.json.1").mkdir()
    exporter = JaegerJSONFileExporter(path, max_bytes=2000, backups=2, flush_interval_s=None)
    results = [exporter.export(spans(1, prefix=f"n{i}-")) for i in range(30)]
    assert SpanExportResult.FAILURE in results
    assert exporter.force_flush() is False
    exporter.shutdown()
    assert (tmp_path / "t.json.1").is_dir()
    assert len(names_in(path)) + exporter.dropped_spans == 30


# -- a failing disk: FAILURE, False from force_flush, counted, logged once, never raised -------

@pytest.fixture
def disk() -> Iterator[dict[str, Any]]:
    """``disk["error"] = errno.ENOSPC`` makes every write to a file descriptor > 2 fail."""
    state: dict[str, Any] = {"error": None, "partial": False}
    real = os.write

    def write(fd: int, data: Any) -> int:
        if state["error"] is None or fd <= 2:
            return real(fd, data)
        if state["partial"] and len(data) > 1:
            state["partial"] = False
            return real(fd, bytes(data[: len(data) // 2]))  # half a line, then the error
        raise OSError(state["error"], os.strerror(state["error"]))

    def writev(fd: int, buffers: Any) -> int:  # the same disk, for pieces written at once
        return write(fd, b"".join(buffers))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "write", write)
        mp.setattr(os, "writev", writev)
        yield state


def test_jaeger_full_disk_keeps_spans_for_the_next_write(
    tmp_path: Path, disk: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path, flush_interval_s=0)
    assert exporter.export(spans(1, "a")) is SpanExportResult.SUCCESS
    before = path.read_bytes()
    disk["error"] = errno.ENOSPC
    assert all(exporter.export(spans(1, f"b{i}-")) is SpanExportResult.FAILURE for i in range(5))
    assert exporter.force_flush() is False
    assert path.read_bytes() == before  # the file is never half written
    assert sorted(os.listdir(tmp_path)) == ["t.json", "t.json.lock"]  # no temp file left
    [record] = warnings_about(caplog, "cannot write the Jaeger JSON file")  # once, not 6 times
    assert "ENOSPC" in record.getMessage() and str(path) in record.getMessage()
    disk["error"] = None
    assert exporter.force_flush() is True  # nothing was lost: every span is in the file now
    assert len(names_in(path)) == 6 and exporter.dropped_spans == 0
    disk["error"] = errno.ENOSPC
    assert exporter.export(spans(2, "c")) is SpanExportResult.FAILURE
    exporter.shutdown()  # the final write fails: what the file lacks is lost and counted
    assert exporter.dropped_spans == 2
    assert len(names_in(path)) == 8 - 2
    assert warnings_about(caplog, "spans lost")


def test_otlp_full_disk_loses_the_line_and_says_so(
    tmp_path: Path, disk: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    path = tmp_path / "t.jsonl"
    exporter = OTLPJSONFileExporter(path)
    assert exporter.export(spans(1, "a")) is SpanExportResult.SUCCESS
    disk["error"], disk["partial"] = errno.ENOSPC, True
    assert exporter.export(spans(3, "b")) is SpanExportResult.FAILURE
    assert exporter.export(spans(2, "c")) is SpanExportResult.FAILURE
    assert exporter.dropped_spans == 5
    assert exporter.force_flush() is False
    assert exporter.force_flush() is True  # reported once; nothing new lost since
    [record] = warnings_about(caplog, "cannot write the OTLP/JSON file")
    assert "ENOSPC" in record.getMessage()
    disk["error"] = None
    assert exporter.export(spans(1, "d")) is SpanExportResult.SUCCESS
    exporter.shutdown()
    assert names_in(path) == ["a0", "d0"]  # the half-written line was cut off


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES])
@pytest.mark.parametrize("kind", KINDS)
def test_read_only_or_forbidden_directory(tmp_path: Path, kind: str, code: int,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system remounted read-only (or permissions changed) while the exporter runs."""
    exporter = make(kind, tmp_path / f"t{suffix(kind)}")
    real = os.open

    def refuse(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).startswith(str(tmp_path)):
            raise OSError(code, os.strerror(code), str(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    assert exporter.export(spans(3)) is SpanExportResult.FAILURE
    assert exporter.force_flush() is False
    exporter.shutdown()  # never raises
    assert exporter.dropped_spans == 3


@pytest.mark.skipif(os.geteuid() == 0, reason="root is not denied by directory permissions; "
                    "test_read_only_or_forbidden_directory covers the errors with a fake")
@pytest.mark.parametrize("kind", KINDS)
def test_real_unwritable_directory(tmp_path: Path, kind: str) -> None:
    exporter = make(kind, tmp_path / f"t{suffix(kind)}")
    tmp_path.chmod(0o500)
    try:
        assert exporter.export(spans(2)) is SpanExportResult.FAILURE
        assert exporter.force_flush() is False
        exporter.shutdown()
    finally:
        tmp_path.chmod(0o700)
    assert exporter.dropped_spans == 2


def test_flush_returns_false_when_the_file_cannot_be_written(tmp_path: Path) -> None:
    """attnscope.flush() reports the file exporter's failure (issue 10, item 4)."""
    path = tmp_path / "t.json"
    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0, metrics=False)

    @attnscope.trace
    def step(x: int) -> int:
        return x + 1

    step(1)
    assert attnscope.flush(timeout_s=10) is True
    path.unlink()
    path.mkdir()  # EISDIR from here on
    step(2)
    assert attnscope.flush(timeout_s=10) is False
    path.rmdir()
    assert attnscope.flush(timeout_s=10) is True  # the span was kept and is written now
    assert len(names_in(path)) == 2


# -- permissions -------------------------------------------------------------------------------

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
@pytest.mark.parametrize("kind", KINDS)
def test_files_get_the_usual_permissions(tmp_path: Path, kind: str, umask: int,
                                         mode: int) -> None:
    old = os.umask(umask)
    try:
        path = tmp_path / f"t{suffix(kind)}"
        exporter = make(kind, path, max_bytes=1500, backups=1)
        for i in range(10):
            exporter.export(spans(2, f"n{i}-"))
        exporter.shutdown()
    finally:
        os.umask(old)
    written = sorted(tmp_path.iterdir())
    assert [p.name for p in written] == [path.name, path.name + ".1"]  # rotation still works
    assert {p.stat().st_mode & 0o777 for p in written} == {mode}


# -- one writer per file -------------------------------------------------------------------------

@pytest.mark.parametrize("kind", KINDS)
def test_a_second_writer_gets_its_own_file(tmp_path: Path, kind: str,
                                           caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    path = tmp_path / f"t{suffix(kind)}"
    first, second = make(kind, path), make(kind, path)
    assert first.path == str(path)
    assert second.path == str(tmp_path / f"t.{os.getpid()}{suffix(kind)}")
    [record] = warnings_about(caplog, "another writer")
    assert second.path in record.getMessage()
    first.export(spans(2, "first"))
    second.export(spans(3, "second"))
    first.shutdown()
    second.shutdown()
    assert sorted(names_in(path)) == ["first0", "first1"]
    assert sorted(names_in(Path(second.path))) == ["second0", "second1", "second2"]
    assert not list(tmp_path.glob("*.lock"))  # both removed at shutdown
    third = make(kind, path)  # the lock is free again
    assert third.path == str(path)
    third.shutdown()


def test_an_unreferenced_exporter_releases_its_lock(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    make("jaeger-json", path)  # never shut down, dropped at once
    assert not (tmp_path / "t.json.lock").exists()
    again = make("jaeger-json", path)
    assert again.path == str(path)
    again.shutdown()


def test_without_fcntl_there_is_no_lock(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "fcntl", None)  # import fcntl raises ImportError
    first, second = make("jaeger-json", tmp_path / "t.json"), make("otlp-json", tmp_path / "u")
    assert (first.path, second.path) == (str(tmp_path / "t.json"), str(tmp_path / "u"))
    assert first.export(spans(1)) is second.export(spans(1)) is SpanExportResult.SUCCESS
    first.shutdown()
    second.shutdown()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json", "u"]


def test_a_forked_child_does_not_release_the_parents_lock(tmp_path: Path) -> None:
    path = str(tmp_path / "t.json")
    held = files.claim(path, lambda *a, **k: None)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork() with threads, 3.12+
        pid = os.fork()
    if pid == 0:
        try:
            held.release()
        finally:
            os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    assert os.path.exists(path + ".lock")
    other = files.claim(path, lambda *a, **k: None)
    assert other.path != path  # still held by this process
    other.release()
    held.release()
    assert not os.path.exists(path + ".lock")


_CHILD = textwrap.dedent("""
    import os, sys, time
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from attnscope.exporters import JaegerJSONFileExporter, OTLPJSONFileExporter

    kind, path, tag, count, ready = sys.argv[1:]
    if kind == "jaeger-json":
        exporter = JaegerJSONFileExporter(path, flush_interval_s=0)
    else:
        exporter = OTLPJSONFileExporter(path)
    open(os.path.join(ready, tag), "w").close()
    deadline = time.monotonic() + 60
    while len(os.listdir(ready)) < 2:  # both exporters exist before either writes
        if time.monotonic() > deadline:
            sys.exit("the other process never started")
        time.sleep(0.01)
    provider = TracerProvider(resource=Resource.create({"service.name": tag}),
                              shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    for i in range(int(count)):
        provider.get_tracer("t").start_span(f"{tag}-{i}").end()
    exporter.shutdown()
    print(exporter.path)
""")


@pytest.mark.parametrize("kind", KINDS)
def test_two_processes_on_one_path_lose_nothing(tmp_path: Path, kind: str) -> None:
    out, ready = tmp_path / "out", tmp_path / "ready"
    out.mkdir()
    ready.mkdir()
    path = out / f"t{suffix(kind)}"
    count = 200
    procs = [subprocess.Popen([sys.executable, "-c", _CHILD, kind, str(path), tag, str(count),
                               str(ready)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for tag in ("p0", "p1")]
    results: list[tuple[str, str]] = []
    try:
        for proc in procs:
            results.append(proc.communicate(timeout=120))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()
    assert [p.returncode for p in procs] == [0, 0], results
    written = sorted(line.strip() for line, _ in results)
    assert str(path) in written and len(set(written)) == 2
    assert sum("another writer" in err for _, err in results) == 1
    found = [name for f in out.iterdir() for name in names_in(f)]
    expected = [f"{tag}-{i}" for tag in ("p0", "p1") for i in range(count)]
    assert sorted(found) == sorted(expected)  # every span, once, across the two files
    assert sorted(p.name for p in out.iterdir()) == sorted(Path(w).name for w in written)


def test_check_target_messages_name_the_setting() -> None:
    check: Callable[[str, str], None] = files.check_target
    with pytest.raises(ValueError, match=r"^attnscope: exporter: the path is empty"):
        check("", "exporter")
