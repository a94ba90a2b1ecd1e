"""``attnscope run``: real programs written to a temporary directory, run as subprocesses."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from attnscope.cli import main
from attnscope.cli.run._output import ENV_PARENT, process_tag
from tests.support.cli_errors import usage_error

TIMEOUT = 180


def _write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def _env() -> dict[str, str]:
    # faulthandler in every process: a run that hangs is ended by SIGABRT, which then prints
    # each process's Python stacks into the failure (see _bounded)
    return {**{k: v for k, v in os.environ.items() if not k.startswith("ATTNSCOPE_")},
            "PYTHONFAULTHANDLER": "1"}


def _bounded(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """Run ``argv`` in a session of its own; past TIMEOUT, every process of that session is sent
    SIGABRT and the test fails with their stderr (their stacks), not with a bare timeout."""
    with subprocess.Popen(argv, cwd=cwd, env=_env(), stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, start_new_session=True) as proc:
        try:
            stdout, stderr = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            try:
                tree = subprocess.run(["ps", "-o", "pid,ppid,stat,etime,args", "-s",
                                       str(proc.pid)], capture_output=True, text=True,
                                      check=False, timeout=30).stdout
            except (OSError, subprocess.TimeoutExpired) as exc:
                tree = f"(ps: {exc!r})"
            try:
                os.killpg(proc.pid, signal.SIGABRT)
            except ProcessLookupError:
                pass
            try:
                stdout, stderr = proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                stdout, stderr = proc.communicate()
            stacks = stderr.decode(errors="replace")[-20000:]
            pytest.fail(f"{' '.join(argv)[-300:]} still running after {TIMEOUT} s; "
                        f"processes:\n{tree}\nstderr (stacks after SIGABRT):\n{stacks}")
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _run(tmp_path: Path, *args: str, report: bool = False) -> subprocess.CompletedProcess[bytes]:
    # no profile tier: its operator spans would make the span counts a matter of chance
    options = ["--out", "out", "--profile-rate", "0"] + ([] if report else ["--no-report"])
    return _bounded([sys.executable, "-m", "attnscope", "run", *options, "--", *args], tmp_path)


def _plain(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return _bounded(list(args), tmp_path)


def _jaeger_names(path: Path) -> collections.Counter[str]:
    document = json.loads(path.read_text())
    return collections.Counter(s["operationName"] for t in document["data"] for s in t["spans"])


def _otlp_names(path: Path) -> collections.Counter[str]:
    names: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                names.update(s["name"] for s in ss["spans"])
    return names


SDPA_APP = """
    import sys
    import torch
    import torch.nn.functional as F

    q = torch.randn(1, 2, 8, 16)
    calls = int(sys.argv[sys.argv.index("--calls") + 1])
    for _ in range(calls):
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    sys.stdout.write("args=%r\\n" % (sys.argv[1:],))
    sys.stdout.flush()  # text, then bytes: in this order in any shell (a pipe is block-buffered)
    sys.stdout.buffer.write(b"\\x00\\xff no newline at the end")
"""


def test_sdpa_script_spans_in_both_files_stdout_and_args_pass_through(tmp_path: Path) -> None:
    app = _write(tmp_path, "app.py", SDPA_APP)
    args = (sys.executable, str(app), "--calls", "4", "--flag", "x y")
    out = tmp_path / "out"
    out.mkdir()
    (out / "traces.otlp.jsonl").write_text("an earlier run's lines\n")  # replaced, not appended to
    (out / "notes.txt").write_text("mine")
    result = _run(tmp_path, *args, report=True)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    # byte for byte, the report not mixed in
    assert result.stdout == (b"args=['--calls', '4', '--flag', 'x y']\n"
                             b"\x00\xff no newline at the end")
    assert _jaeger_names(out / "traces.jaeger.json") == {"scaled_dot_product_attention": 4}
    assert _otlp_names(out / "traces.otlp.jsonl") == {"scaled_dot_product_attention": 4}
    assert (out / "notes.txt").read_text() == "mine"
    assert f"4 spans written: {out / 'traces.jaeger.json'}" in stderr
    if "HTML report:" in stderr:  # once `attnscope report` exists
        assert (out / "report.html").is_file()


COMPILED_APP = """
    import sys
    import torch
    import torch.nn.functional as F

    def attend(q):
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    q = torch.randn(1, 2, 8, 16)
    if "--eager" in sys.argv:
        attend(q)
    compiled = torch.compile(attend, backend="eager")
    for _ in range(3):
        compiled(q)
