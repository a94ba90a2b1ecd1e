"""Profile on demand: `attnscope trigger` writes a control file the worker reads (issue 14,
part 1). The file is trusted only in a 0700 directory of this user."""

from __future__ import annotations

import json
import os
import pathlib
import stat
import time
from typing import Any

import pytest
import torch

import attnscope
from attnscope import _trigger_files as trigger_files
from attnscope._worker import control
from attnscope.cli import main
from attnscope.testing import capture_spans


@attnscope.trace
def g(x: torch.Tensor) -> torch.Tensor:
    return x + 1


@attnscope.trace
def other(x: torch.Tensor) -> torch.Tensor:
    return x


@pytest.fixture
def tdir(tmp_path: pathlib.Path) -> str:
    d = tmp_path / "trig"
    d.mkdir(mode=0o700)
    return str(d)


def _until_consumed(path: str, *calls: Any) -> None:
    """Make calls (each sampled call wakes the worker) until it has read the trigger."""
    x = torch.zeros(4)
    deadline = time.monotonic() + 20
    while os.path.exists(path) and time.monotonic() < deadline:
        for fn in calls:
            fn(x)
        attnscope.flush()
        time.sleep(0.05)
    assert not os.path.exists(path)


def test_cli_trigger_profiles_the_next_sampled_calls_of_matching_sites(tdir: str) -> None:
    x = torch.zeros(4)
    with capture_spans(trigger_dir=tdir) as spans:
        g(x)  # the worker runs
        attnscope.flush()  # and has looked at the directory once: it advertised itself there
        assert main(["trigger", "--pid", str(os.getpid()), "--calls", "3", "--site", "*.g:*",
                     "--dir", tdir]) == 0
        _until_consumed(trigger_files.trigger_path(tdir, os.getpid()), other)
        for _ in range(6):
            other(x)
            g(x)
    on_demand = [s for s in spans if s.attributes.get("attnscope.trigger") == "on_demand"]
    assert len(on_demand) == 3
    assert all(s.name == "g" and s.attributes["attnscope.tier"] == "profile" for s in on_demand)
    assert not [s for s in spans
                if s.name == "other" and s.attributes["attnscope.tier"] != "timing"]
    stats = attnscope.stats()
    assert stats["on_demand_granted"] == 3 and stats["on_demand_remaining"] == 0


def test_triggered_calls_respect_the_users_profiler(tdir: str) -> None:
    x = torch.zeros(4)
    with capture_spans(trigger_dir=tdir) as spans:
        g(x)
        path = trigger_files.write(tdir, os.getpid(), 2, "*")
        _until_consumed(path, other)
        with torch.profiler.profile():
            g(x)
            g(x)
    on_demand = [s for s in spans if s.attributes.get("attnscope.trigger") == "on_demand"]
    assert len(on_demand) == 2 and all(s.attributes["attnscope.tier"] == "timing"
                                       for s in on_demand)
    assert attnscope.stats()["profile_skipped_user_profiler"] == 2


def test_off_means_the_file_is_not_read(tdir: str) -> None:
    x = torch.zeros(4)
    with capture_spans(trigger_dir=tdir, live_trigger=False):
        path = trigger_files.write(tdir, os.getpid(), 2, "*")
        for _ in range(3):
            g(x)
            attnscope.flush()
    assert os.path.exists(path) and attnscope.stats()["on_demand_granted"] == 0


