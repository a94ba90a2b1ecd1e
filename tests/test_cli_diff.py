"""``attnscope diff``: the statistics on synthetic samples with known shifts, then the command on
real traces written by small attnscope programs (``python -m attnscope diff`` in a subprocess)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnscope.cli.diff._groups import diary
from attnscope.cli.diff._stats import METRICS, calls_needed, compare, gate_failed
from attnscope.cli.diff._text import notes, verdict_text
from attnscope.cli.traces import SpanRow
from tests.support.browser import dom_of

ROOT = Path(__file__).resolve().parent.parent
TIME = tuple(m for m in METRICS if m.value == "time")
P50, TOKENS = METRICS[0], METRICS[3]

# -- the statistics -------------------------------------------------------------------------


def _lognormal(seed: int, n: int, scale: float = 1.0, sigma: float = 0.3) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(0.0, sigma, n) * scale


def test_a_20_percent_slowdown_is_slower_and_trips_a_5_percent_gate() -> None:
    before, after = _lognormal(1, 300), _lognormal(2, 300, scale=1.2)
    p50, p95, _ = compare(before, after, TIME, min_change=0.05)
    assert p50.verdict == "slower"
    # p95 on 300 calls moved +34% in [+9%, +52%]: the whole interval above 5%, slower however
    # wide (issue 38 §5; issue 22's rule called an interval this wide "inconclusive")
    assert p95.verdict == "slower" and 0.05 < p95.low < math.sqrt(1 + p95.change) - 1
    assert p50.low < 0.2 < p50.high and p50.low > 0.05
    assert gate_failed(p50, 0.05) and not gate_failed(p50, 0.5)


def test_a_speedup_is_faster_and_never_trips_the_gate() -> None:
    p50, *_ = compare(_lognormal(3, 300), _lognormal(4, 300, scale=0.7), TIME)
    assert p50.verdict == "faster" and p50.high < 0
    assert not gate_failed(p50, 0.0)


def test_tokens_per_s_higher_is_faster() -> None:
    up, = compare(_lognormal(5, 200), _lognormal(6, 200, scale=1.5), (TOKENS,))
    down, = compare(_lognormal(7, 200), _lognormal(8, 200, scale=0.6), (TOKENS,))
    assert (up.verdict, down.verdict) == ("faster", "slower")
    assert not gate_failed(down, 0.0)  # the gate is about p50 time only


def test_two_draws_of_one_distribution_are_no_change_about_95_percent_of_the_time() -> None:
    """The interval alone (min_change 0): a false verdict at about the 5% it promises."""
    changed = 0
    seeds = 150
    for seed in range(seeds):
        p50, = compare(_lognormal(2 * seed, 200), _lognormal(2 * seed + 1, 200), (P50,),
                       seed=seed, resamples=1000)
        changed += p50.verdict != "no change"
    assert changed / seeds <= 0.08


def test_a_small_real_shift_is_no_change_below_min_change() -> None:
    before, after = _lognormal(9, 1000, sigma=0.1), _lognormal(10, 1000, scale=1.03, sigma=0.1)
    strict, = compare(before, after, (P50,), min_change=0.0)
    lenient, = compare(before, after, (P50,), min_change=0.05)
    assert strict.verdict == "slower" and lenient.verdict == "no change"


def test_too_few_calls_gives_values_but_no_verdict() -> None:
    assert calls_needed(0.5) == 20 and calls_needed(0.95) == 60 and calls_needed(0.99) == 300
    p50, p95, p99 = compare(_lognormal(11, 100), _lognormal(12, 100, scale=3.0), TIME)
    assert p50.verdict == "slower" and p95.verdict == "slower"
    assert p99.verdict == "too few calls" and math.isnan(p99.low) and p99.change > 1.0
    few, = compare(_lognormal(13, 10), _lognormal(14, 10, scale=3.0), (P50,))
    assert few.verdict == "too few calls" and not gate_failed(few, 0.0)


def test_identical_memory_peaks_are_no_change_and_zero_to_zero_too() -> None:
    same, = compare(np.full(30, 4096.0), np.full(30, 4096.0), (METRICS[4],))
    zero, = compare(np.zeros(30), np.zeros(30), (METRICS[4],))
    grew, = compare(np.full(30, 4096.0), np.full(30, 8192.0), (METRICS[4],))
    assert (same.verdict, zero.verdict, grew.verdict) == ("no change", "no change", "larger")


# -- grouping (synthetic spans) -------------------------------------------------------------


def _row(i: int, module: str, phase: str | None, ns: float, **extra: Any) -> SpanRow:
    attrs: Mapping[str, Any] = {"attnscope.tier": "timing", "attnscope.module": module,
                                "attnscope.wall_ns": int(ns), "attnscope.num_heads": 4,
                                **({"attnscope.phase": phase} if phase else {}), **extra}
    return SpanRow("t", f"{module}{phase}{i}", None, module, 0, int(ns), attrs, "svc")


def test_diary_groups_by_module_and_phase_and_lists_one_sided_groups() -> None:
    times = _lognormal(15, 60, scale=1e6)
    before = [_row(i, "l0", "decode", t, **{"attnscope.tokens": 2}) for i, t in enumerate(times)]
    before += [_row(i, "gone", None, t) for i, t in enumerate(times[:5])]
    after = [_row(i, "l0", "decode", 2 * t, **{"attnscope.tokens": 2})
             for i, t in enumerate(times)]
    after += [_row(i, "l0", "prefill", t) for i, t in enumerate(times[:7])]
    # profiled calls are not timed: a slow one must not move the quantiles
    after += [_row(99, "l0", "decode", 1e12, **{"attnscope.tier": "profile"})]
    result = diary(before, after, min_change=0.05)
    assert [(g.module, g.phase) for g in result.groups] == [("l0", "decode")]
    assert result.only_before == [(("gone", None), 5)]
    assert result.only_after == [(("l0", "prefill"), 7)]
    group = result.groups[0]
    assert group.calls_after == 61 and group.clock_before == "wall"
    by_name = {c.metric.name: c for c in group.changes}
    assert by_name["p50"].n_after == 60
    assert by_name["p50"].change == pytest.approx(1.0)
    assert by_name["tokens/s p50"].verdict == "slower"
    assert [g.module for g, _ in result.gate_failures(0.05)] == ["l0"]


def _wide_cells(group: Any) -> list[str]:
    from attnscope.cli.diff._text import group_label, row_cells

    return [group_label((group.module, group.phase))] + [cell for change in group.changes
                                                        for cell in row_cells(group, change)]


@pytest.mark.parametrize("width", [80, 200])
def test_the_table_is_readable_in_an_80_column_terminal(
        width: int, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Every figure and name whole, every line within the width (80: folded; 200: one table)."""
    from attnscope.cli.diff._command import _print

    times = _lognormal(17, 320, scale=1e6)
    before, after = [], []
    for module in ("model.layers.0.self_attn", "model.decoder.layers.11.encoder_attn"):
        for i, t in enumerate(times):
            extra = {"attnscope.tokens": 64, "attnscope.memory.peak_bytes": 300_000 + i % 7}
            before.append(_row(i, module, "prefill", t, **extra))
            after.append(_row(i, module, "prefill", t * (40 if "decoder" in module else 0.4),
                              **extra))
    result = diary(before, after, min_change=0.05)
    failures = result.gate_failures(0.05)
    monkeypatch.setenv("COLUMNS", str(width))
    _print(result, "before-a-long-name.json", "after-a-long-name.json", 5.0, failures)
    out = capsys.readouterr().out
    lines = out.splitlines()
    table_lines = [line for line in lines if not line.startswith(("change =", "FAIL", "gate"))]
    assert max(len(line) for line in table_lines) <= width, out
    assert "…" not in out
    text = " ".join(out.split())
    for group in result.groups:
        for cell in _wide_cells(group):  # the layer, metric names, figures, intervals, verdicts
            assert cell in text, (cell, out)
    assert ("│ model.layers.0.self_attn (prefill) " in out) == (width == 200)  # one table


