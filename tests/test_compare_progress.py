"""``attnscope compare`` runs in interleaved rounds within a time budget and says how far it is on
stderr, terminal or not (issue 38 §2)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from attnscope.cli.compare._command import run_compare
from attnscope.cli.compare._impls import Impl
from attnscope.cli.compare._measure import Spec
from attnscope.cli.compare._plan import MIN_ROUNDS, blocks

SLOW_MODULE = textwrap.dedent("""
    import time
    import torch

    def slow(q, k, v, is_causal=False):  # 0.2 s a call at least, however idle the machine
        time.sleep(0.2)
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
""")
TINY = ["--shape", "1,2,16,8"]


def _run(tmp: Path, *args: str, columns: int = 200) -> subprocess.CompletedProcess[str]:
    # stdout and stderr are pipes here, as in CI or `| tee`: not terminals
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), os.getcwd()]),
               OMP_NUM_THREADS="1", COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-m", "attnscope", "compare", *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("slow_impl")
    (tmp / "slowattn.py").write_text(SLOW_MODULE)
    return tmp


def _progress(stderr: str) -> list[str]:
    return [line.split("]: ", 1)[1] for line in stderr.splitlines()
            if line.startswith("attnscope compare [")]


def test_progress_goes_to_stderr_when_it_is_not_a_terminal(user_dir: Path) -> None:
    done = _run(user_dir, *TINY, "--runs", "6", "--warmup", "1", "--profile-runs", "1",
                "--impl", "naive,flash")
    assert done.returncode == 0, done.stderr
    said = _progress(done.stderr)
    assert said[0] == "the float64 reference is ready" and said[-1] == "done"
    for name in ("naive", "flash"):  # lines per implementation, with its time a call
        assert any(line.startswith(f"{name}: runs here, within the tolerance (first call ")
                   for line in said), said
        assert any(line.startswith(f"{name}: about ") and line.endswith(" a call")
                   for line in said), said
        assert f"{name}: 1 profiled call" in said
    assert "6 timed calls of each of 2 in 6 rounds, 1 warm-up call first" in said
    assert [line for line in said if line.startswith("round ")] == [
        f"round {r} of 6 timed" for r in range(1, 7)]
    assert "attnscope compare [" not in done.stdout and "which is faster" in done.stdout
    quiet = _run(user_dir, *TINY, "--runs", "6", "--warmup", "0", "--profile-runs", "0",
                 "--impl", "flash", "--no-progress")
    assert quiet.returncode == 0 and _progress(quiet.stderr) == []


def test_the_budget_cuts_the_calls_and_says_so(user_dir: Path) -> None:
    """0.2 s a call and 2 s for warm-up and timed calls: at most 10 calls fit (fewer on a busy
    machine), never fewer than 6 timed and 1 warm-up."""
    done = _run(user_dir, *TINY, "--impl", "slowattn:slow", "--budget", "2", "--runs", "50",
                "--profile-runs", "0", "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert MIN_ROUNDS <= doc["runs"] <= 9 and doc["warmup"] == 1, doc
    assert (doc["runs_asked"], doc["warmup_asked"], doc["budget_s"]) == (50, 5, 2.0)
    assert doc["cut_by_budget"].startswith(f"--budget 2 s: {doc['runs']} timed and 1 warm-up "
                                           "calls each instead of 50 and 5")
    assert doc["implementations"][0]["calls"] == doc["runs"]
    assert doc["cut_by_budget"] in _progress(done.stderr)
    table = _run(user_dir, *TINY, "--impl", "slowattn:slow", "--budget", "2", "--runs", "50",
                 "--profile-runs", "0", "--no-progress", columns=80)
    said = table.stdout.splitlines()[1]  # one line, however narrow the terminal
    assert said.startswith("fewer calls than asked: --budget 2 s: ")
    assert said.endswith("; --budget 0 for all)"), table.stdout


@pytest.mark.parametrize("value", ["-1", "x", "nan"])
def test_a_bad_budget_is_one_line(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["compare", "--budget", value])
    assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_rounds_interleave_the_implementations_in_turn() -> None:
    """Probe and first warm-up of each, the rest of the warm-up, then rounds whose order turns
    around each time (no implementation always runs after the same one), then the profiled
    calls; each timed span carries its round."""
    calls: list[str] = []

    def recording(name: str) -> Impl:
        def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               is_causal: bool = False) -> torch.Tensor:
            calls.append(name)
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

        return Impl(name, fn, user=True)

    users = {name: recording(name) for name in ("t:a", "t:b")}
    spec = Spec(1, 2, 2, 16, 8, torch.float32, torch.device("cpu"), runs=12, warmup=2,
                profile_runs=1)
    rows = run_compare(spec, [(n, True) for n in users], users, progress=False)
    a, b = "t:a", "t:b"
    want = [a, b, a, b, a, b]  # probe, first warm-up, the other warm-up call
    for round_no, size in enumerate(blocks(12, 10)):
        order = (a, b) if round_no % 2 == 0 else (b, a)
        want += [order[0]] * size + [order[1]] * size
    want += [a, b]  # profiled
    assert calls == want
    for row in rows:
        assert row.status == "ok" and row.figures is not None
        assert sorted(row.figures.rounds) == list(range(10)) and row.figures.calls == 12
