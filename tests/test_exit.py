"""Spans captured before a normal interpreter exit are exported, without an explicit flush().

Regression (issue 10): the worker built its pipeline after interpreter shutdown had begun, when
concurrent.futures (used by the SDK's resource detection) already refused new work, so some runs
wrote no file at all. Each run is a fresh interpreter; several run at once, which adds the load
that made the race likely.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

RUNS = 20  # processes for the plain-exit script; the defect showed in 1 to 5 of 10 runs
PARALLEL = 4

# The six-line script of the report: no flush(), no shutdown(). The hook registered first runs
# last, after attnscope's exit flush, and prints how many calls were captured (all 10: an explicit
# sample rate has no overhead budget since issue 38 §1; the count is compared, not assumed).
_PLAIN = textwrap.dedent(
    """
    import atexit
    atexit.register(lambda: print("captured", __import__("attnscope").stats()["captured"]))
    import attnscope
    attnscope.configure(exporter="jaeger-json:OUT", sample_rate=1.0, warmup_calls=0)
    @attnscope.trace
    def f(x):
        return x + 1
    for i in range(10):
        f(i)
    """
)

# A daemon thread still calling traced code while the main thread exits. With the overhead budget
# (asked for: an explicit sample rate has none unless overhead_budget is set, issue 38 §1), so
# the hot loop samples a bounded share: every call of it would fill the capture queue, and exit
# (5 s at most) cannot turn 4,096 captures into spans on a loaded machine.
_DAEMON = textwrap.dedent(
    """
    import threading
    import attnscope
    attnscope.configure(exporter="jaeger-json:OUT", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=0.01)
    @attnscope.trace
    def f(x):
        return x + 1
    started = threading.Event()
    def loop():
        while True:
            f(1)
            started.set()
    threading.Thread(target=loop, daemon=True).start()
    started.wait(30)
    for i in range(10):
        f(i)
    """
)


def _env() -> dict[str, str]:
    """The environment of a user's shell: none of the suite's ATTNSCOPE_/OTEL_ settings."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}


def _run_all(script: str, outs: list[Path]) -> list[subprocess.CompletedProcess[str]]:
    done: list[subprocess.CompletedProcess[str]] = []
    for start in range(0, len(outs), PARALLEL):
        procs = [(subprocess.Popen([sys.executable, "-c", script.replace("OUT", str(out))],
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                   env=_env()), out)
                 for out in outs[start:start + PARALLEL]]
        for proc, _ in procs:
            stdout, stderr = proc.communicate(timeout=120)
            done.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    return done


def _spans(path: Path) -> list[dict[str, object]]:
    return [s for trace in json.loads(path.read_text())["data"] for s in trace["spans"]]


def _captured(stdout: str) -> int:
    return int(stdout.split("captured", 1)[1].split()[0]) if "captured" in stdout else -1


def _problems(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines()
            if "Traceback" in line or "attnscope internal error" in line]


def test_every_span_is_exported_at_normal_exit_without_flush(tmp_path: Path) -> None:
    outs = [tmp_path / f"run{i}.json" for i in range(RUNS)]
    results = _run_all(_PLAIN, outs)
    failures = []
    for out, done in zip(outs, results, strict=True):
        if done.returncode != 0 or _problems(done.stderr):
            failures.append(f"{out.name}: rc={done.returncode} stderr={done.stderr[-2000:]}")
        elif not out.exists():
            failures.append(f"{out.name}: no file written")
        elif len(_spans(out)) != _captured(done.stdout) or _captured(done.stdout) < 1:
            failures.append(f"{out.name}: {len(_spans(out))} spans, {done.stdout.strip()}")
    assert not failures, f"{len(failures)} of {RUNS} runs lost spans:\n" + "\n".join(failures)


# Python 3.12.0 and 3.12.1 refuse any new thread once the interpreter is finishing, atexit
# handlers included (CPython gh-113964, fixed in 3.12.2): exit's flush ran on a helper thread
# and lost every span of the last batch ("internal error in shutdown: RuntimeError"). Played
# here on any Python: once the pipeline is built, no thread may start.
_NO_THREADS_AT_EXIT = textwrap.dedent(
    """
    import atexit, threading
    import attnscope
    attnscope.configure(exporter="jaeger-json:OUT", sample_rate=1.0, warmup_calls=0)
    @attnscope.trace
    def f(x):
        return x + 1
    f(0)
    attnscope.flush()  # the pipeline is built
    def refuse(self):
        raise RuntimeError("can't create new thread at interpreter shutdown")
    atexit.register(setattr, threading.Thread, "start", refuse)  # runs before attnscope's
    for i in range(10):
        f(i)
    atexit.register(lambda: print("captured", attnscope.stats()["captured"]))
    """
)