def test_notes_name_what_the_gate_could_not_judge() -> None:
    times = _lognormal(16, 60, scale=1e6)
    before = [_row(i, "l0", "decode", t) for i, t in enumerate(times)]
    before += [_row(i, "l0", "prefill", t) for i, t in enumerate(times[:5])]
    after = [_row(i, "l0", "decode", t) for i, t in enumerate(times[::-1])]
    after += [_row(i, "l0", "prefill", 9 * t) for i, t in enumerate(times[:5])]
    result = diary(before, after, min_change=0.05)
    assert result.gate_failures(0.05) == []  # 9x slower, but on 5 calls: no verdict
    lines = notes(result, 5.0, [])
    assert lines[-3].startswith("gate passed")
    # identical decode calls: +0.0% in an interval that reaches past 5%, named as inconclusive
    assert lines[-2].startswith("gate inconclusive for 1 p50 interval(s) that straddle 5% ")
    assert "l0 (decode) +0.0% [" in lines[-2]
    assert lines[-1] == ("not judged by the gate (too few timed calls for a p50 verdict): "
                         "l0 (prefill)")
    memory = [c for c in result.groups[0].changes if c.metric.value == "memory"][0]
    assert verdict_text(memory) == "not measured"


# -- the command on real traces --------------------------------------------------------------