"""


@pytest.mark.parametrize("eager", [True, False])
def test_the_run_says_when_compiled_code_hid_attention(tmp_path: Path, eager: bool) -> None:
    # compiled calls are not traced (docs/instrument.md): a run of a compiled model said "no
    # attention call was sampled" and nothing of why
    app = _write(tmp_path, "app.py", COMPILED_APP)
    result = _run(tmp_path, sys.executable, str(app), *(["--eager"] if eager else []))
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    said = ("torch.compile made 1 graph(s) in the program: attention inside compiled code is "
            "not traced")
    assert said in stderr
    if eager:  # the eager call is traced, the three compiled ones are not
        assert _jaeger_names(tmp_path / "out" / "traces.jaeger.json") == {
            "scaled_dot_product_attention": 1}
        assert "1 spans written" in stderr
    else:
        assert "no spans captured, nothing written" in stderr
    # a program that compiles nothing is told nothing of it
    plain = _write(tmp_path, "plain.py", SDPA_APP)
    result = _run(tmp_path, sys.executable, str(plain), "--calls", "1")
    assert "torch.compile" not in result.stderr.decode()


def test_a_repeat_says_once_that_compiled_code_hid_attention(tmp_path: Path) -> None:
    app = _write(tmp_path, "app.py", COMPILED_APP)
    result = _bounded([sys.executable, "-m", "attnscope", "run", "--repeat", "2", "--out", "out",
                       "--profile-rate", "0", "--", sys.executable, str(app), "--eager"],
                      tmp_path)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert stderr.count("torch.compile made 1 graph(s) in the program") == 1
    assert "run 2 of 2: 1 spans" in stderr


@pytest.mark.parametrize("body, code", [
    ("import sys\nprint('bye')\nsys.exit(3)\n", 3),
    ("def f():\n    raise ValueError('boom ' * 3)\nf()\n", 1),
    ("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\n", 128 + signal.SIGKILL),
])
def test_exit_code_and_stderr_pass_through(tmp_path: Path, body: str, code: int) -> None:
    app = _write(tmp_path, "app.py", body)
    result = _run(tmp_path, "python", str(app))
    plain = _plain(tmp_path, sys.executable, str(app))
    assert plain.returncode in (code, 128 - code)  # killed by signal N: -N, and 128 + N here
    assert result.returncode == plain.returncode  # killed by signal N: attnscope too (-N)
    assert result.stdout == plain.stdout
    # the program's stderr (a traceback, or nothing) comes first and whole; attnscope's lines after
    assert result.stderr.startswith(plain.stderr)
    tail = result.stderr[len(plain.stderr):].decode()
    assert tail.startswith("attnscope run: no spans"), tail


HF_APP = """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                      num_hidden_layers=2, intermediate_size=64, vocab_size=64)
    model = LlamaForCausalLM(cfg).eval()
    calls = []
    model.model.layers[0].self_attn.register_forward_hook(lambda *a: calls.append(1))
    ids = torch.randint(0, 64, (1, 8))
    with torch.no_grad():
        model(ids)
        model.generate(ids, max_new_tokens=3, do_sample=False, pad_token_id=0)
    print("layer calls", len(calls))
"""


def test_transformers_model_built_by_the_program_is_instrumented_once(tmp_path: Path) -> None:
    app = _write(tmp_path, "app.py", HF_APP)
    result = _run(tmp_path, sys.executable, "-W", "always::UserWarning", str(app))
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "already instrumented" not in stderr
    calls = int(result.stdout.decode().split("layer calls")[1])
    out = tmp_path / "out"
    for names in (_jaeger_names(out / "traces.jaeger.json"),
                  _otlp_names(out / "traces.otlp.jsonl")):
        # nested LlamaModel: instrumented from the outer model (paths start at "model.");
        # the layers' span names end with "(phase, implementation)"
        for layer in ("model.layers.0.self_attn", "model.layers.1.self_attn"):
            assert sum(n for name, n in names.items()
                       if name.partition(" (")[0] == layer) == calls
        assert names["LlamaForCausalLM.generate"] == 1
        assert not any(n.startswith("layers.") for n in names)


TORCH_APP = """
    import torch
    import torch.nn as nn

    layer = nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, batch_first=True)
    encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(32, 4, batch_first=True)

        def forward(self, x):
            return self.attn(x, x, x)[0]

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block() for _ in range(2))

        def forward(self, x):
            for block in self.blocks:
                x = block(x)
            return x

    model = Model()
    x = torch.randn(2, 5, 32)
    encoder(x)
    model(x)
    model(x)
    encoder.eval()
    with torch.no_grad():
        encoder(x)  # the fused fast path: one span per layer
