"""``attnscope diff`` over runs (issue 22 §1): the hierarchical bootstrap on synthetic runs whose
run-to-run noise the test controls (cannot flake: fixed seeds), the command on synthetic trace
files laid out as run and repeat directories (every printed figure against a computation done
here from the spans), and a few real runs of a small traced program (the whole path)."""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnscope.cli import main
from attnscope.cli.diff._runs import compare_runs, noise_floor
from attnscope.cli.diff._stats import METRICS, compare, gate_failed, verdict

ROOT = Path(__file__).resolve().parent.parent
TIME = tuple(m for m in METRICS if m.value == "time")
P50 = METRICS[0]

# -- the statistic on synthetic runs ---------------------------------------------------------


def _runs(seed: int, n_runs: int, calls: int, *, scale: float = 1.0, run_sigma: float = 0.3,
          call_sigma: float = 0.2) -> list[np.ndarray]:
    """Runs whose every call is shifted by the run's own factor (load, frequency, cache state:
    what moves a whole run), lognormal around ``scale``."""
    rng = np.random.default_rng(seed)
    return [rng.lognormal(0.0, call_sigma, calls) * scale * rng.lognormal(0.0, run_sigma)
            for _ in range(n_runs)]


def test_the_per_run_figures_are_each_runs_quantile_and_the_side_their_median() -> None:
    before, after = _runs(1, 3, 120), _runs(2, 4, 120, scale=2.0)
    changes = compare_runs(before, after, TIME, min_change=0.05)
    for c, q in zip(changes, (0.5, 0.95, 0.99), strict=True):
        per_b = [_linear_quantile(r, q) for r in before]
        per_a = [_linear_quantile(r, q) for r in after]
        assert c.runs_before == pytest.approx(per_b) and c.runs_after == pytest.approx(per_a)
        assert c.before == pytest.approx(statistics.median(per_b))
        assert c.after == pytest.approx(statistics.median(per_a))
        assert c.change == pytest.approx(statistics.median(per_a) / statistics.median(per_b) - 1)
        assert (c.n_before, c.n_after) == (360, 480)
    # 120 calls a run: p99 needs 300 in every run
    assert [c.verdict for c in changes][2] == "too few calls"
    assert math.isnan(changes[2].low)


def _linear_quantile(values: Sequence[float] | np.ndarray, q: float) -> float:
    """numpy's default ("linear", Hyndman & Fan type 7), written out here."""
    ordered = sorted(float(v) for v in values)
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    return ordered[lo] + (h - lo) * (ordered[min(lo + 1, len(ordered) - 1)] - ordered[lo])


def test_run_to_run_noise_is_in_the_interval_where_the_call_level_one_misses_it() -> None:
    """A/A with runs that differ by ~30%: one run per side, the call-level interval calls most
    pairs slower or faster; over runs, 3 a side, the gate at 10% never fails."""
    call_level = gated = 0
    pairs = 40
    for seed in range(pairs):
        before, after = _runs(2 * seed, 3, 100), _runs(2 * seed + 1, 3, 100)
        one, = compare(before[0], after[0], (P50,), min_change=0.05, resamples=500)
        call_level += one.verdict != "no change"
        over, = compare_runs(before, after, (P50,), min_change=0.05, resamples=500, seed=seed)
        gated += gate_failed(over, 0.10)
        assert over.high - over.low > 0.2  # the runs' spread is in it
    assert call_level >= pairs // 2 and gated == 0


def test_a_real_2x_slowdown_fails_the_gate_over_runs() -> None:
    detected = 0
    for seed in range(20):
        before = _runs(100 + seed, 3, 100, run_sigma=0.1)
        after = _runs(200 + seed, 3, 100, scale=2.0, run_sigma=0.1)
        p50, = compare_runs(before, after, (P50,), min_change=0.05, resamples=500)
        detected += gate_failed(p50, 0.10) and p50.verdict == "slower"
    assert detected >= 19