def test_a_directory_others_can_enter_is_not_trusted(tmp_path: pathlib.Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "open"
    d.mkdir(mode=0o700)
    trigger_files.write(str(d), 123, 2, "*")
    trigger_files.advertise(str(d))
    os.chmod(d, 0o755)
    with pytest.raises(ValueError, match="permissions"):
        trigger_files.read(str(d), 123)
    assert main(["trigger", "--pid", str(os.getpid()), "--dir", str(d)]) == 2
    assert "unsafe trigger directory" in capsys.readouterr().err


def test_files_that_are_not_this_users_plain_trigger_are_refused(tdir: str) -> None:
    path = trigger_files.write(tdir, 1, 2, "*")
    os.chmod(path, 0o666)
    with pytest.raises(ValueError, match="regular file"):
        trigger_files.read(tdir, 1)
    os.unlink(path)
    target = pathlib.Path(tdir) / "elsewhere"
    target.write_text('{"calls": 2, "site": "*"}')
    os.symlink(target, path)
    with pytest.raises(ValueError, match="regular file"):
        trigger_files.read(tdir, 1)
    os.unlink(path)
    pathlib.Path(path).write_text('{"calls": 0}')
    with pytest.raises(ValueError, match="calls"):
        trigger_files.read(tdir, 1)
    assert not os.path.exists(path)  # a bad trigger is consumed, not read every second


def test_write_is_atomic_and_read_consumes(tdir: str) -> None:
    path = trigger_files.write(tdir, 42, 5, "*Attention*")
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert os.listdir(tdir) == ["42.trigger"]  # no temporary file left
    assert trigger_files.read(tdir, 42) == (5, "*Attention*")
    assert trigger_files.read(tdir, 42) is None


def _one_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("attnscope trigger: error: "), err
    return err


def test_a_process_without_attnscope_is_refused(tdir: str,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    """`sleep 300` never reads a trigger: refused, and no file is left for nothing to read."""
    import subprocess

    sleeper = subprocess.Popen(["sleep", "300"])
    try:
        assert main(["trigger", "--pid", str(sleeper.pid), "--dir", tdir]) == 2
        assert "no attnscope worker" in _one_line(capsys)
        assert os.listdir(tdir) == []
        # a stale advertisement of a process that had this pid before is not believed either
        path = trigger_files.worker_path(tdir, sleeper.pid)
        pathlib.Path(path).write_text(json.dumps({"version": 1, "pid": sleeper.pid,
                                                  "started": 1}))
        os.chmod(path, 0o600)
        assert main(["trigger", "--pid", str(sleeper.pid), "--dir", tdir]) == 2
        assert "no attnscope worker" in _one_line(capsys)
    finally:
        sleeper.kill()
        sleeper.wait()


def test_the_worker_advertises_itself_until_exit(tdir: str) -> None:
    x = torch.zeros(4)
    gone = trigger_files.worker_path(tdir, 999_999_999)  # a process that crashed: swept
    pathlib.Path(gone).write_text("{}")
    with capture_spans(trigger_dir=tdir):
        g(x)
        attnscope.flush()
        assert trigger_files.advertised(tdir, os.getpid())
        assert sorted(os.listdir(tdir)) == [f"{os.getpid()}.worker"]
    assert os.stat(trigger_files.worker_path(tdir, os.getpid())).st_mode & 0o777 == 0o600
    code = ("import os, sys, torch, attnscope\n"
            "attnscope.configure(trigger_dir=sys.argv[1], exporter='none', sample_rate=1.0,"
            " warmup_calls=0)\n"
            "attnscope.trace(lambda x: x)(torch.zeros(1)); attnscope.flush()\n"
            "print(os.path.exists(os.path.join(sys.argv[1], f'{os.getpid()}.worker')))\n")
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code, tdir], capture_output=True, text=True,
                          timeout=120, check=False)
    assert done.stdout.strip() == "True", done.stderr
    assert sorted(os.listdir(tdir)) == [f"{os.getpid()}.worker"]  # the child's: gone at its exit