def test_exit_exports_where_no_thread_may_start(tmp_path: Path) -> None:
    out = tmp_path / "t.json"
    (done,) = _run_all(_NO_THREADS_AT_EXIT, [out])
    assert done.returncode == 0 and not _problems(done.stderr), done.stderr
    assert len(_spans(out)) == _captured(done.stdout) == 11, done.stdout


def test_daemon_thread_tracing_during_exit_is_quiet(tmp_path: Path) -> None:
    outs = [tmp_path / f"daemon{i}.json" for i in range(PARALLEL)]
    for out, done in zip(outs, _run_all(_DAEMON, outs), strict=True):
        assert done.returncode == 0, done.stderr[-2000:]
        assert not _problems(done.stderr), done.stderr[-2000:]
        assert out.exists()
        names = [s["operationName"] for s in _spans(out)]
        assert len(names) >= 11 and set(names) == {"f"}


# A non-daemon thread that keeps tracing after the main thread returned: atexit runs after it.
# No overhead budget: the test counts every call, and on a loaded machine the first call (it
# imports the worker) ends the budget's first 1 s window, after which these cheap calls were
# rightly sampled at 10%.
_NON_DAEMON = textwrap.dedent(
    """
    import threading, time
    import attnscope
    attnscope.configure(exporter="jaeger-json:OUT", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0)
    @attnscope.trace
    def f(x):
        return x + 1
    def late():
        time.sleep(0.3)
        for i in range(5):
            f(i)
    threading.Thread(target=late).start()
    for i in range(10):
        f(i)
    """
)


def test_spans_of_non_daemon_threads_after_main_returned_are_exported(tmp_path: Path) -> None:
    out = tmp_path / "late.json"
    (done,) = _run_all(_NON_DAEMON, [out])
    assert done.returncode == 0 and not _problems(done.stderr), done.stderr[-2000:]
    assert len(_spans(out)) == 15


def test_no_worker_starts_once_the_exit_flush_began() -> None:
    import attnscope
    from attnscope._runtime import runtime

    @attnscope.trace
    def f(x: int) -> int:
        return x + 1

    attnscope.configure(sample_rate=1.0, warmup_calls=0)
    runtime.worker.exiting = True
    assert f(1) == 2
    assert runtime.worker.current is None


# ---- an uncaught Ctrl-C ends the process by SIGINT (issue 20) ---------------------------------
# CPython re-raises SIGINT after finalisation when the main module ended with an uncaught
# KeyboardInterrupt; any exec() of a source string clears that, and attnscope's exit work (the SDK
# import for the file exporter's empty document, the worker's export) does such execs. Status 1
# instead of 130 in 8/8 and 11/22 runs before the fix. A shell sees 130 for -SIGINT.
_SIGINT_STATUSES = (-signal.SIGINT, 128 + signal.SIGINT)

_CTRL_C_NOTHING_SAMPLED = textwrap.dedent(
    """
    import attnscope
    attnscope.configure(exporter="jaeger-json:OUT")
    raise KeyboardInterrupt
    """
)

# A traced loop that a real SIGINT stops; "ready" once the worker is exporting.
_CTRL_C_LOOP = textwrap.dedent(
    """
    import attnscope
    attnscope.configure(exporter="jaeger-json:OUT", sample_rate=1.0, warmup_calls=0)
    @attnscope.trace
    def f(x):
        return x + 1
    n = 0
    while True:
        f(n)
        n += 1
        if n == 200:
            print("ready", flush=True)
    """
)


def test_uncaught_keyboard_interrupt_exits_by_sigint(tmp_path: Path) -> None:
    outs = [tmp_path / f"ki{i}.json" for i in range(PARALLEL * 2)]
    for out, done in zip(outs, _run_all(_CTRL_C_NOTHING_SAMPLED, outs), strict=True):
        assert done.returncode in _SIGINT_STATUSES, (done.returncode, done.stderr[-2000:])
        assert "KeyboardInterrupt" in done.stderr and "attnscope internal error" not in done.stderr
        assert json.loads(out.read_text()) == {"data": []}  # the exit work still ran


