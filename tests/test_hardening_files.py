"""Issue 35 §4, §5, §10, §19: attnscope writes no file through a link, refuses directories other
users can write in, ``attnscope run`` ends by the program's signal and says what happened.

The CLI runs are subprocesses (bounded, ``OMP_NUM_THREADS=1``); no timing is asserted."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope import _safe_files
from attnscope.cli import main
from attnscope.cli._errors import CLIError
from attnscope.cli.render import writer
from attnscope.testing import capture_spans

TIMEOUT = 180
PRECIOUS = "the victim's own content\n"
SDPA_APP = """
    import os, sys, torch
    import torch.nn.functional as F
    q = torch.randn(1, 2, 4, 8)
    for _ in range(30):
        F.scaled_dot_product_attention(q, q, q)
    print("ready", flush=True)
"""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **extra}


def _cli(cwd: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attnscope", "run", *args], cwd=cwd,
                          env=_env(**extra), capture_output=True, text=True, timeout=TIMEOUT)


def _app(tmp_path: Path, source: str, name: str = "app.py") -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return str(path)


def _victim(tmp_path: Path, name: str = "victim.txt") -> Path:
    victim = tmp_path / name
    victim.write_text(PRECIOUS)
    return victim


# ---- §4: the shared writer -------------------------------------------------------------------


def test_a_link_at_the_name_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    link = tmp_path / "out" / "run.json"
    link.parent.mkdir()
    link.symlink_to(victim)
    with pytest.raises(_safe_files.UnsafePath) as caught:
        _safe_files.write_text(link, "{}")
    assert caught.value.filename == str(link) and "symbolic link" in str(caught.value.strerror)
    assert victim.read_text() == PRECIOUS
    assert os.listdir(link.parent) == ["run.json"]  # the temporary file is gone


def test_a_regular_file_is_replaced_whole(tmp_path: Path) -> None:
    target = tmp_path / "report.html"
    target.write_text("x" * 1000)
    _safe_files.write_text(target, "short")
    assert target.read_text() == "short" and os.listdir(tmp_path) == ["report.html"]


def test_directories_other_users_can_write_in_are_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # the attack: a directory every user can plant names in
    assert "writable by every user" in str(_safe_files.directory_problem(shared))
    shared.chmod(0o1777)  # sticky, and ours (as /tmp is root's): others cannot replace our files
    assert _safe_files.directory_problem(shared) is None
    shared.chmod(0o775)  # a group of the user's (umask 002 systems): accepted
    assert _safe_files.directory_problem(shared) is None
    mine = shared / "mine"
    mine.mkdir()
    shared.chmod(0o777)  # ours, inside a directory anyone could swap it out of: refused
    assert f"inside {shared}, which every user can write in" == \
        _safe_files.directory_problem(mine)
    shared.chmod(0o1777)
    assert _safe_files.directory_problem(mine) is None
    if os.geteuid() == 0:
        os.chown(shared, 65534, 65534)  # another user's, as the attacker's 0777 dir in /tmp
        assert "owned by another user" in str(_safe_files.directory_problem(shared))
    with pytest.raises(NotADirectoryError):
        _safe_files.directory_problem(_victim(tmp_path))


def test_safe_files_all_is_what_it_defines(tmp_path: Path) -> None:
    import types

    defined = {name for name, value in vars(_safe_files).items()
               if not name.startswith("_") and not isinstance(value, types.ModuleType)
               and getattr(value, "__module__", None) == _safe_files.__name__}
    assert sorted(_safe_files.__all__) == sorted(defined)
    _safe_files.check_writable(tmp_path)  # the probe leaves nothing behind
    assert os.listdir(tmp_path) == []


def test_cli_options_refuse_a_link(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    link = tmp_path / "r.json"
    link.symlink_to(victim)
    with pytest.raises(CLIError, match="symbolic link"):
        writer.check_output(str(link), "--json")
    with pytest.raises(CLIError, match="symbolic link"):
        writer.write_text(str(link), "{}", "--json")
    assert victim.read_text() == PRECIOUS
    writer.write_text(os.devnull, "{}", "--json")  # a device is written in place, not replaced


def test_run_refuses_an_out_directory_every_user_can_write_in(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert main(["run", "--out", str(shared), "--", sys.executable, "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert "writable by every user" in err and "choose a directory of your own" in err
    assert os.listdir(shared) == []


def test_run_writes_run_json_and_report_html_through_no_link(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    run_victim, report_victim = _victim(tmp_path, "a.txt"), _victim(tmp_path, "b.txt")
    (out / "run.json").symlink_to(run_victim)  # kept by clear_previous before the fix
    (out / "report.html").symlink_to(report_victim)
    done = _cli(tmp_path, "--out", "out", "--profile-rate", "0", "--", "python",
                _app(tmp_path, SDPA_APP))
    assert done.returncode == 0, done.stderr
    assert run_victim.read_text() == PRECIOUS and report_victim.read_text() == PRECIOUS
    assert not (out / "run.json").is_symlink()  # the link was removed, a file written instead
    assert json.loads((out / "run.json").read_text())["exit_code"] == 0, done.stderr
    assert "report.html: a symbolic link is there" in done.stderr  # refused, and said


# ---- §5: profile_dir -------------------------------------------------------------------------

PROFILE: dict[str, Any] = {"sample_rate": 1.0, "profile_rate": 1.0, "warmup_calls": 0}
Q = torch.randn(1, 2, 8, 16)


def _profile_paths(spans: list[Any]) -> list[str]:
    return [s.attributes["attnscope.profile.path"] for s in spans
            if "attnscope.profile.path" in (s.attributes or {})]


@attnscope.trace
def _sdpa(q: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, q, q)


def test_profiles_are_not_written_through_planted_links(tmp_path: Path,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "profiles"
    with capture_spans(profile_dir=str(directory), **PROFILE) as spans:
        _sdpa(Q)
    (first,) = _profile_paths(spans)
    # <site>-<pid>-<capture id>.pt.trace.json: the next calls' names, and the names of the files
    # the save went through before the fix, linked to a file of the victim's
    stem, _, rest = os.path.basename(first).rpartition("-")
    captured = int(rest.split(".")[0])
    os.unlink(first)
    victim = _victim(tmp_path)
    # capture ids count on for the whole process: the next calls' ids follow the first one's
    # (links at every id from 1 made 4 per capture the process had taken: 412k in a serial suite)
    for n in range(captured + 1, captured + 61):
        for suffix in ("", ".partial", ".partial.tmp", ".tmp"):
            (directory / f"{stem}-{n}.pt.trace.json{suffix}").symlink_to(victim)
    with caplog.at_level(logging.WARNING, logger="attnscope"), \
            capture_spans(profile_dir=str(directory), **PROFILE) as spans:
        for _ in range(3):
            assert torch.equal(_sdpa(Q), F.scaled_dot_product_attention(Q, Q, Q))
    assert victim.read_text() == PRECIOUS
    assert len(spans) >= 3 and _profile_paths(spans) == []  # not saved: links at the names
    assert all((directory / n).is_symlink() for n in os.listdir(directory))  # nothing left
    assert "a profile was not saved: a symbolic link is there" in caplog.text


def test_a_profile_dir_every_user_can_write_in_is_refused_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    directory = tmp_path / "profiles"
    directory.mkdir()
    directory.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger="attnscope"), \
            capture_spans(profile_dir=str(directory), **PROFILE) as spans:
        for _ in range(3):
            _sdpa(Q)
        assert attnscope.flush(timeout_s=30)
    assert len(spans) > 3 and _profile_paths(spans) == [] and os.listdir(directory) == []
    warned = [r for r in caplog.records if "profile_dir is writable by every user" in
              r.getMessage()]
    assert len(warned) == 1
    assert attnscope.stats()["worker_errors"] == 0


# ---- §10: the CLI ends by the program's signal -----------------------------------------------


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL])
def test_run_ends_by_the_signal_that_ended_the_program(tmp_path: Path, signum: int) -> None:
    app = _app(tmp_path, f"""
        import os, signal
        if {int(signum)} != signal.SIGKILL:
            signal.signal({int(signum)}, signal.SIG_DFL)
        os.kill(os.getpid(), {int(signum)})
    """)
    done = _cli(tmp_path, "--out", "out", "--", "python", app)
    assert done.returncode == -signum, done.stderr  # WIFSIGNALED, not an exit of 128 + N
    assert f"killed by {signal.Signals(signum).name}" in done.stderr  # said before it ended


def test_run_from_python_returns_128_plus_the_signal(tmp_path: Path) -> None:
    code = "import os, signal; os.kill(os.getpid(), signal.SIGTERM)"
    assert main(["run", "--out", str(tmp_path / "out"), "--", sys.executable, "-c", code]) == \
        128 + signal.SIGTERM


def test_run_repeat_ends_by_the_signal_too(tmp_path: Path) -> None:
    app = _app(tmp_path, "import os, signal\nos.kill(os.getpid(), signal.SIGTERM)\n")
    done = _cli(tmp_path, "--out", "out", "--repeat", "2", "--", "python", app)
    assert done.returncode == -signal.SIGTERM, done.stderr
    assert "stopped (exit 143)" in done.stderr


# ---- §19: what the run says when it wrote nothing --------------------------------------------

PLANTED_APP = SDPA_APP + """
    d = os.environ["ATTNSCOPE_RUN_DIR"]
    for name in ("traces.jaeger.json", "traces.otlp.jsonl"):
        os.symlink(sys.argv[1], os.path.join(d, name))
