"""``attnscope compare``: implementations on the user's shapes, the guardrail, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from attnscope.cli import main
from attnscope.cli.compare._command import exit_code
from attnscope.cli.compare._impls import BUILTIN, Impl, static_reason
from attnscope.cli.compare._measure import TOLERANCE, Spec, probe, reference
from attnscope.cli.compare._render import Row
from attnscope.cli.compare._stats import figures
from tests.support.helpers import brute_force_flops

USER_MODULE = textwrap.dedent("""
    import torch

    def good(q, k, v, is_causal=False):
        heads = q.shape[1]
        k, v = (t.repeat_interleave(heads // t.shape[1], 1) for t in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    def unscaled(q, k, v, is_causal=False):  # forgets 1/sqrt(D): the guardrail must catch it
        heads = q.shape[1]
        k, v = (t.repeat_interleave(heads // t.shape[1], 1) for t in (k, v))
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                                scale=1.0)

    def crash(q, k, v, is_causal=False):
        raise ValueError("boom")

    def forced(q, k, v, is_causal=False):  # the math kernel by a context of its own
        from torch.nn.attention import SDPBackend, sdpa_kernel

        heads = q.shape[1]
        k, v = (t.repeat_interleave(heads // t.shape[1], 1) for t in (k, v))
        with sdpa_kernel(SDPBackend.MATH):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
""")
B, H, KV, S, D = 1, 4, 2, 64, 16
SMALL = ["--shape", f"{B},{H},{S},{D}", "--runs", "4", "--warmup", "1", "--profile-runs", "1"]


def _run(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp), os.getcwd()]))
    return subprocess.run([sys.executable, "-m", "attnscope", "compare", *args], env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("user_impls")
    (tmp / "myattn.py").write_text(USER_MODULE)
    return tmp


@pytest.fixture(scope="module")
def json_run(user_dir: Path) -> tuple[int, dict[str, Any], str]:
    """Every built-in and three user functions, GQA and causal, as JSON."""
    done = _run(user_dir, *SMALL, "--kv-heads", str(KV), "--causal", "--json", "--impl",
                ",".join(BUILTIN[:-1]), "--impl", "myattn:good,myattn:unscaled,myattn:crash")
    return done.returncode, json.loads(done.stdout), done.stderr


def _by_name(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["name"]: r for r in doc["implementations"]}


def test_json_lists_every_implementation_with_its_verdict(json_run: Any) -> None:
    code, doc, stderr = json_run
    rows = _by_name(doc)
    assert list(rows) == [*BUILTIN[:-1], "myattn:good", "myattn:unscaled", "myattn:crash"]
    assert doc["shape"] == {"batch": B, "heads": H, "kv_heads": KV, "seq_len": S, "kv_len": S,
                            "head_dim": D}
    assert doc["dtype"] == "float32" and doc["causal"] is True and doc["time_basis"] == "wall"
    for name in ("efficient", "cudnn"):  # no CUDA here: listed, with why
        assert rows[name]["status"] == "unavailable" and "CUDA" in rows[name]["reason"]
    assert rows["myattn:crash"]["status"] == "failed"
    assert rows["myattn:crash"]["reason"] == "ValueError: boom"
    assert code == 1  # one beyond the tolerance, one failed
    assert "Traceback" not in stderr


def test_correct_implementations_are_within_tolerance_and_measured(json_run: Any) -> None:
    _, doc, _ = json_run
    rows = _by_name(doc)
    flops = brute_force_flops(B, H, S, S, D, D, causal=True)  # GQA counted by query heads
    for name in ("naive", "math", "flash", "myattn:good"):
        r = rows[name]
        assert r["status"] == "ok" and r["within_tolerance"] is True, r
        assert r["max_abs_error"] < doc["tolerance_max_abs"]
        assert r["calls"] == 4 and r["profiled_calls"] == 1
        assert r["flops"] == flops
        t = r["time_us"]
        assert 0 < t["p50"] <= t["p95"] <= t["p99"]
        assert r["tflops"] == pytest.approx(flops / (t["p50"] * 1e-6) / 1e12)
        assert r["kernels_per_call"] > 0 and r["kernel_unit"] == "cpu_op" and r["top_names"]
    assert rows["naive"]["backend"] == rows["math"]["backend"] == "math"
    assert rows["flash"]["backend"] == "flash"
    assert any("repeated" in n for n in rows["naive"]["notes"])
    assert any("enable_gqa" in n for n in rows["math"]["notes"])


def test_a_decode_step_one_query_on_a_cache_of_keys(user_dir: Path) -> None:
    # the shape serving spends most of its time in: one new token over the cached keys
    keys = 48
    done = _run(user_dir, "--shape", f"2,{H},1,{D}", "--kv-len", str(keys), "--kv-heads",
                str(KV), "--causal", "--runs", "4", "--warmup", "1", "--profile-runs", "1",
                "--json", "--impl", "naive,math,flash,myattn:good")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["shape"] == {"batch": 2, "heads": H, "kv_heads": KV, "seq_len": 1,
                            "kv_len": keys, "head_dim": D}
    assert doc["causal"] is False  # one query at the end of its keys sees them all
    flops = brute_force_flops(2, H, 1, keys, D, D, causal=False)
    for r in doc["implementations"]:
        assert r["status"] == "ok" and r["within_tolerance"] is True, r
        assert r["flops"] == flops


def test_wrong_user_implementation_is_flagged(json_run: Any) -> None:
    _, doc, _ = json_run
    r = _by_name(doc)["myattn:unscaled"]
    assert r["status"] == "inaccurate" and r["within_tolerance"] is False
    assert r["max_abs_error"] > doc["tolerance_max_abs"] and "beyond" in r["reason"]
    assert r["calls"] == 4  # still timed: it ran


def test_table(user_dir: Path) -> None:
    """The default set: what runs on CPU, and every other built-in with why it did not."""
    done = _run(user_dir, *SMALL, "--no-progress")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"B={B} H={H} S={S} D={D} float32 on cpu" in lines[0]
    for name in ("naive", "math", "flash"):
        row = next(line for line in lines if line.startswith(name + " "))
        cells = [cell.strip() for cell in row.split("│")]
        assert cells[1] == "ok" and cells[2] in ("math", "flash"), cells
    idle = {line.split()[0]: line.split()[1] for line in lines[lines.index("not run here:") + 1:]}
    assert idle == {"efficient": "unavailable:", "cudnn": "unavailable:", "flex": "skipped:"}
    assert "--impl flex" in done.stdout and "Traceback" not in done.stderr
    # the math row forces SDPA's math kernel: not a fallback to warn about (its row says so)
    assert "ran the math kernel" not in done.stderr, done.stderr


def test_only_the_math_rows_own_choice_of_kernel_goes_unsaid(user_dir: Path) -> None:
    """The math row runs SDPA's math kernel on purpose: no fallback WARNING for it; a user's
    function that forces it with a context of its own is still said, as anywhere."""
    done = _run(user_dir, *SMALL, "--no-progress", "--impl", "math,myattn:forced")
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "ran the math kernel" in line]
    assert len(said) == 1 and said[0].startswith("compare.myattn:forced "), done.stderr
    assert "excluded by an sdpa_kernel context" in said[0]


def test_bad_user_module_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "broken_impl.py").write_text("def f(:\n")
    (tmp_path / "plain_impl.py").write_text("NOT_CALLABLE = 3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for spec, words in (("broken_impl:f", "SyntaxError"), ("plain_impl:missing", "has no"),
                        ("plain_impl:NOT_CALLABLE", "not callable"),
                        ("no_such_module_xyz:f", "No module named")):
        assert main(["compare", "--impl", spec]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and words in err and err.startswith("attnscope compare: error:")


@pytest.mark.parametrize("args, words", [
    (["--shape", "1,2,3"], "4 sizes"), (["--shape", "1,2,3,4,5"], "4 sizes"),
    (["--shape", "1,0,8,8"], "at least 1"), (["--shape", "1,-2,8,8"], "at least 1"),
    (["--shape", "a,b,c,d"], "not 4 integers"),
    (["--shape", "1,8,8,8", "--kv-heads", "3"], "divide"),
    (["--kv-heads", "0"], "at least 1"), (["--kv-heads", "x"], "not an integer"),
    (["--impl", "bogus"], "unknown implementation"),
    (["--dtype", "int8"], "fp32, bf16, fp16"), (["--device", "mps"], "not supported"),
    (["--shape", "1,8,8,8", "--kv-len", "16", "--causal"], "not supported"),
    (["--kv-len", "0"], "at least 1"), (["--kv-len", "x"], "not an integer"),
])
def test_bad_input_is_one_line(args: list[str], words: str,
                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err


@pytest.mark.parametrize("args", [["--runs", "0"], ["--warmup", "-1"], ["--seed", "x"]])
def test_bad_number_is_one_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["compare", *args])
    assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_help_shows_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["compare", "--help"])
    out = capsys.readouterr().out
    assert "(default: 1,8,1024,64)" in out and "(default: 50)" in out and "(default: H)" in out
    assert "(default: None)" not in out and "(default: [])" not in out


def test_availability_takes_the_device_as_data() -> None:
    for name in ("efficient", "cudnn"):
        assert static_reason(name, "cpu", requested=True) is not None
        assert static_reason(name, "cuda", requested=False) is None
    assert static_reason("flex", "cpu", requested=False) is not None
    assert static_reason("flex", "cpu", requested=True) is None
    assert static_reason("flex", "cuda", requested=False) is None


def test_reference_in_chunks_matches_sdpa_float64() -> None:
    q = torch.randn(2, 4, 37, 8, dtype=torch.float64)
    k, v = (torch.randn(2, 2, 37, 8, dtype=torch.float64),
            torch.randn(2, 2, 37, 8, dtype=torch.float64))
    for causal in (False, True):
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                                enable_gqa=True)
        got = reference(q, k, v, causal, chunk_bytes=8 * 2 * 4 * 37 * 5)  # 5 query rows a chunk
        torch.testing.assert_close(got, want)


def test_sdpa_backend_without_gqa_kernel_gets_repeated_kv() -> None:
    spec = Spec(1, 4, 2, 16, 8, torch.float32, torch.device("cpu"))
    q, k, v = torch.randn(1, 4, 16, 8), torch.randn(1, 2, 16, 8), torch.randn(1, 2, 16, 8)

    def refuses_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> Any:
        raise RuntimeError("No available kernel. Aborting execution.")

    found = probe(Impl("math", refuses_gqa), (q, k, v), spec)
    assert found.error is None and found.output is not None
    assert any("repeated" in n for n in found.impl.notes)
    assert (found.output - reference(q, k, v, False)).abs().max() < TOLERANCE[torch.float32]


class _Span:
    def __init__(self, name: str, **attributes: Any) -> None:
        self.name, self.attributes = name, attributes


def test_figures_use_device_time_when_measured() -> None:
    spans = [_Span("compare.x", **{"compare.phase": "timed", "attnscope.tier": "timing",
                                   "attnscope.wall_ns": 4000 * (i + 1), "attnscope.device_ns": 1000,
                                   "attnscope.flops": 10**9}) for i in range(3)]
    spans.append(_Span("compare.x", **{"compare.phase": "profiled", "attnscope.tier": "profile",
                                       "attnscope.backend": "flash", "attnscope.kernel.count": 3,
                                       "attnscope.memory.peak_bytes": 512}))
    spans.append(_Span("compare.y", **{"compare.phase": "timed", "attnscope.tier": "timing",
                                       "attnscope.wall_ns": 1}))
    f = figures(spans, "compare.x")
    assert f.calls == 3 and f.profiled == 1 and f.wall_us == {"p50": 8.0, "p95": 11.6, "p99": 11.92}
    assert f.time_us == f.device_us == {"p50": 1.0, "p95": 1.0, "p99": 1.0}
    assert f.tflops == pytest.approx(10**9 / 1e-6 / 1e12)
    assert (f.backend, f.kernels_per_call, f.peak_memory_bytes) == ("flash", 3, 512)


def test_unfused_implementations_that_cannot_fit_are_not_run() -> None:
    from attnscope.cli.compare._command import _prepare

    huge = Spec(64, 64, 64, 2**20, 64, torch.float32, torch.device("cpu"))  # 16 PiB of scores
    for name in ("naive", "math"):
        row = _prepare(name, False, {}, huge)
        assert isinstance(row, Row) and row.status == "unavailable" and "GiB" in str(row.reason)
    assert isinstance(_prepare("flash", False, {}, huge), Impl)  # it never holds them


def test_exit_code() -> None:
    assert exit_code([Row("a", "ok"), Row("b", "unavailable", "why")]) == 0
    assert exit_code([Row("a", "ok"), Row("b", "inaccurate")]) == 1
    assert exit_code([Row("a", "failed")]) == 1
    assert exit_code([Row("a", "unavailable", "why")]) == 1  # nothing ran


@pytest.mark.parametrize("width", [80, 200])
def test_the_table_is_readable_in_an_80_column_terminal(
        width: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every figure whole and every line within the width (80: folded, led by the name)."""
    import io

    from attnscope.cli.compare._render import _cells, render_table
    from attnscope.cli.compare._stats import Figures

    spec = Spec(1, 8, 2, 512, 64, torch.float32, torch.device("cpu"), causal=True, runs=30)
    times = {"p50": 898_130.0, "p95": 1_057_280.0, "p99": 1_242_120.0}
    rows = [Row(name, status, max_abs_error=err, max_rel_error=err / 3, figures=Figures(
                calls=30, wall_us=times, flops=268959744, tflops=0.000299, backend="flash",
                kernels_per_call=162, peak_memory_bytes=4_300_000))
            for name, status, err in (("my_attention:chunked", "ok", 6.1e-7),
                                      ("my_attention:no_scale_at_all", "inaccurate", 4.08))]
    monkeypatch.setenv("COLUMNS", str(width))
    out = io.StringIO()
    render_table(spec, rows, out)
    text = out.getvalue()
    table = [line for line in text.splitlines()[1:] if "━" in line or "│" in line or "┃" in line]
    assert table and max(len(line) for line in table) <= width, text
    assert "…" not in text
    for row in rows:
        for cell in _cells(row):
            assert f" {cell} " in f" {' '.join(text.split())} ", (cell, text)
    assert (text.count("implementation") > 1) == (width == 80)  # folded: the name leads each