def test_sigint_in_a_traced_loop_exits_by_sigint(tmp_path: Path) -> None:
    statuses = []
    for i in range(4):
        out = tmp_path / f"loop{i}.json"
        proc = subprocess.Popen([sys.executable, "-c", _CTRL_C_LOOP.replace("OUT", str(out))],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env())
        assert proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "ready"
            proc.send_signal(signal.SIGINT)
            _, stderr = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        statuses.append(proc.returncode)
        assert "attnscope internal error" not in stderr, stderr[-2000:]
        assert _spans(out), "spans captured before the Ctrl-C were not exported at exit"
    assert all(rc in _SIGINT_STATUSES for rc in statuses), statuses


# An import attnscope's own thread has in progress at exit (the spare worker thread importing the
# worker side) ends after attnscope's exit hooks unless they wait for it: 2 of 30 runs of the
# script above still ended with status 1 that way. Here that import is slow and certain, and an
# exit hook of the application's (registered first, so it runs last) keeps the process alive
# while it ends.
_CTRL_C_IMPORT_IN_FLIGHT = textwrap.dedent(
    """
    import atexit, threading, time
    atexit.register(time.sleep, 2.0)
    import attnscope
    from attnscope._runtime import runtime
    attnscope.configure(exporter="none")
    holding = threading.Event()
    def slow_import():
        with runtime.worker.import_lock:
            holding.set()
            time.sleep(1.0)
            exec("x = 1")  # what creating a dataclass does
    threading.Thread(target=slow_import, daemon=True).start()
    holding.wait(30)
    raise KeyboardInterrupt
    """
)


def test_ctrl_c_waits_for_an_import_of_attnscopes_thread(tmp_path: Path) -> None:
    outs = [tmp_path / f"held{i}.json" for i in range(PARALLEL)]
    for done in _run_all(_CTRL_C_IMPORT_IN_FLIGHT, outs):
        assert done.returncode in _SIGINT_STATUSES, (done.returncode, done.stderr[-2000:])


# Only an uncaught KeyboardInterrupt of the main module ends by SIGINT; every other ending keeps
# its status, also where a KeyboardInterrupt was printed (a console) or subclassed.
_OTHER_ENDINGS = {
    "raise SystemExit(3)": 3,
    "raise ValueError('x')": 1,
    "class Stop(KeyboardInterrupt): pass\nraise Stop": 1,
    "import code\ncode.InteractiveInterpreter().runsource('raise KeyboardInterrupt')": 0,
    "try:\n    raise KeyboardInterrupt\nexcept KeyboardInterrupt:\n    pass": 0,
}