def test_the_interval_is_reproducible_and_resamples_runs() -> None:
    before, after = _runs(5, 3, 60), _runs(6, 3, 60, scale=1.5)
    first = compare_runs(before, after, TIME)
    # a fixed seed: the same figures, to the last bit (repr: a p99's interval of too few calls
    # is nan, and from Python 3.13 a dataclass's == compares nan fields as unequal)
    assert repr(first) == repr(compare_runs(before, after, TIME))
    # the same calls without run-to-run variation: a narrower interval
    flat_b = [np.random.default_rng(7 + i).lognormal(0, 0.2, 60) for i in range(3)]
    flat_a = [np.random.default_rng(17 + i).lognormal(0, 0.2, 60) * 1.5 for i in range(3)]
    flat = compare_runs(flat_b, flat_a, TIME)
    assert flat[0].high - flat[0].low < first[0].high - first[0].low


def test_a_run_with_too_few_calls_makes_the_quantile_too_few_calls() -> None:
    before = _runs(8, 3, 100)
    after = [*_runs(9, 2, 100), _runs(10, 1, 10)[0]]  # one run of 10 calls
    p50, = compare_runs(before, after, (P50,))
    assert p50.verdict == "too few calls" and not gate_failed(p50, 0.0)
    assert p50.n_after == 210 and len(p50.runs_after) == 3


def test_the_verdict_rule_inconclusive_both_ways_and_at_the_threshold() -> None:
    # interval excludes 0, change >= min_change: the whole interval beyond min_change -> a
    # direction, however wide; straddling min_change -> inconclusive; interval contains 0 or
    # |change| < min_change -> no change (issue 38 §5; tests/test_gate_verdict.py for the gate)
    assert verdict(0.20, 0.05, 0.30, 0.05, P50) == "slower"
    assert verdict(0.20, 0.05 - 1e-9, 0.30, 0.05, P50) == "inconclusive"
    assert verdict(0.20, 0.06, 50.0, 0.05, P50) == "slower"  # a long far tail is fine
    assert verdict(-0.20, -0.5, -0.05, 0.05, P50) == "faster"
    assert verdict(-0.20, -0.5, -0.05 + 1e-9, 0.05, P50) == "inconclusive"
    assert verdict(0.30, -1.0, math.inf, 0.05, P50) == "no change"
    # issue 22's one-run A/A pair: slower on its calls; the gate needs 2+ runs a side for that
    assert verdict(7.13, 0.102, 188.4, 0.05, P50) == "slower"
    assert verdict(0.20, -0.01, 0.30, 0.05, P50) == "no change"
    assert verdict(0.04, 0.01, 0.05, 0.05, P50) == "no change"
    assert not gate_failed(compare_runs(_runs(1, 2, 50), _runs(1, 2, 50), (P50,))[0], 0.0)


def test_the_noise_floor_is_the_largest_over_the_smallest_per_run_figure() -> None:
    assert noise_floor([1.0, 1.25, 1.1]) == pytest.approx(0.25)
    assert math.isnan(noise_floor([1.0])) and math.isnan(noise_floor([0.0, 1.0]))


# -- the command on synthetic trace files ------------------------------------------------------


def _span(i: int, name: str, ns: int, tier: str = "timing") -> dict[str, Any]:
    tags = [{"key": "attnscope.tier", "type": "string", "value": tier},
            {"key": "attnscope.module", "type": "string", "value": name},
            {"key": "attnscope.wall_ns", "type": "int64", "value": ns},
            {"key": "attnscope.num_heads", "type": "int64", "value": 4}]
    return {"traceID": f"{i:032x}", "spanID": f"{hash((name, i)) & (2**63 - 1):016x}",
            "operationName": name, "startTime": 1_000 + i, "duration": ns // 1000,
            "tags": tags}


def _write_run(directory: Path, groups: Mapping[str, Sequence[float] | np.ndarray]) -> Path:
    """One run directory: one Jaeger JSON file with ``groups``' calls (wall times in ns)."""
    directory.mkdir(parents=True)
    spans = [_span(i, name, int(ns)) for name, times in groups.items()
             for i, ns in enumerate(times)]
    spans.append(_span(10**6, "layer1", 10**12, tier="profile"))  # profiled: never timed
    (directory / "traces.jaeger.json").write_text(json.dumps(
        {"data": [{"traceID": "0" * 32, "spans": spans, "processes": {}}]}))
    return directory