"""


def test_torch_models_are_named_from_their_outermost_module(tmp_path: Path) -> None:
    app = _write(tmp_path, "app.py", TORCH_APP)
    result = _run(tmp_path, sys.executable, "-W", "always::UserWarning", str(app))
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    assert "already instrumented" not in stderr
    names = _jaeger_names(tmp_path / "out" / "traces.jaeger.json")
    assert names == _otlp_names(tmp_path / "out" / "traces.otlp.jsonl")
    # encoder: clones of the template layer, named from the encoder; the user's model from Model
    assert names["layers.0.self_attn"] == names["layers.1.self_attn"] == 1
    assert names["layers.0"] == names["layers.1"] == 1  # eval, no grad: fused
    assert names["blocks.0.attn"] == names["blocks.1.attn"] == 2
    assert "MultiheadAttention" not in names and "TransformerEncoderLayer" not in names


SPAWN_APP = """
    import multiprocessing as mp
    import torch
    import torch.nn.functional as F

    def work():
        q = torch.randn(1, 2, 4, 8)
        F.scaled_dot_product_attention(q, q, q)

    if __name__ == "__main__":
        child = mp.get_context("spawn").Process(target=work)
        child.start()
        child.join()
        work()
        work()
"""


def test_each_process_writes_its_own_files(tmp_path: Path) -> None:
    app = _write(tmp_path, "app.py", SPAWN_APP)
    result = _run(tmp_path, sys.executable, str(app))
    assert result.returncode == 0, result.stderr.decode()
    out = tmp_path / "out"
    assert _jaeger_names(out / "traces.jaeger.json") == {"scaled_dot_product_attention": 2}
    others = sorted(out.glob("traces.pid*.jaeger.json"))
    assert len(others) == 1
    assert _jaeger_names(others[0]) == {"scaled_dot_product_attention": 1}
    assert sorted(out.glob("traces.pid*.otlp.jsonl"))


LAUNCHER_APP = """
    import os, subprocess, sys
    # as torchrun launches: a launcher that never imports torch, ranks in processes of their own
    worker = sys.argv[1]
    ranks = [subprocess.Popen([sys.executable, worker, "--calls", str(3 + rank)],
                              env={**os.environ, "RANK": str(rank), "WORLD_SIZE": "2"})
             for rank in range(2)]
    sys.exit(max(p.wait() for p in ranks))
"""


def test_the_report_of_a_launched_job_is_of_every_rank(tmp_path: Path) -> None:
    worker = _write(tmp_path, "app.py", SDPA_APP)
    launcher = _write(tmp_path, "launch.py", LAUNCHER_APP)
    result = _run(tmp_path, sys.executable, str(launcher), str(worker), report=True)
    stderr = " ".join(result.stderr.decode().split())  # the report folds long lines
    assert result.returncode == 0, stderr
    out = tmp_path / "out"
    assert not (out / "traces.otlp.jsonl").exists()  # the launcher traced nothing
    assert _otlp_names(out / "traces.rank1.otlp.jsonl") == {"scaled_dot_product_attention": 4}
    # the report is of the run's directory, both ranks' calls: 3 + 4 (before: rank 0's file, 3)
    assert f"attnscope report — {out} " in stderr, stderr
    assert "7 attention calls sampled" in stderr and "2 processes" in stderr, stderr


POOL_APP = """
    import multiprocessing as mp
    import sys
    import torch
    import torch.nn.functional as F

    def work(i):
        q = torch.randn(1, 2, 4, 8)
        for _ in range(10):
            F.scaled_dot_product_attention(q, q, q)
        return i

    def work_then_wait(done):
        work(0)
        done.set()
        import time
        time.sleep(120)

    if __name__ == "__main__":
        context = mp.get_context(sys.argv[1])
        if sys.argv[2] == "pool":  # the end of the block terminates the workers (SIGTERM)
            with context.Pool(2) as pool:
                print(sum(pool.map(work, range(4))))
        elif sys.argv[2] == "terminate":  # SIGTERM: the status stays the signal's
            done = context.Event()
            child = context.Process(target=work_then_wait, args=(done,))
            child.start()
            done.wait(120)
            child.terminate()
            child.join()
            print(child.exitcode)
        else:
            child = context.Process(target=work, args=(0,))
            child.start()
            child.join()
            print(child.exitcode)