def test_other_endings_keep_their_exit_status(tmp_path: Path) -> None:
    procs = []
    for i, ending in enumerate(_OTHER_ENDINGS):
        out = tmp_path / f"{i}.json"
        script = f'import attnscope\nattnscope.configure(exporter="jaeger-json:{out}")\n'
        procs.append(subprocess.Popen([sys.executable, "-c", script + ending], env=_env(),
                                      text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    for proc, (ending, status) in zip(procs, _OTHER_ENDINGS.items(), strict=True):
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == status, (ending, proc.returncode, stderr[-2000:])


# ---- issue 38 §1: a collector that is not there costs exit no export wait ----------------------


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again: connecting is refused


def _otlp_pipeline(port: int) -> Any:
    from types import SimpleNamespace

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    return SimpleNamespace(local=False,
                           exporter=OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces"))


def test_exit_gives_an_endpoint_that_refuses_no_export_wait(
        caplog: pytest.LogCaptureFixture) -> None:
    """The window exit gives the exporters (README: "exit waits at most 2 s" was 2.5-3.4 s added
    with nothing listening, issue 38 §1). The time itself is measured by a benchmark, not here."""
    import logging
    import socket
    from types import SimpleNamespace

    from attnscope._worker import at_exit

    caplog.set_level(logging.WARNING, logger="attnscope")
    assert at_exit.export_window(SimpleNamespace(local=True, exporter=None)) is None  # a file
    port = _closed_port()
    assert at_exit.export_window(_otlp_pipeline(port)) == at_exit._EXIT_REFUSED_S
    assert at_exit._EXIT_REFUSED_S < at_exit._EXIT_EXPORT_S
    # said once, before exit's own line about undelivered spans (which then stays quiet)
    said = [r.getMessage() for r in caplog.records if "nothing is listening" in r.getMessage()]
    assert said == [said[0]] and f"127.0.0.1:{port}" in said[0]
    with socket.socket() as listener:  # a collector that is there: the usual wait
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        assert at_exit.export_window(_otlp_pipeline(listener.getsockname()[1])) == \
            at_exit._EXIT_EXPORT_S


def test_the_exit_flush_is_given_that_window(monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from attnscope._runtime import runtime
    from attnscope._worker import at_exit

    pipeline = _otlp_pipeline(_closed_port())
    monkeypatch.setattr(runtime.worker, "exit_wait_s", 1.5)
    # put back after: _at_exit sets it
    monkeypatch.setattr(runtime.worker, "exiting", runtime.worker.exiting)
    monkeypatch.setattr("attnscope._export.pipeline.report_undelivered", lambda pipeline: None)
    given: list[tuple[float, float | None]] = []
    worker = runtime.worker.current
    # not monkeypatch: the suite's own shutdown after the test must not find the stand-in
    runtime.worker.current = SimpleNamespace(engine=SimpleNamespace(pipeline=pipeline))  # type: ignore[assignment]
    try:
        at_exit._at_exit(lambda timeout_s, export_s: given.append((timeout_s, export_s)) or True)
    finally:
        runtime.worker.current = worker
    assert given == [(at_exit._EXIT_TIMEOUT_S - 1.5, at_exit._EXIT_REFUSED_S)]


# ---- a second Ctrl-C while exit waits for the exporters, or for a worker behind ----------------
# Before: the exit hook swallowed the interrupt and its "not delivered" line with it; a worker
# still building spans at exit lost its calls without a line, interrupted or not.
_EXIT_INTERRUPTED = textwrap.dedent(
    """
    import atexit, os, signal, socket, threading, time
    srv = socket.socket(); srv.bind(("127.0.0.1", 0)); srv.listen(64)
    held = []  # a collector that accepts and never answers
    threading.Thread(target=lambda: [held.append(srv.accept()) for _ in iter(int, 1)],
                     daemon=True).start()
    os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = f"http://127.0.0.1:{srv.getsockname()[1]}"
    import torch, attnscope
    from attnscope._worker import loop
    STUCK = STUCK_WORKER
    attnscope.configure(exporter="otlp-http", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    f = attnscope.trace(name="attn")(
        lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    f(torch.ones(1, 2, 4, 8))
    assert attnscope.flush(timeout_s=0.5) is False  # the worker is up; the collector hangs
    if STUCK:  # the worker falls behind: its next step never comes
        never = threading.Event()
        loop.Worker._step = lambda self: never.wait() or False
    for _ in range(19):
        f(torch.ones(1, 2, 4, 8))
    main = threading.main_thread().ident
    # registered after attnscope's exit hook, so run before it: the Ctrl-C lands in its wait
    atexit.register(lambda: threading.Thread(
        target=lambda: (time.sleep(0.3), signal.pthread_kill(main, signal.SIGINT)),
        daemon=True).start())
    print("main done", flush=True)
    """
)


@pytest.mark.parametrize("stuck", [False, True], ids=["exporting", "worker_behind"])
def test_a_ctrl_c_while_exit_waits_still_says_what_was_not_delivered(stuck: bool) -> None:
    script = _EXIT_INTERRUPTED.replace("STUCK_WORKER", str(stuck))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=_env(), timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "main done", done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if "were not delivered" in ln]
    assert len(lines) == 1, done.stderr[-2000:]
    if stuck:  # the calls captured after the worker stopped stepping: never made spans
        assert "of 20 spans were not delivered" in lines[0] and "calls not yet made spans" \
            in lines[0], lines[0]
        assert "19 calls not yet made spans" in lines[0], lines[0]
    else:
        assert "20 of 20 spans were not delivered" in lines[0], lines[0]
        assert "20 still being sent" in lines[0] and "not yet made" not in lines[0], lines[0]
    assert not _problems(done.stderr), done.stderr[-2000:]