_PROGRAM = """
import json, math, sys
import torch
import torch.nn.functional as F
import attnscope

opts = json.loads(sys.argv[1])
torch.set_num_threads(1)
attnscope.configure(exporter="jaeger-json:" + opts["path"], service_name="diff-test",
                    sample_rate=1.0, profile_rate=opts["profile_rate"],
                    profile_max_per_minute=6000, warmup_calls=5, overhead_budget=1.0,
                    seed=opts["seed"], metrics=False)

def eager(q, k, v):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~keep, float("-inf")), dim=-1) @ v

def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

def slowed(q, k, v):  # the same result, three times the work
    for _ in range(2):
        sdpa(q, k, v)
    return sdpa(q, k, v)

def traced_as(impl):
    core = {"eager": eager, "sdpa": sdpa, "slowed": slowed}[impl]

    def attention(q, k, v, is_causal=True):
        return core(q, k, v)

    return attnscope.trace(name="attention:" + impl)(attention)

# "sdpa/eager": the two called in turn, call by call, in this one process
calls = [traced_as(impl) for impl in opts["impl"].split("/")]
torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, 256, 32) for _ in range(3))
with torch.inference_mode():
    for _ in range(opts["calls"]):
        for call in calls:
            call(q, k, v, is_causal=True)
attnscope.shutdown(timeout_s=60)
"""


def _traces(tmp: Path, impls: Mapping[str, str], calls: int = 120) -> dict[str, Path]:
    """One trace file per name, the programs run side by side (the same machine load for all)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env["ATTNSCOPE_METRICS"] = "false"
    paths, procs = {}, []
    for seed, (name, impl) in enumerate(impls.items()):
        paths[name] = tmp / f"{name}.json"
        opts = {"path": str(paths[name]), "impl": impl, "calls": calls, "seed": seed,
                "profile_rate": 0.25}
        procs.append(subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(_PROGRAM), json.dumps(opts)],
            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err[-2000:]
    return paths


def _diff(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The real command: ``python -m attnscope diff ...`` (about a second of imports, more on a
    busy machine: most tests call ``main`` in-process instead)."""
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "attnscope", "diff", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