def _repeat(root: Path, seed: int, n_runs: int, slow: float = 1.0,
            calls: int = 80) -> tuple[Path, list[dict[str, np.ndarray]]]:
    """A repeat directory ``root/run-1 ...``: two layers, layer1 ``slow`` times slower."""
    truth = []
    for k in range(n_runs):
        rng = np.random.default_rng(seed * 100 + k)
        run_factor = rng.lognormal(0.0, 0.05)
        times = {"layer0": np.round(rng.lognormal(13.0, 0.2, calls) * run_factor / 1000) * 1000,
                 "layer1": np.round(rng.lognormal(13.5, 0.2, calls) * run_factor * slow
                                    / 1000) * 1000}
        _write_run(root / f"run-{k + 1}", times)
        truth.append(times)
    return root, truth


def _json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, Any]:
    code = main(["diff", *map(str, args), "--json", "-"])
    out, err = capsys.readouterr()
    assert not err, err
    return code, json.loads(out)


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("runs")
    a, truth_a = _repeat(tmp / "a", 1, 3)
    same, truth_same = _repeat(tmp / "same", 2, 3)
    slow, truth_slow = _repeat(tmp / "slow", 3, 3, slow=2.0)
    return {"a": a, "same": same, "slow": slow,
            "truth": {"a": truth_a, "same": truth_same, "slow": truth_slow}}