"""


def test_run_says_the_export_failed_not_that_nothing_was_sampled(tmp_path: Path) -> None:
    victim = _victim(tmp_path)
    done = _cli(tmp_path, "--out", "out", "--profile-rate", "0", "--", "python",
                _app(tmp_path, PLANTED_APP), str(victim))
    assert done.returncode == 0
    assert victim.read_text() == PRECIOUS
    assert "no attention call was sampled" not in done.stderr
    assert "30 attention calls were sampled, but no trace file was written" in done.stderr
    assert "failed to export" in done.stderr


def test_run_says_the_program_was_killed_not_that_nothing_was_sampled(tmp_path: Path) -> None:
    app = _app(tmp_path, SDPA_APP + "    import time\n    time.sleep(120)\n")
    # a long export delay: the 30 spans wait in the export queue until the exit flush
    with subprocess.Popen([sys.executable, "-m", "attnscope", "run", "--out", "out",
                           "--profile-rate", "0", "--", "python", app], cwd=tmp_path,
                          env=_env(OTEL_BSP_SCHEDULE_DELAY="600000"), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, start_new_session=True) as proc:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "ready\n"
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == -signal.SIGTERM
    assert "no attention call was sampled" not in err
    assert "the program was killed by SIGTERM" in err and "whatever it sampled was lost" in err


def test_run_still_says_when_nothing_was_sampled(tmp_path: Path) -> None:
    app = _app(tmp_path, "import torch\nprint('no attention here')\n")
    done = _cli(tmp_path, "--out", "out", "--", "python", app)
    assert done.returncode == 0 and done.stdout == "no attention here\n"
    assert "no attention call was sampled in the 1 process(es) of the program that imported " \
        "torch" in done.stderr
    done = _cli(tmp_path, "--out", "out", "--", "python", "-c", "pass")
    assert "no process of the program imported torch" in done.stderr


def test_status_lines_are_written_only_to_the_clis_own_pipe(tmp_path: Path) -> None:
    from attnscope.cli.run import _status

    channel = _status.Channel()
    fd = int(channel.env[_status.ENV_STATUS].split(":")[0])
    _status.at_exit(channel.env)
    _status.at_exit({_status.ENV_STATUS: f"{fd}:1"})  # another inode: not ours, nothing written
    (report,) = channel.reports()
    assert report["pid"] == os.getpid() and set(_status.COUNTS) <= set(report)


# ---- §11 (the CLI's side): the program's stdout stays its own --------------------------------


def test_console_exporters_left_in_the_shell_keep_the_programs_stdout_clean(
        tmp_path: Path) -> None:
    """``attnscope run -- python app.py | jq .`` (docs/cli.md), with OTEL_*_EXPORTER=console
    left in the environment: their output goes to stderr, the pipe gets the program's JSON."""
    app = _app(tmp_path, SDPA_APP.replace('print("ready", flush=True)', 'print(\'{"ok": 1}\')'))
    done = _cli(tmp_path, "--out", "out", "--profile-rate", "0", "--", "python", app,
                OTEL_METRICS_EXPORTER="console", OTEL_TRACES_EXPORTER="console",
                OTEL_LOGS_EXPORTER="console", ATTNSCOPE_METRICS="true")
    assert done.returncode == 0, done.stderr
    assert done.stdout == '{"ok": 1}\n'
    assert json.loads(done.stdout) == {"ok": 1}
    assert "30 spans written" in done.stderr


# ---- a document written in pieces ---------------------------------------------------------------


@pytest.mark.parametrize("written", [None, 0, 1, 5, 9, 10, 2000])
def test_pieces_land_in_order_whatever_each_writev_call_takes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: int | None) -> None:
    """``write_bytes`` of pieces: the file is their concatenation when ``os.writev`` writes only
    part of a group (``written`` bytes of each call), or is missing (None)."""
    pieces = [b"{", bytearray(b"abc"), b"", b"defgh", bytearray(b"ij"), b"}"] * 300
    real = os.writev

    def short(fd: int, buffers: Any) -> int:
        data = b"".join(buffers)
        return real(fd, [data[:written]]) if written else 0

    if written is None:
        monkeypatch.delattr(os, "writev")
    else:
        monkeypatch.setattr(os, "writev", short)
    path = tmp_path / "doc.json"
    _safe_files.write_bytes(path, pieces, durable=True)
    assert path.read_bytes() == b"".join(pieces)