def _main(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    from attnscope.cli import main

    code = main(["diff", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _verdict(stdout: str, metric: str) -> str:
    """The verdict cell of the first table row of ``metric``."""
    for line in stdout.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) > 3 and cells[2] == metric:
            return cells[-2]
    raise AssertionError(f"no {metric} row in:\n{stdout}")


def _split_alternately(path: Path, first: Path, second: Path) -> None:
    """One run's traces dealt alternately into two files: two traces of one configuration
    measured under the same conditions, call by call."""
    doc = json.loads(path.read_text())
    for out, part in ((first, doc["data"][0::2]), (second, doc["data"][1::2])):
        out.write_text(json.dumps({**doc, "data": part}))


def _split_by_name(path: Path, outs: Mapping[str, Path]) -> None:
    """A run of implementations called in turn (``attention:<impl>`` spans), one file per
    implementation, its spans named ``attention`` as a run of that one alone names them."""
    doc = json.loads(path.read_text())
    parts: dict[str, list[Any]] = {name: [] for name in outs}
    for trace in doc["data"]:
        names = {span["operationName"] for span in trace["spans"]} & set(outs)
        assert len(names) == 1, names
        (name,) = names
        for span in trace["spans"]:
            if span["operationName"] == name:
                span["operationName"] = "attention"
        parts[name].append(trace)
    for name, out in outs.items():
        out.write_text(json.dumps({**doc, "data": parts[name]}))


def _paired(tmp: Path, *pairs: Mapping[str, str], calls: int = 120) -> dict[str, Path]:
    """One trace file per name. Each mapping (name to implementation) is one program calling
    its implementations in turn, call by call: whatever the machine does meanwhile, it does to
    both. Two programs side by side were not enough: the calls take a fraction of a second, and a
    burst of load on one program's window made SDPA as slow as eager at p50 once in CI (a 2x
    gap unloaded); two runs one after the other differ by 40%."""
    runs = _traces(tmp, {f"run{i}": "/".join(pair.values()) for i, pair in enumerate(pairs)},
                   calls)
    paths: dict[str, Path] = {}
    for i, pair in enumerate(pairs):
        outs = {}
        for name, impl in pair.items():
            paths[name] = outs["attention:" + impl] = tmp / f"{name}.json"
        _split_by_name(runs[f"run{i}"], outs)
    return paths


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("diff")
    paths = _paired(tmp, {"sdpa1": "sdpa", "eager": "eager"}, {"sdpa2": "sdpa", "slowed": "slowed"},
                    calls=240)
    _split_alternately(paths["sdpa1"], tmp / "same_a.json", tmp / "same_b.json")
    return {**paths, "same_a": tmp / "same_a.json", "same_b": tmp / "same_b.json"}


def test_two_traces_of_one_configuration_are_no_change_and_pass_the_gate(
        traces: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    """The calls of one run, dealt alternately into two traces: whatever the machine did, it
    did to both, so the verdict must be "no change" (what the bootstrap over calls vouches
    for; run-to-run variation is not in its interval: docs/cli.md)."""
    # one run per side: the gate judges call-level evidence only when asked to (issue 22)
    done = _diff(traces["same_a"], traces["same_b"], "--fail-if-slower", "5", "--call-level-gate")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gate passed" in done.stdout and not done.stderr
    verdict = _verdict(done.stdout, "p50")
    if verdict != "no change":
        # A 95% interval misses the true 0 in about one run in twenty, and a burst of load in a
        # busy CI widens it past --min-change (±2-3% here unloaded): "inconclusive" then (the
        # interval excludes 0 but reaches inside ±5%), never a direction.
        again, interval = _judged(capsys, traces["same_a"], traces["same_b"], "p50")
        assert (verdict, again) == ("inconclusive", "inconclusive"), (verdict, again)
        assert -0.05 < interval[1] and interval[0] < 0.05, interval


def _judged(capsys: pytest.CaptureFixture[str], before: Path, after: Path,
            metric: str) -> tuple[str, list[float]]:
    """(verdict, interval) of ``metric`` in ``diff --json -``."""
    code, out, _ = _main(capsys, before, after, "--json", "-")
    assert code == 0, out  # no gate asked for: a slower verdict alone does not fail
    (group,) = json.loads(out)["groups"]
    found = next(m for m in group["metrics"] if m["metric"] == metric)
    return found["verdict"], found["interval"]


def test_eager_and_sdpa_differ_both_ways(traces: dict[str, Path],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    # Time is "slower", or, when a loaded machine widens the call-level interval until it
    # straddles --min-change (docs/cli.md), "inconclusive" with an interval that still excludes
    # 0 on the slower side: the direction is established either way.
    for metric, worse, sign in (("p50", "slower", 1), ("tokens/s p50", "slower", -1)):
        verdict, interval = _judged(capsys, traces["sdpa1"], traces["eager"], metric)
        assert verdict == worse or (verdict == "inconclusive"
                                    and min(sign * interval[0], sign * interval[1]) > 0), \
            (metric, verdict, interval)
    code, slower, _ = _main(capsys, traces["sdpa1"], traces["eager"])
    assert code == 0
    assert _verdict(slower, "memory peak p50") == "larger"  # the score matrix
    verdict, interval = _judged(capsys, traces["eager"], traces["sdpa1"], "p50")
    assert verdict == "faster" or (verdict == "inconclusive" and max(interval) < 0), interval


def test_a_slowed_after_fails_the_gate(traces: dict[str, Path], tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "diff.html"
    done = _diff(traces["sdpa2"], traces["slowed"], "--fail-if-slower", "5", "--html", page,
                 "--call-level-gate")
    assert done.returncode == 1, done.stdout + done.stderr
    assert _verdict(done.stdout, "p50") == "slower"
    fail = re.search(r"FAIL: attention p50 \S+ \(interval \[\+([0-9.]+)%", done.stdout)
    assert fail, done.stdout
    text = page.read_text()
    assert text.startswith("<!DOCTYPE html>") and "<svg" in text and "slower" in text
    assert "http://" not in text.replace("http://www.w3.org", "")
    # the gate is the interval's lower end: just above it, the same two traces pass
    code, out, _ = _main(capsys, traces["sdpa2"], traces["slowed"],
                         "--fail-if-slower", str(float(fail.group(1)) + 0.1), "--call-level-gate")
    assert code == 0 and "gate passed" in out
    # a gate wide enough for run-to-run noise (25%) still fails three times the work
    code, out, _ = _main(capsys, traces["sdpa2"], traces["slowed"], "--fail-if-slower", "25",
                         "--call-level-gate")
    assert code == 1, out


def test_bad_input_from_the_real_command_is_one_stderr_line(tmp_path: Path) -> None:
    done = _diff(tmp_path / "nope.json", tmp_path / "nope2.json")
    assert done.returncode == 2 and not done.stdout
    assert done.stderr.strip().splitlines() == [
        f"attnscope diff: error: {tmp_path / 'nope.json'}: no such file or directory"]


@pytest.mark.parametrize("case", ["not_json", "no_spans", "no_shared", "unwritable_html"])
def test_bad_input_is_one_stderr_line_and_exit_2(case: str, traces: dict[str, Path],
                                                 tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "other.json"
    if case == "no_shared":  # a real trace whose only group has another name
        doc = json.loads(traces["sdpa1"].read_text())
        for trace in doc["data"]:
            for span in trace["spans"]:
                span["operationName"] = "renamed"
        other.write_text(json.dumps(doc))
    else:
        other.write_text({"not_json": "{oops", "no_spans": '{"data": []}'}.get(case, "{}"))
    args: dict[str, list[str | Path]] = {
        "not_json": [traces["sdpa1"], other], "no_spans": [other, traces["sdpa1"]],
        "no_shared": [traces["sdpa1"], other],
        "unwritable_html": [traces["sdpa1"], traces["sdpa2"], "--html", tmp_path / "no" / "x"]}
    code, out, err = _main(capsys, *args[case])
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and err.startswith("attnscope diff: error: ")


def test_a_bad_percentage_is_refused_by_argparse(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        _main(capsys, "a", "b", "--fail-if-slower", "-3")
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
        "argument --fail-if-slower: must be a finite percentage >= 0, got -3")


def test_html_renders_in_chromium(traces: dict[str, Path], tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "diff.html"
    code, _, _ = _main(capsys, traces["sdpa1"], traces["eager"], "--html", page)
    assert code == 0
    dom = dom_of(page)
    assert dom.count("<svg") == 1 and "memory peak p50" in dom
