"""``attnscope compare`` says which implementation is faster only with its noise (issue 38 §2).

Synthetic per-round timings with known answers: samples that overlap are "not distinguishable",
samples that are apart are ranked, with an interval; the interval is checked against the
binomial distribution computed here with scipy (not the command's own arithmetic). The budget
plan is a pure function, tested with the README example's measured call times.
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch
from scipy import stats  # type: ignore[import-untyped]

from attnscope.cli.compare._measure import Spec
from attnscope.cli.compare._plan import MIN_ROUNDS, blocks, plan
from attnscope.cli.compare._ranking import FEW, SAME, SLOWER, rank, sign_interval
from attnscope.cli.compare._render import Row, render_json, render_table
from attnscope.cli.compare._stats import Figures

# The issue's two demo runs on a busy machine: per-call times (ms) that rank the two both ways.
RUN_1 = {"naive": [58.0, 71.0, 60.0, 62.0, 69.0, 64.0, 59.0, 70.0, 66.0, 61.0],
         "sdpa": [112.0, 116.0, 113.0, 115.0, 114.0, 112.0, 116.0, 113.0, 114.0, 115.0]}
RUN_2 = {"naive": [179.0, 202.0, 185.0, 190.0, 199.0, 181.0, 195.0, 188.0, 184.0, 200.0],
         "sdpa": [52.0, 82.0, 60.0, 75.0, 58.0, 80.0, 66.0, 71.0, 55.0, 79.0]}


def _rounds(values: list[float]) -> dict[int, float]:
    return dict(enumerate(values))


def _independent_interval(ratios: list[float], level: float = 0.95) -> tuple[float, float, float]:
    """The sign-test interval from scipy's binomial: the largest k whose coverage
    ``1 - 2 P(X <= k - 1)`` is at least ``level``, X ~ Binomial(n, 1/2)."""
    n, ordered = len(ratios), sorted(ratios)
    ks = [k for k in range(1, n // 2 + 1) if 1 - 2 * stats.binom.cdf(k - 1, n, 0.5) >= level]
    k = max(ks)
    return ordered[k - 1], ordered[n - k], 1 - 2 * stats.binom.cdf(k - 1, n, 0.5)


def test_the_issue_s_two_runs_are_ranked_the_same_way_once_the_load_is_shared() -> None:
    """Sequential blocks saw the load hit one implementation in each run. Interleaved rounds
    share it: the same machine states (run 1's quiet, run 2's busy) applied to both
    implementations of a round give the same ranking in both runs."""
    rng = np.random.default_rng(5)
    naive, sdpa = 90.0, 60.0  # the true times: naive 1.5x sdpa's
    seen = []
    for load in ([1.0] * 10, [3.2, 2.9, 3.3, 1.1, 1.0, 3.0, 2.8, 1.2, 3.1, 1.0]):
        jitter = rng.uniform(0.95, 1.05, size=(2, 10))
        times = {"naive": _rounds([naive * f * j for f, j in zip(load, jitter[0], strict=True)]),
                 "sdpa": _rounds([sdpa * f * j for f, j in zip(load, jitter[1], strict=True)])}
        found = rank(times)
        assert found is not None and found.reference == "sdpa"
        other = found.standings[1]
        assert other.name == "naive" and other.verdict == SLOWER
        assert 1.0 < other.low <= 1.5 <= other.high
        seen.append(other.verdict)
    assert seen == [SLOWER, SLOWER]


def test_overlapping_samples_are_not_distinguishable() -> None:
    """The issue's two runs as the rounds of one: half the rounds see what run 1 saw (naive
    faster), half what run 2 saw (sdpa faster). The per-round ratios go both ways, so no ranking:
    "not distinguishable", with the interval that holds 1."""
    naive = RUN_1["naive"][:5] + RUN_2["naive"][5:]
    sdpa = RUN_1["sdpa"][:5] + RUN_2["sdpa"][5:]
    found = rank({"naive": _rounds(naive), "sdpa": _rounds(sdpa)})
    assert found is not None
    ref, other = found.standings
    ours = {"naive": naive, "sdpa": sdpa}
    ratios = [o / r for o, r in zip(ours[other.name], ours[ref.name], strict=True)]
    assert min(ratios) < 1 < max(ratios)
    low, high, coverage = _independent_interval(ratios)
    assert other.verdict == SAME and low <= 1 <= high
    assert (other.low, other.high) == pytest.approx((low, high))
    assert other.confidence == pytest.approx(coverage)
    assert other.ratio == pytest.approx(float(np.median(ratios)))


def test_separated_samples_are_ranked_with_their_interval() -> None:
    fast = [10.0, 11.0, 10.5, 9.8, 10.2, 10.9, 10.1, 9.9, 10.4, 10.6]
    slow = [x * r for x, r in zip(fast, [2.1, 1.9, 2.0, 2.3, 1.8, 2.0, 2.2, 1.95, 2.05, 2.0],
                                   strict=True)]
    same = [x * r for x, r in zip(fast, [1.1, 0.9, 1.05, 0.97, 1.02, 0.95, 1.0, 1.08, 0.93, 1.01],
                                   strict=True)]
    found = rank({"slow": _rounds(slow), "fast": _rounds(fast), "same": _rounds(same)})
    assert found is not None and found.reference == "fast"
    by = {s.name: s for s in found.standings}
    assert [s.name for s in found.standings] == ["fast", "same", "slow"]
    low, high, coverage = _independent_interval([s / f for s, f in zip(slow, fast, strict=True)])
    assert by["slow"].verdict == SLOWER and (by["slow"].low, by["slow"].high) == pytest.approx(
        (low, high)) and low > 1
    assert by["slow"].ratio == pytest.approx(2.0) and coverage == pytest.approx(1 - 22 / 1024)
    assert by["same"].verdict == SAME


def test_the_order_of_the_list_is_said_with_its_noise_too() -> None:
    """Two implementations both slower than the fastest, whose intervals against it overlap
    (the docs' CPU run: naive 5.69× [5.33, 6.21], math 7.12× [4.54, 7.65]): the list puts one
    before the other, and says that the two are not distinguishable from each other."""
    flash = [50.0, 52.0, 51.0, 49.0, 53.0, 50.0, 51.0, 52.0, 50.0, 49.0]
    naive_r = [5.4, 5.9, 5.6, 6.2, 5.3, 5.8, 5.7, 6.0, 5.5, 5.7]
    math_r = [7.6, 4.5, 7.1, 7.3, 4.6, 7.2, 7.4, 7.0, 7.65, 7.1]
    times = {"flash": flash, "naive": [f * r for f, r in zip(flash, naive_r, strict=True)],
             "math": [f * r for f, r in zip(flash, math_r, strict=True)]}
    found = rank({n: _rounds(v) for n, v in times.items()})
    assert found is not None
    assert [(s.name, s.verdict) for s in found.standings] == [
        ("flash", "fastest"), ("naive", SLOWER), ("math", SLOWER)]
    previous = found.standings[2].previous
    ratios = [m / n for m, n in zip(math_r, naive_r, strict=True)]
    low, high, _ = _independent_interval(ratios)
    assert previous is not None and previous.against == "naive" and previous.verdict == SAME
    assert (previous.low, previous.high) == pytest.approx((low, high)) and low < 1 < high
    assert found.standings[1].previous is None  # the one before it is the reference
    out = io.StringIO()
    render_table(_spec(), _rows(times), out)
    said = next(line for line in out.getvalue().splitlines() if line.startswith("  math "))
    assert said.endswith(f"; not distinguishable from naive here ({previous.ratio:.3g}×, "
                         f"interval {low:.3g}×–{high:.3g}×)"), said


def test_sign_interval_against_the_binomial() -> None:
    rng = np.random.default_rng(1)
    for n in range(MIN_ROUNDS, 40):
        values = list(rng.lognormal(size=n))
        got = sign_interval(values)
        assert got is not None
        assert got == pytest.approx(_independent_interval(values))
    for n in range(1, MIN_ROUNDS):  # 95% needs six: with five, min..max covers 93.75%
        assert sign_interval(list(range(n))) is None


def test_too_few_rounds_are_not_ranked() -> None:
    found = rank({"a": _rounds([1.0] * 4), "b": _rounds([9.0] * 4)})
    assert found is not None and found.standings[1].verdict == FEW
    assert rank({"a": _rounds([1.0] * 8)}) is None  # one implementation: nothing to rank
    pairs = rank({"a": {0: 1.0, 1: 1.0, 2: 1.0, 3: 1.0, 4: 1.0, 5: 1.0},
                  "b": {0: 2.0, 1: 2.0, 2: 2.0, 3: 2.0, 4: 2.0, 9: 2.0}})  # 5 rounds in common
    assert pairs is not None and pairs.standings[1].verdict == FEW


def _rows(times: dict[str, list[float]]) -> list[Row]:
    return [Row(name, "ok", figures=Figures(calls=len(v), wall_us={"p50": float(np.median(v))},
                                            rounds=_rounds(v))) for name, v in times.items()]


def _spec(runs: int = 10) -> Spec:
    return Spec(1, 2, 2, 8, 8, torch.float32, torch.device("cpu"), runs=runs)


def test_the_table_and_json_say_the_noise() -> None:
    fast = [10.0, 11.0, 10.5, 9.8, 10.2, 10.9, 10.1, 9.9, 10.4, 10.6]
    times = {"naive": [2 * x for x in fast], "flash": fast,
             "math": [x * r for x, r in zip(fast, [1.2, 0.8] * 5, strict=True)]}
    rows = _rows(times)
    text, doc = io.StringIO(), io.StringIO()
    render_table(_spec(), rows, text)
    render_json(_spec(), rows, doc)
    lines = text.getvalue().splitlines()
    head = lines.index("which is faster (each one's time ÷ flash's in the same round, median "
                       "over the rounds, 97.9% interval):")
    assert lines[head + 1].split() == ["flash", "the", "lowest", "median", "time"]
    assert lines[head + 2].split() == ["math", "not", "distinguishable", "from", "flash", "here",
                                       "(1×,", "interval", "0.8×–1.2×)"]
    assert lines[head + 3].split() == ["naive", "2×", "flash's", "time,", "slower",
                                       "(interval", "2×–2×);", "2.08×", "math's", "time,",
                                       "slower", "(interval", "1.67×–2.5×)"]
    ranking = json.loads(doc.getvalue())["ranking"]
    assert ranking["reference"] == "flash"
    entries = {e["name"]: e for e in ranking["entries"]}
    naive = {k: v for k, v in entries["naive"].items() if k != "previous"}
    assert naive == {"name": "naive", "verdict": "slower", "ratio": 2.0, "low": 2.0, "high": 2.0,
                     "confidence": pytest.approx(1 - 22 / 1024), "rounds": 10}
    assert entries["math"]["verdict"] == "not distinguishable"
    assert entries["math"]["previous"] is None  # the one before it is the reference
    assert entries["naive"]["previous"] == {
        "against": "math", "verdict": "slower", "ratio": pytest.approx((2 / 1.2 + 2 / 0.8) / 2),
        "low": pytest.approx(2 / 1.2), "high": pytest.approx(2 / 0.8),
        "confidence": pytest.approx(1 - 22 / 1024), "rounds": 10}
    assert entries["flash"]["verdict"] == "fastest" and entries["flash"]["low"] is None


def test_few_rounds_print_no_ranking_only_how_to_get_one() -> None:
    rows = _rows({"naive": [2.0, 2.1, 2.2, 2.0], "flash": [1.0, 1.1, 1.0, 1.0]})
    out = io.StringIO()
    render_table(_spec(4), rows, out)
    text = out.getvalue()
    assert ("naive  not ranked against flash: 4 rounds, 6 needed for an interval (--runs 6 or "
            "more)") in text
    assert "slower" not in text and "faster than" not in text


def test_the_budget_plan_for_the_readme_example() -> None:
    """8,16,1024,64 causal on the 2-core CPU: naive 2.2 s, math 2.1 s, flash 0.43 s a call."""
    made = plan(50, 5, [2.2, 2.1, 0.43], 60.0)
    fits = math.floor(60.0 / 4.73)  # one call of each: 4.73 s; 12 calls of each fit
    assert (made.runs, made.warmup, made.rounds) == (fits - 1, 1, 10) and made.cut
    assert made.describe() == ("--budget 60 s: 11 timed and 1 warm-up calls each instead of 50 "
                               "and 5 (a call of each takes about 4.73 s; --budget 0 for all)")
    assert (made.runs + made.warmup) * made.round_s <= 60.0


def test_the_budget_plan_keeps_what_fits_and_never_goes_below_an_interval() -> None:
    assert not plan(50, 5, [0.01, 0.02], 60.0).cut  # 0.03 s a round: all 55 fit
    assert not plan(50, 5, [2.2, 2.1], None).cut and not plan(50, 5, [2.2], 0.0).cut
    slow = plan(50, 5, [30.0, 40.0], 60.0)  # not one round fits: the floor, overrun
    assert (slow.runs, slow.warmup, slow.rounds, slow.cut) == (MIN_ROUNDS, 1, MIN_ROUNDS, True)
    few = plan(4, 0, [30.0], 10.0)  # fewer asked than the floor: what was asked
    assert (few.runs, few.warmup, few.cut) == (4, 0, False)
    mid = plan(50, 5, [1.0], 30.0)  # 30 fit: 29 timed, 1 warm-up
    assert (mid.runs, mid.warmup) == (29, 1)
    more = plan(20, 5, [1.0], 23.0)  # the timed calls all fit, the warm-up takes the rest
    assert (more.runs, more.warmup) == (20, 3)


@pytest.mark.parametrize("runs, rounds", [(50, 10), (25, 10), (7, 7), (11, 10), (6, 6)])
def test_blocks_share_the_calls_out(runs: int, rounds: int) -> None:
    sizes = blocks(runs, rounds)
    assert len(sizes) == rounds and sum(sizes) == runs and max(sizes) - min(sizes) <= 1
    assert sizes == sorted(sizes, reverse=True)


class _Span:
    def __init__(self, name: str, attributes: dict[str, object]) -> None:
        self.name, self.attributes = name, attributes


def test_round_times_are_the_median_of_each_round_in_the_time_basis() -> None:
    """Device time when measured (CUDA: synthetic spans here, no GPU on this machine), else
    wall time; untimed or round-less spans are not a round's."""
    from attnscope.cli.compare._stats import figures

    timed = {"compare.phase": "timed", "attnscope.tier": "timing"}
    walls = {0: [5_000, 9_000, 6_000], 1: [7_000, 8_000]}
    spans = [_Span("compare.x", {**timed, "compare.round": r, "attnscope.wall_ns": w,
                                 "attnscope.device_ns": w // 10})
             for r, ws in walls.items() for w in ws]
    spans.append(_Span("compare.x", {**timed, "attnscope.wall_ns": 10**9}))  # no round
    spans.append(_Span("compare.x", {"compare.phase": "profiled", "attnscope.tier": "profile",
                                     "compare.round": 0, "attnscope.wall_ns": 10**9}))
    with_device = figures(spans, "compare.x")
    assert with_device.rounds == {0: 0.6, 1: 0.75}  # µs of device time
    wall_only = [_Span(s.name, {k: v for k, v in s.attributes.items()
                                if k != "attnscope.device_ns"}) for s in spans]
    assert figures(wall_only, "compare.x").rounds == {0: 6.0, 1: 7.5}