"""


@pytest.mark.parametrize("method, kind", [("spawn", "pool"), ("fork", "pool"), ("fork", "process"),
                                          ("spawn", "terminate")])
def test_multiprocessing_children_write_their_spans(tmp_path: Path, method: str,
                                                    kind: str) -> None:
    """A pool's workers end by SIGTERM, a forked child by os._exit(): no atexit either way."""
    app = _write(tmp_path, "app.py", POOL_APP)
    result = _run(tmp_path, sys.executable, str(app), method, kind)
    stderr = result.stderr.decode()
    assert result.returncode == 0, stderr
    # the program's own result; a terminated child's status is still -SIGTERM
    assert result.stdout == {"pool": b"6\n", "process": b"0\n",
                             "terminate": b"%d\n" % -signal.SIGTERM}[kind]
    out = tmp_path / "out"
    assert not (out / "traces.jaeger.json").exists()  # the main process ran no attention
    files = sorted(out.glob("traces.pid*.jaeger.json"))
    total = collections.Counter[str]()
    for path in files:
        total.update(_jaeger_names(path))
    calls = 40 if kind == "pool" else 10
    assert total == {"scaled_dot_product_attention": calls}, stderr
    otlp: collections.Counter[str] = collections.Counter()
    for path in sorted(out.glob("traces.pid*.otlp.jsonl")):
        otlp.update(_otlp_names(path))
    assert otlp == total
    assert "spans written" in stderr or "trace files written" in stderr


OTHER_THREAD_APP = """
    import multiprocessing as mp
    import signal
    import sys
    import threading
    import torch
    import torch.nn.functional as F

    def child(ready):
        q = torch.randn(1, 2, 4, 8)
        for _ in range(10):
            F.scaled_dot_product_attention(q, q, q)
        parked = threading.Thread(target=threading.Event().wait, daemon=True)
        parked.start()
        blocked = mp.get_context("fork").Lock()
        blocked.acquire()
        ready.set()
        # a process-directed SIGTERM the kernel hands to another thread, while the main one
        # waits in sem_wait as a Pool worker waits for its next task
        threading.Timer(0.3, signal.pthread_kill, (parked.ident, signal.SIGTERM)).start()
        blocked.acquire()

    if __name__ == "__main__":
        context = mp.get_context(sys.argv[1])
        ready = context.Event()
        process = context.Process(target=child, args=(ready,))
        process.start()
        ready.wait(60)
        process.join(60)
        print(process.exitcode)
        if process.exitcode is None:
            process.kill()
"""


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_sigterm_another_thread_took_still_ends_the_child_with_its_spans(
        tmp_path: Path, method: str) -> None:
    """The handler runs only on the main thread: the child lived on (the program hung)."""
    app = _write(tmp_path, "app.py", OTHER_THREAD_APP)
    result = _run(tmp_path, sys.executable, str(app), method)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout == b"%d\n" % -signal.SIGTERM  # ended as SIGTERM would have
    files = sorted((tmp_path / "out").glob("traces.pid*.jaeger.json"))
    assert len(files) == 1
    assert _jaeger_names(files[0]) == {"scaled_dot_product_attention": 10}


