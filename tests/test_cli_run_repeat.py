"""``attnscope run --repeat N [--alternate -- B]``: real programs run as subprocesses.

Programs that trace something are a few SDPA calls at sample rate 1 with no profile tier (about a
second and a half each, most of it torch's import); the others do not import torch at all.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from attnscope.cli import main
from attnscope.cli.run._repeat import split_alternate
from tests.support.cli_errors import usage_error

TIMEOUT = 180
TRACE_FILES = ["traces.jaeger.json", "traces.otlp.jsonl"]
RUN_FILES = ["run.json", *TRACE_FILES]  # a run that wrote spans says what it ran

# appends its label to ./log (the order of the runs), then makes --calls SDPA calls; exits with
# --fail-at's code at that call of the program (the count of lines in ./log)
APP = """
    import sys
    from pathlib import Path

    label, calls, fail = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    with open("log", "a") as log:
        log.write(label + "\\n")
    if calls:
        import torch
        import torch.nn.functional as F

        q = torch.randn(1, 2, 8, 16)
        for _ in range(calls):
            F.scaled_dot_product_attention(q, q, q, is_causal=True)
    print(label, "done", flush=True)
    if fail and len(Path("log").read_text().split()) == int(fail[0]):
        sys.exit(int(fail[1]))
"""


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("ATTNSCOPE_")}


def _app(tmp_path: Path) -> str:
    (tmp_path / "app.py").write_text(textwrap.dedent(APP))
    return "app.py"  # (the commands run in tmp_path)


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attnscope", "run", "--profile-rate", "0",
                           *args], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=TIMEOUT, check=False)


def _log(tmp_path: Path) -> list[str]:
    return (tmp_path / "log").read_text().split()


def _names(directory: Path) -> collections.Counter[str]:
    document = json.loads((directory / "traces.jaeger.json").read_text())
    return collections.Counter(s["operationName"] for t in document["data"] for s in t["spans"])


def _tree(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*"))


def _ours(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("attnscope run:")]


def test_repeat_writes_one_run_directory_per_run(tmp_path: Path) -> None:
    app = _app(tmp_path)
    out = tmp_path / "out"
    (out / "run-3").mkdir(parents=True)  # an earlier --repeat 3: replaced, run-3 too
    (out / "run-3" / "traces.jaeger.json").write_text("{}")
    (out / "traces.otlp.jsonl").write_text("an earlier plain run's lines\n")
    (out / "notes.txt").write_text("mine")
    done = _cli(tmp_path, "--repeat", "2", "--out", "out", "--", "python", app, "x", "4")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "x done\nx done\n"  # the program's stdout, each run's, untouched
    assert _log(tmp_path) == ["x", "x"]
    assert _tree(out) == ["notes.txt", "run-1", *[f"run-1/{n}" for n in RUN_FILES],
                          "run-2", *[f"run-2/{n}" for n in RUN_FILES]]
    for k in (1, 2):
        assert _names(out / f"run-{k}") == {"scaled_dot_product_attention": 4}
    lines = _ours(done.stderr)
    assert len(lines) == 4, done.stderr  # one per run, then two: what was written, what next
    assert lines[0].startswith("attnscope run: run 1 of 2: 4 spans in out/run-1 (")
    assert lines[1].startswith("attnscope run: run 2 of 2: 4 spans in out/run-2 (")
    assert lines[2] == f"attnscope run: 2 runs of python {app} x 4 in out: run-1, run-2"
    assert lines[3] == ("attnscope run: next: attnscope report out/run-1 (one run), or "
                        "attnscope diff out OTHER (against another --repeat directory)")
    # each run directory is what a plain run writes with --no-report
    plain = _cli(tmp_path, "--no-report", "--out", "plain", "--", "python", app, "x", "4")
    assert plain.returncode == 0, plain.stderr
    assert _tree(tmp_path / "plain") == RUN_FILES
    assert _names(tmp_path / "plain") == _names(out / "run-1")


def test_alternate_runs_a_and_b_in_turn(tmp_path: Path) -> None:
    app = _app(tmp_path)
    out = tmp_path / "out"
    done = _cli(tmp_path, "--repeat", "2", "--out", "out", "--", "python", app, "a", "2",
                "--alternate", "--", "python", app, "b", "3")
    assert done.returncode == 0, done.stderr
    assert _log(tmp_path) == ["a", "b", "a", "b"]
    assert _tree(out) == sorted(
        [side for side in ("a", "b")]
        + [f"{side}/run-{k}" for side in ("a", "b") for k in (1, 2)]
        + [f"{side}/run-{k}/{n}" for side in ("a", "b") for k in (1, 2) for n in RUN_FILES])
    for k in (1, 2):  # each command's runs in its own directory
        assert _names(out / "a" / f"run-{k}") == {"scaled_dot_product_attention": 2}
        assert _names(out / "b" / f"run-{k}") == {"scaled_dot_product_attention": 3}
    lines = _ours(done.stderr)
    assert [line.split(":")[1] for line in lines[:4]] == [
        " run 1 of 2 (a)", " run 1 of 2 (b)", " run 2 of 2 (a)", " run 2 of 2 (b)"]
    assert lines[2].startswith("attnscope run: run 2 of 2 (a): 2 spans in out/a/run-2 (")
    assert lines[4] == (f"attnscope run: 2 runs each, alternating: a = python {app} a 2 in "
                        f"out/a, b = python {app} b 3 in out/b")
    assert lines[5] == "attnscope run: next: attnscope diff out/a out/b"
    assert len(lines) == 6, done.stderr
    # a plain repeat into the same --out replaces the alternating one (a/ and b/ go)
    again = _cli(tmp_path, "--repeat", "1", "--out", "out", "--", "python", app, "c", "0")
    assert again.returncode == 0, again.stderr
    assert _tree(out) == ["run-1"]  # no spans (no torch): the run's directory, empty
    assert _ours(again.stderr)[0].startswith("attnscope run: run 1 of 1: no spans captured in "
                                             "out/run-1 (")
    assert _ours(again.stderr)[1] == f"attnscope run: 1 run of python {app} c 0 in out: run-1"


def test_a_failing_run_stops_the_repeat(tmp_path: Path) -> None:
    app = _app(tmp_path)
    out = tmp_path / "out"
    done = _cli(tmp_path, "--repeat", "3", "--out", "out", "--", "python", app, "x", "2",
                "2", "3")  # exits 3 in its second run, after its spans were written
    assert done.returncode == 3, done.stderr
    assert _log(tmp_path) == ["x", "x"]  # no third run
    assert _tree(out) == ["run-1", *[f"run-1/{n}" for n in RUN_FILES]]
    assert _names(out / "run-1") == {"scaled_dot_product_attention": 2}
    lines = _ours(done.stderr)
    assert lines[1].startswith("attnscope run: run 2 of 3 failed: the program exited with 3 (")
    assert lines[1].endswith("); its trace files are removed")
    assert lines[2] == "attnscope run: stopped (exit 3); runs kept in out: run-1"
    assert len(lines) == 3, done.stderr
    # alternating: b fails in its first run (the program's third line in ./log: a, b)
    (tmp_path / "log").unlink()
    done = _cli(tmp_path, "--repeat", "2", "--out", "out", "--", "python", app, "a", "0",
                "--alternate", "--", "python", app, "b", "0", "2", "5")
    assert done.returncode == 5, done.stderr
    assert _log(tmp_path) == ["a", "b"]
    assert _tree(out) == ["a", "a/run-1"]
    assert _ours(done.stderr)[1].startswith("attnscope run: run 1 of 2 (b) failed: the program "
                                            "exited with 5 (")
    assert _ours(done.stderr)[2] == "attnscope run: stopped (exit 5); runs kept in out: a/run-1"


def test_ctrl_c_stops_the_repeat_with_130(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text(textwrap.dedent("""
        import sys, time
        with open("log", "a") as log:
            log.write("run\\n")
        if len(open("log").read().split()) == 2:
            try:  # "waiting" inside: a Ctrl-C right after it is the program's to handle too
                print("waiting", flush=True)  # (outside, under load, it died by SIGINT: -2)
                time.sleep(60)
            except KeyboardInterrupt:
                sys.exit(0)  # a program that handles it: the repeat stops all the same
        print("done", flush=True)
    """))
    # a new session: no terminal, so SIGINT reaches the program only through attnscope
    with subprocess.Popen([sys.executable, "-m", "attnscope", "run", "--repeat", "3", "--out",
                           "out", "--", "python", str(app)], cwd=tmp_path, env=_env(),
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True) as proc:
        watchdog = threading.Timer(TIMEOUT, proc.kill)  # the reads below are bounded too
        watchdog.daemon = True
        watchdog.start()
        try:
            assert proc.stdout is not None and proc.stderr is not None
            assert proc.stdout.readline() == "done\n"
            assert proc.stdout.readline() == "waiting\n"
            proc.send_signal(signal.SIGINT)
            assert proc.wait(timeout=TIMEOUT) == 130
            stderr = proc.stderr.read()
        finally:
            watchdog.cancel()
    assert _log(tmp_path) == ["run", "run"]
    assert _tree(tmp_path / "out") == ["run-1"]
    lines = _ours(stderr)
    assert lines[1].startswith("attnscope run: run 2 of 3 interrupted (")
    assert lines[2] == "attnscope run: stopped (exit 130); runs kept in out: run-1"


def _bad(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    return usage_error(capsys, "run", argv)


def test_bad_input_is_one_line_and_nothing_runs(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    app = _app(tmp_path)
    assert "--repeat: must be an integer >= 1, got '0'" in _bad(capsys, ["--repeat", "0", "--",
                                                                         app, "x", "0"])
    assert "got 'two'" in _bad(capsys, ["--repeat", "two", "--", app, "x", "0"])
    assert "no program given before --alternate" in _bad(
        capsys, ["--repeat", "2", "--", "--alternate", "--", app, "x", "0"])
    assert "no program given after --alternate --" in _bad(
        capsys, ["--repeat", "2", "--", app, "x", "0", "--alternate", "--"])
    assert "missing.py: no such file" in _bad(
        capsys, ["--repeat", "2", "--", app, "x", "0", "--alternate", "--", "missing.py"])
    (tmp_path / "out" / "run-2").mkdir(parents=True)
    (tmp_path / "out" / "run-2" / "notes.txt").write_text("mine")
    (tmp_path / "out" / "run-2" / "traces.otlp.jsonl").write_text("")
    err = _bad(capsys, ["--repeat", "2", "--out", "out", "--", app, "x", "0"])
    assert "run-2 holds files attnscope did not write (notes.txt)" in err
    assert not (tmp_path / "log").exists()  # nothing ran
    assert _tree(tmp_path / "out") == ["run-2", "run-2/notes.txt", "run-2/traces.otlp.jsonl"]


def test_without_repeat_the_separator_is_the_programs(tmp_path: Path) -> None:
    """Plain ``run`` parses as before: every token after ``--`` is the program's."""
    app = tmp_path / "app.py"
    app.write_text("import sys\nprint(sys.argv[1:])\n")
    done = _cli(tmp_path, "--out", "out", "--", "python", str(app), "--alternate", "--", "b")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "['--alternate', '--', 'b']\n"
    assert _tree(tmp_path / "out") == []


def test_split_alternate() -> None:
    assert split_alternate(["a.py", "1"]) == (["a.py", "1"], None)
    assert split_alternate(["a.py", "--alternate", "--", "b.py", "--alternate", "--", "c"]) == (
        ["a.py"], ["b.py", "--alternate", "--", "c"])  # the first pair separates
    assert split_alternate(["a.py", "--alternate", "b.py"]) == (
        ["a.py", "--alternate", "b.py"], None)  # the pair, not the word alone
    assert split_alternate(["a.py", "--alternate", "--"]) == (["a.py"], [])


def test_help_says_how(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "attnscope run --repeat N [options] -- python a.py [args...] [--alternate -- python " \
           "b.py [args...]]" in text
    assert "DIR/a/run-K and DIR/b/run-K" in text and "`attnscope diff DIR/a DIR/b`" in text