def test_a_repeat_directory_is_its_runs_and_equals_the_paths_given_with_vs(
        sides: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, whole = _json(capsys, sides["a"], sides["slow"])
    runs_a = [sides["a"] / f"run-{k}" for k in (1, 2, 3)]
    runs_s = [sides["slow"] / f"run-{k}" for k in (1, 2, 3)]
    code2, split = _json(capsys, *runs_a, "--vs", *runs_s)
    assert code == code2 == 0
    assert whole["groups"] == split["groups"] and whole["runs"] == {"before": 3, "after": 3}
    assert whole["method"].startswith("hierarchical bootstrap") and whole[
        "run_to_run_noise_measured"]


def test_every_figure_of_a_multi_run_diff_against_the_spans(
        sides: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    code, doc = _json(capsys, sides["a"], sides["slow"], "--fail-if-slower", "20")
    assert code == 1 and doc["gate"] == {"fail_if_slower": 0.2, "passed": False,
                                         "judged": True, "exit_code": 1, "inconclusive": []}
    by = {g["module"]: g for g in doc["groups"]}
    assert (by["layer1"]["gate_failed"], by["layer0"]["gate_failed"]) == (True, False)
    for name, group in by.items():
        assert (group["runs_before"], group["runs_after"]) == (3, 3)
        for metric, q in (("p50", 0.5), ("p95", 0.95)):
            m = next(x for x in group["metrics"] if x["metric"] == metric)
            per_b = [_linear_quantile(t[name], q) for t in sides["truth"]["a"]]
            per_a = [_linear_quantile(t[name], q) for t in sides["truth"]["slow"]]
            assert m["runs_before"] == pytest.approx(per_b)
            assert m["runs_after"] == pytest.approx(per_a)
            assert m["before"] == pytest.approx(statistics.median(per_b))
            assert m["change"] == pytest.approx(statistics.median(per_a)
                                                / statistics.median(per_b) - 1)
            assert m["calls_before"] == 240  # the profiled call is not timed
        p50 = group["metrics"][0]
        assert p50["verdict"] == ("slower" if name == "layer1" else "no change")
        assert p50["interval"][0] <= p50["change"] <= p50["interval"][1]
        floor = next(n for n in doc["noise"]["before"] if n["module"] == name)
        per_run = [statistics.median(t[name]) for t in sides["truth"]["a"]]
        assert floor["p50_per_run"] == pytest.approx(per_run)
        assert floor["noise_floor"] == pytest.approx(max(per_run) / min(per_run) - 1)
        assert floor["calls"] == (243 if name == "layer1" else 240)  # + a profiled call a run


def test_the_table_shows_the_noise_floor_and_the_gate_passes_an_a_a_pair(
        sides: dict[str, Any], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    code = main(["diff", str(sides["a"]), str(sides["same"]), "--fail-if-slower", "20"])
    out = capsys.readouterr().out
    assert code == 0 and "gate passed" in out, out
    assert "A/A noise floor of BEFORE" in out and "A/A noise floor of AFTER" in out
    assert "hierarchical bootstrap interval (runs, then calls within each run)" in out
    assert "3 BEFORE runs, 3 AFTER runs" in out
    from attnscope.cli.render.units import quantity

    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()
            if line.startswith("│")]
    for side, truth in (("BEFORE", sides["truth"]["a"]), ("AFTER", sides["truth"]["same"])):
        per_run = [statistics.median(t["layer1"]) for t in truth]
        noise_rows = [r for r in rows if len(r) == 5 and r[0] == "layer1"]
        row = noise_rows[0 if side == "BEFORE" else 1]
        assert row == ["layer1", "3", "243", ", ".join(quantity(v, "time") for v in per_run),
                       f"{(max(per_run) / min(per_run) - 1) * 100:.1f}%"]
    # the p50 row of layer1: each side's median of per-run medians, and their change
    b = statistics.median(statistics.median(t["layer1"]) for t in sides["truth"]["a"])
    a = statistics.median(statistics.median(t["layer1"]) for t in sides["truth"]["same"])
    [p50] = [r for r in rows if len(r) == 8 and r[1] == "p50" and r[0] == "layer1"]
    assert p50[2:6] == ["240 / 240", quantity(b, "time"), quantity(a, "time"),
                        f"{(a / b - 1) * 100:+.1f}%"]


def test_noise_alone_lists_each_runs_p50_and_the_floor(
        sides: dict[str, Any], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["diff", "--noise", str(sides["a"])]) == 0
    out = capsys.readouterr().out
    for name in ("layer0", "layer1"):
        per_run = [statistics.median(t[name]) for t in sides["truth"]["a"]]
        line = next(x for x in out.splitlines() if f"│ {name} " in x)
        assert f"{(max(per_run) / min(per_run) - 1) * 100:.1f}%" in line
        assert f" {243 if name == 'layer1' else 240} " in line  # 3 runs, profiled calls too
    code, doc = _json(capsys, "--noise", *(sides["a"] / f"run-{k}" for k in (1, 2, 3)))
    assert code == 0 and [n["module"] for n in doc["noise"]] == ["layer0", "layer1"]


def test_one_run_per_side_says_noise_is_unmeasured_and_the_gate_exits_3(
        sides: dict[str, Any], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    one_a, one_s = sides["a"] / "run-1", sides["slow"] / "run-1"
    code = main(["diff", str(one_a), str(one_s), "--fail-if-slower", "5"])
    out = capsys.readouterr().out
    assert code == 3, out
    assert "one run per side: run-to-run noise is unmeasured" in out
    [line] = [x for x in out.splitlines() if x.startswith("gate not judged")]
    assert "attnscope run --repeat 3" in line and "FAIL" not in out
    assert main(["diff", str(one_a), str(one_s), "--fail-if-slower", "5",
                 "--call-level-gate"]) == 1
    assert "FAIL: layer1 p50" in capsys.readouterr().out
    code, doc = _json(capsys, one_a, one_s, "--fail-if-slower", "5")
    assert code == 3 and doc["gate"]["judged"] is False and doc["gate"]["passed"] is None
    assert doc["runs"] == {"before": 1, "after": 1} and not doc["run_to_run_noise_measured"]
    assert main(["diff", str(one_a), str(one_s)]) == 0  # no gate asked: nothing to judge
    capsys.readouterr()
    # one run against three: still no run-level gate (BEFORE's run-to-run noise unmeasured)
    assert main(["diff", str(one_a), str(sides["slow"]), "--fail-if-slower", "5"]) == 3
    capsys.readouterr()


@pytest.mark.parametrize("args, message", [
    (["A", "B", "C"], "3 paths: give BEFORE AFTER"),
    (["--noise", "A", "--vs", "B"], "--noise measures the runs of one program"),
])
def test_bad_path_counts_are_one_stderr_line(args: list[str], message: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["diff", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and message in err


def test_an_alternate_directory_asks_for_one_side_each(
        sides: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for half in ("a", "b"):
        (tmp_path / half).mkdir()
    assert main(["diff", str(tmp_path), str(sides["a"])]) == 2
    assert "give one per side" in capsys.readouterr().err


# -- real runs of a small traced program (the whole path) -------------------------------------

# the benchmark's program (benchmarks/bench_diff_aa.py), at CI size
_PROGRAM = (ROOT / "benchmarks" / "aa_program.py").read_text()


def program_runs(root: Path, slows: Sequence[int], calls: int = 40,
                 parallel: int = 2) -> list[Path]:
    """One run directory per entry of ``slows`` (``root/run-K/traces.jaeger.json``), ``parallel``
    processes at a time."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env["ATTNSCOPE_METRICS"] = "false"
    dirs = [root / f"run-{k + 1}" for k in range(len(slows))]
    for start in range(0, len(slows), parallel):
        procs = []
        for d, slow in zip(dirs[start:start + parallel], slows[start:start + parallel],
                           strict=True):
            d.mkdir(parents=True)
            procs.append(subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(_PROGRAM),
                 str(d / "traces.jaeger.json"), str(slow), str(calls)],
                env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        for proc in procs:
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err[-2000:]
    return dirs


def _gate_as_its_intervals_say(code: int, doc: dict[str, Any], limit: float) -> None:
    """The exit code, the gate's JSON and each group's flags follow from the printed p50
    intervals alone: 1 iff an interval lies wholly above ``limit``; straddlers named."""
    above, straddling = set(), set()
    for g in doc["groups"]:
        p50 = next(m for m in g["metrics"] if m["metric"] == "p50")
        low, high = p50["interval"]
        assert low is not None and high is not None, p50  # 40 calls a run: a p50 verdict
        if low > limit:
            above.add(g["module"])
        elif high > limit:
            straddling.add(g["module"])
        assert g["gate_failed"] is (g["module"] in above)
        assert g["gate_inconclusive"] is (g["module"] in straddling)
    assert code == (1 if above else 0), json.dumps(doc["groups"], indent=1)
    assert doc["gate"] == {"fail_if_slower": limit, "passed": not above, "judged": True,
                           "exit_code": code, "inconclusive": sorted(straddling)}


def test_real_runs_the_gate_decides_by_its_intervals(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole path on real runs of the benchmark's program (3 runs, and 3 with layer1
    doing three times the work, alternating, two at a time): each diff's exit code is what
    its intervals say — the gate's promise, which holds however loaded the machine is.

    Whether the A/A pairs pass and the 3x pairs fail depends on how much the machine moved
    between runs: that was this test until issue 38 (it failed 4 of 6 times on a loaded 2-core
    machine) and is now measured by benchmarks/bench_diff_aa.py (``--slow 3``)."""
    runs = program_runs(tmp_path, [1, 3, 1, 3, 1, 3])
    a, s = [runs[i] for i in (0, 2, 4)], [runs[i] for i in (1, 3, 5)]
    for before, after in ((a, s), (s, a), (a[:2], a[1:])):
        code, doc = _json(capsys, *before, "--vs", *after, "--fail-if-slower", "25")
        _gate_as_its_intervals_say(code, doc, 0.25)
        assert {g["module"] for g in doc["groups"]} == {"layer0", "layer1"}
    # the same runs on both sides: no change at all, and an interval around it
    code, doc = _json(capsys, *a, "--vs", *a, "--fail-if-slower", "25")
    _gate_as_its_intervals_say(code, doc, 0.25)
    for g in doc["groups"]:
        p50 = g["metrics"][0]
        assert p50["change"] == 0.0 and p50["interval"][0] <= 0.0 <= p50["interval"][1]
    assert code == 0
    # one run a side: not judged, whatever the runs show
    code, doc = _json(capsys, a[0], s[0], "--fail-if-slower", "25")
    assert code == 3 and doc["gate"]["judged"] is False


def test_the_html_page_carries_the_noise_floor_and_the_unjudged_gate(
        sides: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    page = tmp_path / "runs.html"
    assert main(["diff", str(sides["a"]), str(sides["slow"]), "--html", str(page)]) == 0
    text = page.read_text()
    assert "A/A noise floor of BEFORE" in text and "A/A noise floor of AFTER" in text
    assert text.count("<svg") == 1 and "hierarchical bootstrap" in text
    one = tmp_path / "one.html"
    assert main(["diff", str(sides["a"] / "run-1"), str(sides["slow"] / "run-1"),
                 "--fail-if-slower", "5", "--html", str(one)]) == 3
    text = one.read_text()
    assert "gate not judged (exit 3)" in text and "noise floor of" not in text
    capsys.readouterr()


def test_a_gate_with_no_p50_it_could_judge_is_not_judged_rather_than_passed(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three runs a side but 19 timed calls a run (a p50 verdict needs 20 in every run): the
    gate has nothing to judge, so it says so and exits 3; it does not read as a pass."""
    before, _ = _repeat(tmp_path / "before", 4, 3, calls=19)
    after, _ = _repeat(tmp_path / "after", 5, 3, slow=3.0, calls=19)
    assert main(["diff", str(before), str(after), "--fail-if-slower", "5"]) == 3
    out = capsys.readouterr().out
    assert "gate passed" not in out
    assert "found no layer with enough timed calls in every run for a p50 verdict" in out
    assert "too few calls (< 20 in a run)" in out  # 57 calls a side: the rule is per run
    code, doc = _json(capsys, before, after, "--fail-if-slower", "5")
    assert code == 3 and doc["gate"] == {"fail_if_slower": 0.05, "passed": None,
                                         "judged": False, "exit_code": 3, "inconclusive": []}
    # one call more a run and the same slowdown is judged, and fails
    before20, _ = _repeat(tmp_path / "before20", 4, 3, calls=20)
    after20, _ = _repeat(tmp_path / "after20", 5, 3, slow=3.0, calls=20)
    assert main(["diff", str(before20), str(after20), "--fail-if-slower", "5"]) == 1


def _memory_run(directory: Path, peaks: Sequence[int], seed: int) -> Path:
    """One run: 30 timed layer0 calls, and a profiled one per memory peak in ``peaks`` (on CPU
    only profiled calls measure memory)."""
    directory.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    spans = [_span(i, "layer0", int(ns)) for i, ns in enumerate(rng.integers(10**5, 10**6, 30))]
    for j, peak in enumerate(peaks):
        span = _span(1000 + j, "layer0", 5 * 10**6, tier="profile")
        span["tags"].append({"key": "attnscope.memory.peak_bytes", "type": "int64",
                             "value": peak})
        spans.append(span)
    (directory / "traces.jaeger.json").write_text(json.dumps(
        {"data": [{"traceID": "0" * 32, "spans": spans, "processes": {}}]}))
    return directory


def _memory_metric(document: Any) -> dict[str, Any]:
    (group,) = document["groups"]
    return dict(next(m for m in group["metrics"] if m["metric"] == "memory peak p50"))


def test_a_memory_peak_measured_on_one_side_is_shown_for_that_side(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """BEFORE profiled 3 calls (547 KiB ...), AFTER none: BEFORE's figure stays (it was null)."""
    peaks = [547 * 1024, 500_000, 620_000]
    measured, unmeasured = _memory_run(tmp_path / "m", peaks, 1), _memory_run(tmp_path / "u", [], 2)
    _, forward = _json(capsys, measured, unmeasured)
    m = _memory_metric(forward)
    assert (m["before"], m["after"]) == (statistics.median(peaks), None)
    assert (m["calls_before"], m["calls_after"], m["verdict"]) == (3, 0, "not measured")
    assert m["change"] is None and m["interval"] == [None, None]
    _, backward = _json(capsys, unmeasured, measured)
    m = _memory_metric(backward)
    assert (m["before"], m["after"], m["verdict"]) == (None, statistics.median(peaks),
                                                      "not measured")
    # several runs on the measured side: each run's p50 and their median, as with both sides
    runs = [_memory_run(tmp_path / f"r{k}", p, 10 + k)
            for k, p in enumerate(([100, 300], [200, 400, 900]))]
    _, several = _json(capsys, *runs, "--vs", unmeasured, _memory_run(tmp_path / "u2", [], 3))
    m = _memory_metric(several)
    assert m["runs_before"] == [200.0, 400.0] and m["before"] == 300.0
    assert m["after"] is None and m["runs_after"] == []
    assert main(["diff", str(measured), str(unmeasured)]) == 0
    out, _ = capsys.readouterr()
    line = next(x for x in out.splitlines() if "memory peak p50" in x)
    assert "547 KiB" in line and "not measured" in line, out