def test_a_sigterm_during_the_childs_exit_export_waits_for_it() -> None:
    """A pool worker given its sentinel ends through os._exit, whose export attnscope runs
    first; the pool's SIGTERM reaching it meanwhile ended it before that export was done (on
    Python 3.13 most runs of the fork-pool test above lost every span of a worker). The SIGTERM's
    flush now returns, and the SIGTERM ends the process, only once the exit's export is done."""
    import threading
    import time

    from attnscope._runtime import runtime
    from attnscope.cli.run import _children

    order: list[str] = []

    def exit_export() -> None:  # the exit's export, still running when the SIGTERM came
        time.sleep(0.3)
        order.append("exit export done")
        runtime.worker.exit_done.set()

    runtime.worker.exiting, runtime.worker.exit_done = True, threading.Event()
    try:
        running = threading.Thread(target=exit_export)
        running.start()
        _children._flush()  # what the SIGTERM's helper thread runs before it ends the process
        order.append("sigterm flush returned")
        running.join()
    finally:
        runtime.worker.exiting, runtime.worker.exit_done = False, threading.Event()
    assert order == ["exit export done", "sigterm flush returned"]


def test_a_sigterm_during_the_childs_last_step_export_waits_for_it() -> None:
    """The other end of a child: its last step (multiprocessing's Finalize) exporting when the
    SIGTERM comes. The SIGTERM's flush waits for that one to finish before its own."""
    import threading
    import time

    from attnscope.cli.run import _children

    order: list[str] = []
    held = threading.Event()

    def last_step() -> None:
        with _children._FLUSHING:  # as the Finalize's _flush holds it while it exports
            held.set()
            time.sleep(0.3)
            order.append("last step's export done")

    running = threading.Thread(target=last_step)
    running.start()
    held.wait()
    _children._flush()
    order.append("sigterm flush returned")
    running.join()
    assert order == ["last step's export done", "sigterm flush returned"]


def test_o_is_short_for_out() -> None:
    from attnscope.cli import build_parser

    args = build_parser("run").parse_args(["run", "-o", "there", "--", "python", "a.py"])
    assert args.out == "there"


def test_process_tag() -> None:
    env = {ENV_PARENT: "10"}
    assert process_tag(env, pid=11, parent_pid=10) == ""
    assert process_tag(env, pid=12, parent_pid=11) == "pid12"
    assert process_tag({**env, "RANK": "3"}, pid=11, parent_pid=10) == "rank3"


def test_signals_are_forwarded(tmp_path: Path) -> None:
    app = _write(tmp_path, "app.py", """
        import signal, sys, time
        signal.signal(signal.SIGTERM, lambda *a: sys.exit(7))
        try:
            print("ready", flush=True)
            time.sleep(60)
        except KeyboardInterrupt:
            sys.exit(9)
    """)
    for sig, code in ((signal.SIGTERM, 7), (signal.SIGINT, 9)):
        # a new session: no terminal, so SIGINT reaches the program only through attnscope
        with subprocess.Popen([sys.executable, "-m", "attnscope", "run", "--out", "out", "--",
                               "python", str(app)], cwd=tmp_path, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              start_new_session=True) as proc:
            assert proc.stdout is not None
            assert proc.stdout.readline() == b"ready\n"
            proc.send_signal(sig)
            assert proc.wait(timeout=TIMEOUT) == code


def test_an_existing_sitecustomize_still_runs(tmp_path: Path) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.stderr.write('theirs ran\\n')\n")
    app = _write(tmp_path, "app.py", "print('hello')\n")
    env = {**_env(), "PYTHONPATH": str(site)}
    result = subprocess.run([sys.executable, "-m", "attnscope", "run", "--", "python", str(app)],
                            cwd=tmp_path, env=env, capture_output=True, timeout=TIMEOUT)
    assert result.returncode == 0
    assert result.stdout == b"hello\n"
    assert result.stderr.startswith(b"theirs ran\n")


