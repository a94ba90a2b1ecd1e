"""Every figure ``attnscope compare`` prints, recomputed here from what it recorded.

The command runs in-process on a tiny shape; the spans it reads and the outputs it checks are
taken on the way (a spy that passes them through unchanged), and each figure of the table and the
JSON is recomputed from them with plain Python and numpy written below — never with the helpers
the command uses. The guardrail is driven from both sides of every dtype's tolerance by a user
function whose error is placed one step inside and one step outside it.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import pytest
import torch

from attnscope.cli.compare import _command, _measure
from attnscope.cli.compare._command import exit_code, run_compare
from attnscope.cli.compare._impls import Impl
from attnscope.cli.compare._render import Row, render_json, render_table
from attnscope.cli.compare._stats import figures
from tests.support.helpers import brute_force_flops

# the attribute names as docs/attributes.md states them (not read from attnscope's schema)
TIER, WALL, DEVICE, FLOPS = "attnscope.tier", "attnscope.wall_ns", "attnscope.device_ns", \
    "attnscope.flops"
BACKEND, COUNT, TOP, PEAK = "attnscope.backend", "attnscope.kernel.count", \
    "attnscope.kernel.top_names", "attnscope.memory.peak_bytes"
# docs/cli.md's guardrail table
DOC_TOLERANCE = {torch.float32: 1e-4, torch.float16: 7.8e-3, torch.bfloat16: 6.25e-2}

B, H, KV, S, D = 1, 4, 2, 32, 16
RUNS, WARMUP, PROFILE_RUNS = 25, 1, 3
DROPPED = "figs:dropped"  # one of its timed spans is withheld: the "recorded N of M" note


def _percentile(values: list[float], p: float) -> float:
    """Linear interpolation between the closest ranks (what docs/cli.md and numpy's default
    mean by a percentile), written out."""
    xs = sorted(values)
    pos = (len(xs) - 1) * p / 100
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def _reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> np.ndarray:
    """float64 attention in numpy: K/V head j serves query heads j·g … j·g+g−1, causal j ≤ i."""
    q64, k64, v64 = (t.detach().to("cpu", torch.float64).numpy() for t in (q, k, v))
    group = q64.shape[1] // k64.shape[1]
    k64, v64 = np.repeat(k64, group, axis=1), np.repeat(v64, group, axis=1)
    scores = q64 @ np.swapaxes(k64, -1, -2) / math.sqrt(q64.shape[-1])
    if causal:
        n = scores.shape[-1]
        scores = np.where(np.tril(np.ones((n, n), dtype=bool)), scores, -np.inf)
    scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
    out: np.ndarray = scores / scores.sum(axis=-1, keepdims=True) @ v64
    return out


def _error(output: torch.Tensor, ref: np.ndarray) -> tuple[float, float]:
    diff = float(np.abs(output.detach().to(torch.float64).numpy() - ref).max())
    return diff, diff / float(np.abs(ref).max())


class Recorded:
    """What the command saw: its spans, and each probe output with the inputs it was made from."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.outputs: list[torch.Tensor] = []
        self.inputs: tuple[torch.Tensor, ...] = ()