def test_a_squatted_shared_directory_is_passed_over(tmp_path: pathlib.Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """No XDG_RUNTIME_DIR: another user created <tmp>/attnscope-<uid> first."""
    env = {"TMPDIR": str(tmp_path / "tmp"), "HOME": str(tmp_path / "home")}
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(trigger_files.tempfile, "tempdir", None)
    shared = tmp_path / "tmp" / f"attnscope-{os.getuid()}"
    assert trigger_files.default_dir(env) == str(shared)  # missing: it is created 0700 when written
    shared.mkdir(mode=0o700)
    assert trigger_files.default_dir(env) == str(shared)  # this user's own
    other = os.getuid() + 1
    monkeypatch.setattr(trigger_files.os, "getuid", lambda: other)
    shared.rename(tmp_path / "tmp" / f"attnscope-{trigger_files.os.getuid()}")  # someone else's now
    fallback = trigger_files.default_dir(env)
    assert fallback.startswith(str(tmp_path / "home" / ".cache" / "attnscope" / "control-"))
    monkeypatch.undo()
    (tmp_path / "tmp" / f"attnscope-{os.getuid() + 1}").rename(shared)
    os.chmod(shared, 0o777)  # this user's, but open to others: not trusted either
    monkeypatch.setattr(trigger_files.tempfile, "tempdir", None)
    fallback = trigger_files.default_dir(env)
    assert fallback.startswith(str(tmp_path / "home"))
    path = trigger_files.write(fallback, 42, 1, "*")
    assert trigger_files.read(fallback, 42) == (1, "*") and not os.path.exists(path)
    assert stat.S_IMODE(os.stat(fallback).st_mode) == 0o700


def test_cli_rejects_bad_input(tdir: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["trigger", "--pid", "999999999", "--dir", tdir]) == 2
    assert "no process" in capsys.readouterr().err
    assert main(["trigger", "--pid", str(os.getpid()), "--calls", "100000", "--dir", tdir]) == 2
    with pytest.raises(SystemExit):
        main(["trigger", "--pid", "0"])


def test_trigger_files_all_is_what_it_defines() -> None:
    import types

    for module in (trigger_files, control):
        defined = {name for name, value in vars(module).items()
                   if not name.startswith("_") and not isinstance(value, types.ModuleType)
                   and getattr(value, "__module__", module.__name__) == module.__name__}
        assert sorted(module.__all__) == sorted(defined), module.__name__


def test_poll_rate_limited(monkeypatch: pytest.MonkeyPatch, tmp_path: pathlib.Path) -> None:
    nowhere = tmp_path / "none"
    now = [0.0]
    poller = control.ControlFile(every_s=1.0, clock=lambda: now[0])
    calls: list[int] = []
    real = trigger_files.read

    def counting(d: str, pid: int) -> Any:
        calls.append(pid)
        return real(d, pid)

    monkeypatch.setattr(trigger_files, "read", counting)
    for t in (0.0, 0.3, 0.9, 1.0, 1.5, 2.2):
        now[0] = t
        poller.poll(str(nowhere))
    assert len(calls) == 3  # at 0.0, 1.0 and 2.2


_SERVICE = """
import json, os, sys, time
import torch
import attnscope

out, ready, stop = sys.argv[1], sys.argv[2], sys.argv[3]
torch.set_num_threads(1)  # a tiny call: no wait on a descheduled OpenMP thread of a busy machine
attnscope.configure(exporter="otlp-json:" + out, sample_rate=0.2, warmup_calls=0,
                    profile_rate=0.0, overhead_budget=1.0, slow_call_quantile=1.0)

@attnscope.trace(name="serve.attention")
def attention(q):
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)

q = torch.randn(1, 2, 16, 8)
open(ready, "w").close()
deadline = time.monotonic() + 60
while not os.path.exists(stop) and time.monotonic() < deadline:
    attention(q)
    time.sleep(0.001)
attnscope.shutdown(10)
print(json.dumps(attnscope.stats()))
"""


def test_trigger_from_another_process_profiles_a_running_service(tmp_path: pathlib.Path) -> None:
    """As an operator would: a service samples 20% of its calls and profiles none; from a second
    process, ``attnscope trigger --pid`` asks for 4 profiles; they arrive, marked on_demand."""
    import json
    import subprocess
    import sys

    tdir = tmp_path / "trig"
    tdir.mkdir(mode=0o700)
    out, ready, stop = tmp_path / "spans.jsonl", tmp_path / "ready", tmp_path / "stop"
    env = {**os.environ, "ATTNSCOPE_TRIGGER_DIR": str(tdir)}
    service = subprocess.Popen([sys.executable, "-c", _SERVICE, str(out), str(ready), str(stop)],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists() and time.monotonic() < deadline and service.poll() is None:
            time.sleep(0.05)
        assert ready.exists(), service.communicate(timeout=5)
        # its worker says it is listening at its first wake-up (the trigger is refused before)
        advertised = trigger_files.worker_path(str(tdir), service.pid)
        while not os.path.exists(advertised) and time.monotonic() < deadline:
            time.sleep(0.05)
        done = subprocess.run([sys.executable, "-m", "attnscope", "trigger", "--pid",
                               str(service.pid), "--calls", "4", "--site", "serve.*"],
                              env=env, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        trigger = trigger_files.trigger_path(str(tdir), service.pid)
        while os.path.exists(trigger) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not os.path.exists(trigger)  # consumed by the service's worker
        # the next 4 sampled calls are profiled: at 20% a few seconds of calls hold far more
        # than 4 sampled ones however slowly a busy machine runs the loop
        time.sleep(3.0)
    finally:
        stop.touch()
        stdout, stderr = service.communicate(timeout=60)
    assert service.returncode == 0, stderr
    stats = json.loads(stdout.strip().splitlines()[-1])
    spans = [s for line in out.read_text().splitlines() if line.strip()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    def tag(span: dict[str, Any], key: str) -> Any:
        return next((a["value"] for a in span.get("attributes", []) if a["key"] == key), None)
    on_demand = [s for s in spans if tag(s, "attnscope.trigger") == {"stringValue": "on_demand"}]
    assert len(on_demand) == 4 == stats["on_demand_granted"]
    assert all(tag(s, "attnscope.tier") == {"stringValue": "profile"} for s in on_demand)
    profiled = [s for s in spans if tag(s, "attnscope.tier") == {"stringValue": "profile"}]
    assert len(profiled) == 4  # the service profiles nothing at random


@pytest.mark.parametrize("argv", [["trigger", "--pid", "1", "--dir", "/nonexistent-x"],
                                  ["--version"], ["trigger", "--help"], ["--help"],
                                  ["report", "/nonexistent-x"], ["diff", "--help"],
                                  ["run", "--", "/nonexistent-x.py"]])
def test_commands_that_run_no_model_do_not_import_torch(argv: list[str]) -> None:
    """`attnscope trigger`, the command list and the commands that read files start in
    milliseconds: neither torch nor the library's API."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "attnscope", *argv],
                          capture_output=True, text=True, timeout=120, check=False)
    imported = [line.split("|")[-1].strip() for line in done.stderr.splitlines()
                if line.startswith("import time:")]
    assert imported and "attnscope" in imported, done.stderr[-2000:]
    assert not [m for m in imported if m == "torch" or m.startswith("torch.")], done.stderr[-500:]
    assert "attnscope._api" not in imported
    assert done.returncode == (2 if "-x" in argv[-1] else 0), done.stderr[-500:]