def _bad(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    return usage_error(capsys, "run", argv)


def test_bad_input_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               monkeypatch: pytest.MonkeyPatch) -> None:
    app = _write(tmp_path, "app.py", "print(1)\n")
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert "no program given" in _bad(capsys, [])
    assert "no program given" in _bad(capsys, ["--"])
    assert "sample_rate" in _bad(capsys, ["--sample-rate", "2", "--", "python", str(app)])
    assert "sample_rate" in _bad(capsys, ["--sample-rate", "nan", "--", "python", str(app)])
    assert "overhead_budget" in _bad(capsys, ["--overhead-budget", "0", "--", str(app)])
    assert "missing.py: no such file" in _bad(capsys, ["--", "python", "missing.py"])
    assert "missing.py: no such file" in _bad(capsys, ["--", "python", "-u", "missing.py"])
    assert "command not found" in _bad(capsys, ["--", "no-such-program-xyz"])
    assert "cannot write there" in _bad(capsys, ["--out", str(blocker / "sub"), "--",
                                                 "python", str(app)])
    monkeypatch.setenv("ATTNSCOPE_QUEUE_SIZE", "lots")
    assert "ATTNSCOPE_QUEUE_SIZE" in _bad(capsys, ["--out", str(tmp_path / "o"), "--",
                                                   "python", str(app)])
    monkeypatch.delenv("ATTNSCOPE_QUEUE_SIZE")
    for var, value in (("ATTNSCOPE_SAMPLE_RATE", "2"), ("ATTNSCOPE_PROFILE_RATE", "often"),
                       ("ATTNSCOPE_OVERHEAD_BUDGET", "-1"), ("ATTNSCOPE_WARMUP_CALLS", "x")):
        monkeypatch.setenv(var, value)  # no flag for it: the environment is the setting
        assert var in _bad(capsys, ["--out", str(tmp_path / "o"), "--", "python", str(app)])
        monkeypatch.delenv(var)
    # the real command: one line (its own process does not import the library, whose import
    # would log a warning about the same value first)
    env = {**_env(), "ATTNSCOPE_SAMPLE_RATE": "2"}
    done = subprocess.run([sys.executable, "-m", "attnscope", "run", "--", "python", str(app)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT,
                          check=False)
    assert done.returncode == 2 and done.stdout == "", done.stderr
    assert done.stderr.splitlines() == [("attnscope run: error: environment variable "
                                         "ATTNSCOPE_SAMPLE_RATE=2.0 is invalid for sample_rate")]


SETTINGS_APP = """
    import torch
    from attnscope import _api

    c = _api.current()
    print(c.sample_rate, c.profile_rate, c.overhead_budget, c.warmup_calls)
"""


def test_the_environment_is_a_setting_and_flags_win(tmp_path: Path) -> None:
    app = _write(tmp_path, "app.py", SETTINGS_APP)
    env = {**_env(), "ATTNSCOPE_SAMPLE_RATE": "0.25", "ATTNSCOPE_PROFILE_RATE": "0.5",
           "ATTNSCOPE_OVERHEAD_BUDGET": "0.2", "ATTNSCOPE_WARMUP_CALLS": "7"}

    def settings(*flags: str) -> list[str]:
        result = subprocess.run([sys.executable, "-m", "attnscope", "run", "--out", "out",
                                 "--no-report", *flags, "--", "python", str(app)],
                                cwd=tmp_path, env=env, capture_output=True, timeout=TIMEOUT,
                                check=False)
        assert result.returncode == 0, result.stderr.decode()
        return result.stdout.decode().split()

    assert settings() == ["0.25", "0.5", "0.2", "7"]  # the run's defaults give way
    assert settings("--sample-rate", "1", "--warmup-calls", "0") == ["1.0", "0.5", "0.2", "0"]
    assert settings("--profile-rate", "0.05", "--overhead-budget", "1") == [
        "0.25", "0.05", "1.0", "7"]  # a flag given with the default's value still wins
    del env["ATTNSCOPE_SAMPLE_RATE"], env["ATTNSCOPE_WARMUP_CALLS"]
    assert settings()[::3] == ["1.0", "0"]  # nothing given: the run's own defaults


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["run", "--help"])
    assert exc.value.code == 0
    text: Any = " ".join(capsys.readouterr().out.split())
    assert "--sample-rate RATE" in text and "(default: 1.0)" in text
    assert "(default: attnscope-out)" in text and "(default: 0.05)" in text


def test_the_command_list_says_what_each_command_says() -> None:
    """`attnscope --help` lists the commands without importing them: the same help lines."""
    import argparse

    from attnscope.cli import build_parser

    def lines(parser: argparse.ArgumentParser) -> dict[str, str | None]:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        return {c.dest: c.help for c in action._choices_actions}

    assert lines(build_parser(listing=True)) == lines(build_parser())