@contextmanager
def _spying() -> Iterator[Recorded]:
    """The spans and the checked outputs, passed on unchanged (but for one span of DROPPED)."""
    seen = Recorded()
    real_figures, real_errors, real_make = figures, _measure.errors, _measure.make_inputs

    def spy_figures(spans: list[Any], name: str) -> Any:
        if not seen.spans:
            seen.spans = list(spans)
            timed = [s for s in seen.spans if s.name == "compare." + DROPPED
                     and (s.attributes or {}).get("compare.phase") == "timed"]
            if timed:
                seen.spans.remove(timed[0])
        return real_figures(seen.spans, name)

    def spy_errors(output: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
        seen.outputs.append(output.detach().clone())
        return real_errors(output, ref)

    def spy_make(spec: _measure.Spec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        made = real_make(spec)
        seen.inputs = tuple(t.clone() for t in made)
        return made

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_command, "figures", spy_figures)
        mp.setattr(_measure, "errors", spy_errors)
        mp.setattr(_measure, "make_inputs", spy_make)
        yield seen


@pytest.fixture
def spy() -> Iterator[Recorded]:
    with _spying() as seen:
        yield seen


@pytest.fixture(autouse=True)
def _wide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")  # one table, not folded


def _sdpa_repeating(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    is_causal: bool = False) -> torch.Tensor:
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _render(spec: _measure.Spec, rows: list[Row]) -> tuple[str, dict[str, Any]]:
    text, doc = io.StringIO(), io.StringIO()
    render_table(spec, rows, text)
    render_json(spec, rows, doc)
    return text.getvalue(), json.loads(doc.getvalue())


def _table_rows(text: str) -> dict[str, list[str]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.split("│")]
        if len(cells) == 11:
            rows[cells[0]] = cells
    return rows


_UNITS = {"ns": 1e-3, "µs": 1.0, "ms": 1e3, "s": 1e6, "B": 1, "KiB": 2**10, "MiB": 2**20,
          "GiB": 2**30}


def _parse(cell: str) -> float:
    """A printed figure back to a number (times in µs, memory in bytes)."""
    number, _, unit = cell.partition(" ")
    return float(number) * (_UNITS[unit] if unit else 1)


def _printed_as(cell: str, value: float) -> bool:
    """``cell`` shows ``value`` to the 3 significant digits the table prints."""
    return math.isclose(_parse(cell), value, rel_tol=5e-3)


@pytest.fixture(scope="module")
def measured() -> tuple[Any, ...]:
    """naive, math, flash and two user functions, GQA and causal, in float32."""
    spec = _measure.Spec(B, H, KV, S, D, torch.float32, torch.device("cpu"), causal=True,
                         runs=RUNS, warmup=WARMUP, profile_runs=PROFILE_RUNS, seed=3)
    names = [("naive", True), ("math", True), ("flash", True), ("figs:good", True),
             (DROPPED, True)]
    users = {n: Impl(n, _sdpa_repeating, user=True) for n in ("figs:good", DROPPED)}
    with _spying() as seen:
        rows = run_compare(spec, names, users, progress=False)
    return spec, rows, seen


def test_every_figure_is_its_spans(measured: tuple[Any, ...]) -> None:
    """Per implementation: calls, p50/p95/p99, FLOPs, TFLOP/s, backend, ops per call, memory
    peak, the error against float64 attention, in the Row, the table and the JSON."""
    spec, rows, seen = measured
    text, doc = _render(spec, rows)
    table, entries = _table_rows(text), {e["name"]: e for e in doc["implementations"]}
    titles = next(line for line in text.splitlines() if line.startswith("implementation"))
    assert [t.strip() for t in titles.split("┃")][7] == "ops/call"  # CPU: ATen ops, not kernels
    q, k, v = seen.inputs
    ref = _reference(q, k, v, causal=True)
    flops = brute_force_flops(B, H, S, S, D, D, causal=True)
    assert [r.name for r in rows] == ["naive", "math", "flash", "figs:good", DROPPED]
    assert len(seen.outputs) == len(rows)
    for row, output in zip(rows, seen.outputs, strict=True):
        mine = [s for s in seen.spans if s.name == "compare." + row.name]
        attrs = [dict(s.attributes) for s in mine]
        timed = [a for a in attrs if a.get("compare.phase") == "timed"]
        profiled = [a for a in attrs if a.get("compare.phase") == "profiled"]
        assert {a[TIER] for a in timed} == {"timing"} and {a[TIER] for a in profiled} == {"profile"}
        assert len(profiled) == PROFILE_RUNS
        assert len(timed) == RUNS - (row.name == DROPPED)
        # 25 calls in 10 rounds: 3 in each of the first 5, 2 in the rest (one less: dropped)
        per_round: dict[int, list[float]] = {}
        for a in timed:
            per_round.setdefault(a["compare.round"], []).append(a[WALL] / 1e3)
        assert sorted(per_round) == list(range(10))
        sizes = [len(per_round[r]) for r in range(10)]
        assert sum(sizes) == len(timed) and sizes[5:] == [2] * 5, sizes
        walls = [a[WALL] / 1e3 for a in timed]
        want = {f"p{p}": _percentile(walls, p) for p in (50, 95, 99)}
        tflops = flops / (want["p50"] * 1e-6) / 1e12
        within = 6e-4 / want["p50"]  # its p50 is rounded to 3 decimals (ns) first
        counts = sorted(a[COUNT] for a in profiled)
        kernels = counts[(len(counts) - 1) // 2]  # the lower median of an even count
        peak = max(a[PEAK] for a in profiled)
        backends = {a[BACKEND] for a in profiled}
        abs_err, rel_err = _error(output, ref)
        assert DEVICE not in {key for a in timed for key in a}  # CPU: wall time is the basis

        f = row.figures
        assert f is not None and f.calls == len(timed) and f.profiled == PROFILE_RUNS
        assert f.wall_us == pytest.approx(want, abs=6e-4)  # rounded to 3 decimals (ns)
        assert f.time_us == f.wall_us and f.device_us is None
        assert f.rounds == pytest.approx({r: float(np.median(v)) for r, v in per_round.items()})
        assert {a[FLOPS] for a in timed} == {flops} and f.flops == flops
        assert f.tflops == pytest.approx(tflops, rel=within)
        assert f.kernels_per_call == kernels and f.peak_memory_bytes == peak
        assert len(backends) == 1 and f.backend == backends.pop()
        assert f.top_names in [list(a[TOP]) for a in profiled] and 0 < len(f.top_names) <= 5
        assert row.max_abs_error == pytest.approx(abs_err, rel=1e-9, abs=1e-15)
        assert row.max_rel_error == pytest.approx(rel_err, rel=1e-9, abs=1e-15)
        assert row.status == "ok" and abs_err <= DOC_TOLERANCE[torch.float32]

        e = entries[row.name]
        assert e["calls"] == len(timed) and e["profiled_calls"] == PROFILE_RUNS
        for key in ("time_us", "wall_us"):
            assert e[key] == pytest.approx(want, abs=6e-4)
        assert e["device_us"] is None and e["flops"] == flops
        assert e["tflops"] == pytest.approx(tflops, rel=within)
        assert (e["kernels_per_call"], e["kernel_unit"]) == (kernels, "cpu_op")
        assert (e["peak_memory_bytes"], e["backend"]) == (peak, f.backend)
        assert e["max_abs_error"] == pytest.approx(abs_err, rel=1e-9, abs=1e-15)
        assert e["max_rel_error"] == pytest.approx(rel_err, rel=1e-9, abs=1e-15)
        assert e["within_tolerance"] is True and e["status"] == "ok"

        cells = table[row.name]
        assert cells[1:3] == ["ok", f.backend]
        for cell, p in zip(cells[3:6], ("p50", "p95", "p99"), strict=True):
            assert _printed_as(cell, want[p]), (row.name, p, cell, want[p])
        assert _printed_as(cells[6], tflops) and cells[7] == str(kernels)
        assert _printed_as(cells[8], peak), (cells[8], peak)
        assert math.isclose(float(cells[9]), abs_err, rel_tol=0.06)  # printed as 1 decimal
        assert math.isclose(float(cells[10]), rel_err, rel_tol=0.06)

    assert all(r.notes == [] for r in rows if r.user and r.name != DROPPED)
    dropped = next(r for r in rows if r.name == DROPPED)
    note = f"attnscope recorded {RUNS - 1} of the {RUNS} timed calls (its log on stderr says why)"
    assert dropped.notes == [note] and entries[DROPPED]["notes"] == [note]
    assert f"  {DROPPED}: {note}" in text.splitlines()


def test_the_run_header_and_footer(measured: tuple[Any, ...]) -> None:
    spec, rows, _ = measured
    text, doc = _render(spec, rows)
    first = text.splitlines()[0]
    assert (f"B={B} H={H}, {KV} KV heads S={S} D={D} float32 causal on cpu · {RUNS} timed calls "
            f"each in 10 interleaved rounds (wall time) · torch {torch.__version__}") in first
    footer = (f"FLOPs per call (attnscope.flops): {brute_force_flops(B, H, S, S, D, D, True)} · "
              "error against float64 attention of the same inputs, allowed max abs 0.0001 for "
              "float32")
    assert footer in text.splitlines()
    assert {k: doc[k] for k in ("runs", "warmup", "profile_runs", "seed", "dtype", "causal",
                                "device", "device_name", "time_basis", "tolerance_max_abs")} == {
        "runs": RUNS, "warmup": WARMUP, "profile_runs": PROFILE_RUNS, "seed": 3,
        "dtype": "float32", "causal": True, "device": "cpu", "device_name": "cpu",
        "time_basis": "wall", "tolerance_max_abs": 1e-4}
    assert {k: doc[k] for k in ("rounds", "budget_s", "runs_asked", "warmup_asked",
                                "cut_by_budget")} == {
        "rounds": 10, "budget_s": None, "runs_asked": RUNS, "warmup_asked": WARMUP,
        "cut_by_budget": None}
    assert doc["shape"] == {"batch": B, "heads": H, "kv_heads": KV, "seq_len": S, "kv_len": S,
                            "head_dim": D}


def _placed(side: str, dtype: torch.dtype) -> Callable[..., torch.Tensor]:
    """A user function returning the float64 reference in ``dtype`` with one element moved so
    that the max abs error is the nearest step just inside (≤) or just outside (>) the
    tolerance; ``nan``/``inf``: one element not finite."""
    tol = DOC_TOLERANCE[dtype]

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           is_causal: bool = False) -> torch.Tensor:
        ref = _reference(q, k, v, is_causal)
        out = torch.from_numpy(ref).to(dtype)
        flat = int(np.abs(ref).argmin())  # near 0 the dtype's steps are finest
        at = np.unravel_index(flat, ref.shape)
        if side in ("nan", "inf"):
            out[at] = float(side)
            return out
        target = float(ref[at])
        steps = target + tol * (1 + np.linspace(-0.05, 0.05, 20001))
        moved = torch.from_numpy(steps).to(dtype).to(torch.float64).numpy()
        err = np.abs(moved - target)
        # a margin of 1e-9 · tol: far above the float64 reference's own rounding (~1e-16)
        pick = (err[err <= tol * (1 - 1e-9)].max() if side == "inside"
                else err[err >= tol * (1 + 1e-9)].min())
        out[at] = float(moved[np.flatnonzero(err == pick)[0]])
        return out

    return fn


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_each_dtype_tolerance_from_both_sides(dtype: torch.dtype, spy: Recorded) -> None:
    tol, name = DOC_TOLERANCE[dtype], str(dtype).removeprefix("torch.")
    assert _measure.TOLERANCE[dtype] == tol  # the figure docs/cli.md states
    spec = _measure.Spec(1, 4, 2, 16, 8, dtype, torch.device("cpu"), causal=True, runs=1,
                         warmup=0, profile_runs=0)
    sides = ("inside", "outside", "nan", "inf")
    users = {f"t:{s}": Impl(f"t:{s}", _placed(s, dtype), user=True) for s in sides}
    rows = run_compare(spec, [(n, True) for n in users], users, progress=False)
    q, k, v = spy.inputs
    assert {t.dtype for t in (q, k, v)} == {dtype}
    ref = _reference(q, k, v, causal=True)
    inside, outside = (_error(o, ref)[0] for o in spy.outputs[:2])
    # the two sides are one step of the dtype apart around the tolerance
    assert inside <= tol < outside and outside - inside < 0.02 * tol, (inside, outside)
    text, doc = _render(spec, rows)
    entries = {e["name"]: e for e in doc["implementations"]}
    by = {r.name: r for r in rows}

    ok = by["t:inside"]
    assert ok.status == "ok" and ok.reason is None
    assert ok.max_abs_error == pytest.approx(inside, rel=1e-9)
    assert entries["t:inside"]["within_tolerance"] is True
    assert exit_code([ok]) == 0

    bad = by["t:outside"]
    assert bad.status == "inaccurate" and bad.max_abs_error == pytest.approx(outside, rel=1e-9)
    assert bad.reason == f"max abs error {outside:.3g} beyond the {tol:g} allowed for {name}"
    assert entries["t:outside"]["within_tolerance"] is False
    assert f"  t:outside: INACCURATE: {bad.reason}" in text.splitlines()
    assert exit_code([ok, bad]) == 1

    for side in ("nan", "inf"):
        r, e = by[f"t:{side}"], entries[f"t:{side}"]
        assert r.status == "inaccurate" and r.reason == "the output has NaN or infinite values"
        assert e["within_tolerance"] is False and e["max_abs_error"] is None
        assert e["max_rel_error"] is None
    assert doc["tolerance_max_abs"] == tol and doc["dtype"] == name
    assert f"allowed max abs {tol:g} for {name}" in text
    assert f" {name} causal on cpu " in text.splitlines()[0]


class _Span:
    def __init__(self, name: str, attributes: dict[str, Any]) -> None:
        self.name, self.attributes = name, attributes


def test_percentiles_and_tflops_over_device_time() -> None:
    """p50/p95/p99 of wall and device time over the timed calls only (a profiled call is slowed,
    a warm-up or another site's span is not this one's), TFLOP/s over the device p50."""
    rng = np.random.default_rng(7)
    walls = [int(w) for w in rng.integers(10_000, 900_000, size=41)] + [50_000] * 6  # ties
    devices = [int(w * rng.uniform(0.2, 0.9)) for w in walls]
    timed = {"compare.phase": "timed", TIER: "timing", FLOPS: 3 * 10**9}
    spans = [_Span("compare.x", {**timed, WALL: w, DEVICE: d}) for w, d in zip(walls, devices,
                                                                               strict=True)]
    spans += [_Span("compare.x", {"compare.phase": "profiled", TIER: "profile", WALL: 10**12,
                                  DEVICE: 10**12, BACKEND: "flash", COUNT: c, PEAK: p})
              for c, p in ((7, 100), (3, 900), (5, 400), (9, 50))]
    spans += [_Span("compare.x", {TIER: "timing", WALL: 10**12}),  # no phase: not a timed call
              _Span("compare.y", {**timed, WALL: 1, DEVICE: 1}),
              _Span("compare.x2", {**timed, WALL: 1, DEVICE: 1})]  # a name it begins: another
    f = figures(spans, "compare.x")
    for got, values in ((f.wall_us, walls), (f.device_us, devices)):
        assert got == pytest.approx({f"p{p}": _percentile([x / 1e3 for x in values], p)
                                     for p in (50, 95, 99)}, abs=6e-4)
    assert f.time_us == f.device_us and f.calls == len(walls) and f.profiled == 4
    device_p50 = _percentile([d / 1e3 for d in devices], 50)
    assert f.tflops == pytest.approx(3 * 10**9 / (device_p50 * 1e-6) / 1e12, rel=6e-4 / device_p50)
    assert f.kernels_per_call == 5 and f.peak_memory_bytes == 900  # lower median of 3 5 7 9; max
    # the table prints them as they are
    spec = _measure.Spec(1, 1, 1, 8, 8, torch.float32, torch.device("cpu"), runs=len(walls))
    cells = _table_rows(_render(spec, [Row("x", "ok", figures=f)])[0])["x"]
    for cell, p in zip(cells[3:6], (50, 95, 99), strict=True):
        assert _printed_as(cell, _percentile([d / 1e3 for d in devices], p))


def test_the_ranking_is_its_rounds(measured: tuple[Any, ...]) -> None:
    """Which is faster, recomputed from the timed spans: each round's median wall time, the
    median over rounds of the ratio to the implementation with the lowest median, and the
    sign-test interval from scipy's binomial (issue 38 §2)."""
    from scipy import stats  # type: ignore[import-untyped]

    spec, rows, seen = measured
    text, doc = _render(spec, rows)
    medians: dict[str, dict[int, float]] = {}
    for row in rows:
        per_round: dict[int, list[float]] = {}
        for s in seen.spans:
            a = dict(s.attributes)
            if s.name == "compare." + row.name and a.get("compare.phase") == "timed":
                per_round.setdefault(a["compare.round"], []).append(a[WALL] / 1e3)
        medians[row.name] = {r: float(np.median(v)) for r, v in per_round.items()}
    ref = min(medians, key=lambda n: float(np.median(list(medians[n].values()))))
    entries = {e["name"]: e for e in doc["ranking"]["entries"]}
    assert doc["ranking"]["reference"] == ref and entries[ref]["verdict"] == "fastest"
    n = 10
    k = max(k for k in range(1, 6) if 1 - 2 * stats.binom.cdf(k - 1, n, 0.5) >= 0.95)
    lines = text.splitlines()
    for name, by_round in medians.items():
        if name == ref:
            continue
        ratios = sorted(by_round[r] / medians[ref][r] for r in range(n))
        low, high = ratios[k - 1], ratios[n - k]
        e = entries[name]
        assert e["ratio"] == pytest.approx(float(np.median(ratios)))
        assert (e["low"], e["high"]) == pytest.approx((low, high)) and e["rounds"] == n
        verdict = "slower" if low > 1 else "faster" if high < 1 else "not distinguishable"
        assert e["verdict"] == verdict
        line = next(x for x in lines if x.startswith(f"  {name} "))
        assert f"interval {low:.3g}×–{high:.3g}×" in line, line
        assert (verdict in line) if verdict != "not distinguishable" else (
            f"not distinguishable from {ref} here" in line)
    # the order of the list, each against the one before it (not the reference)
    order = [e["name"] for e in doc["ranking"]["entries"]]
    for before, name in zip(order[1:], order[2:], strict=False):
        ratios = sorted(medians[name][r] / medians[before][r] for r in range(n))
        previous = entries[name]["previous"]
        assert previous["against"] == before
        assert previous["ratio"] == pytest.approx(float(np.median(ratios)))
        assert (previous["low"], previous["high"]) == pytest.approx(
            (ratios[k - 1], ratios[n - k]))
    assert entries[order[1]]["previous"] is None
