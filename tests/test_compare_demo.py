"""``attnscope demo`` compares its two implementations with their noise (issue 38 §2).

On a busy machine the demo ranked naive and SDPA both ways in two runs: each ran its forwards in
one block, so a change of load fell on one of them. The implementations now take turns step by
step, and the comparison pairs them by step: a ratio with its interval, or "not distinguishable
here". Recomputed below from the trace file (Jaeger JSON) with scipy's binomial, not with the
demo's own code.
"""

from __future__ import annotations

import io
import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats  # type: ignore[import-untyped]

from tests.support.cli_traces import jaeger_spans

STEPS = 6


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    from attnscope.cli.demo._run import run_demo

    trace = tmp_path_factory.mktemp("demo") / "demo.json"
    out = io.StringIO()
    assert run_demo(steps=STEPS, seq_len=32, jaeger_json=str(trace), out=out) == 0
    return out.getvalue(), jaeger_spans(Path(trace))


def _parent(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    ids = [r["spanID"] for r in span["references"] if r["refType"] == "CHILD_OF"]
    return by_id.get(ids[0]) if ids else None


def test_the_implementations_take_turns(demo: tuple[str, list[dict[str, Any]]]) -> None:
    _, spans = demo
    forwards = sorted((s for s in spans if "demo.step" in s["tags"]), key=lambda s: s["startTime"])
    order = [(s["tags"]["demo.step"], s["tags"]["demo.implementation"]) for s in forwards]
    want = []
    for step in range(STEPS):
        pair = ["naive_attention", "sdpa_attention"]
        want += [(step, name) for name in (pair if step % 2 == 0 else pair[::-1])]
    assert order == want


def test_the_comparison_is_its_steps(demo: tuple[str, list[dict[str, Any]]]) -> None:
    """Per step, each implementation's attention time is the sum of its forward's 4 layer calls;
    the ratio to the lower one is the median over steps, the interval the sign test's."""
    text, spans = demo
    by_id = {s["spanID"]: s for s in spans}
    times: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    for s in spans:
        if "attnscope.module" not in s["tags"]:
            continue
        forward = _parent(s, by_id)
        while forward is not None and "demo.step" not in forward["tags"]:
            forward = _parent(forward, by_id)
        if forward is not None:  # not the profiled forward
            name = forward["tags"]["demo.implementation"].removesuffix("_attention")
            times[name][forward["tags"]["demo.step"]] += s["duration"] / 1e3  # µs → ms
    assert {n: sorted(t) for n, t in times.items()} == {
        "naive": list(range(STEPS)), "sdpa": list(range(STEPS))}
    ref = min(times, key=lambda n: float(np.median(list(times[n].values()))))
    other = next(n for n in times if n != ref)
    ratios = sorted(times[other][i] / times[ref][i] for i in range(STEPS))
    low, high = ratios[0], ratios[-1]  # six steps: min to max
    coverage = 1 - 2 * stats.binom.cdf(0, STEPS, 0.5)
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("which is faster"))
    assert lines[head] == (f"which is faster (each one's attention time per forward ÷ {ref}'s "
                           f"in the same step, median over the steps, {coverage:.1%} interval):")
    assert lines[head + 1].split() == [ref, "the", "lowest", "median", "time"]
    said = lines[head + 2]
    assert said.split()[0] == other and f"interval {low:.3g}×–{high:.3g}×" in said, said
    ratio = f"{float(np.median(ratios)):.3g}×"
    if low > 1:
        assert f"{ratio} {ref}'s time, slower" in said
    else:  # the ratio straddles 1 (or is below it, which the lower median makes unlikely)
        assert f"not distinguishable from {ref} here ({ratio}," in said or "faster" in said


def _implementation(span: dict[str, Any], by_id: dict[str, dict[str, Any]]) -> str | None:
    up: dict[str, Any] | None = span
    while up is not None and "demo.implementation" not in up["tags"]:
        up = _parent(up, by_id)
    return None if up is None else str(up["tags"]["demo.implementation"]).removesuffix(
        "_attention")


def test_each_report_is_of_its_own_implementations_calls(
        demo: tuple[str, list[dict[str, Any]]]) -> None:
    """Each implementation's report reads its own calls only: its "all layers" backend, its
    profiled calls and its kernel table (before: the other's profiled calls were "loose" ones
    of both reports, which each said "flash,math" and listed SDPA's flash kernel for naive)."""
    text, spans = demo
    by_id = {s["spanID"]: s for s in spans}
    backends: dict[str, set[str]] = defaultdict(set)
    profiled: dict[str, int] = defaultdict(int)
    ops: dict[str, set[str]] = defaultdict(set)
    for s in spans:
        impl = _implementation(s, by_id)
        if impl is None:
            continue
        top = s["tags"].get("attnscope.kernel.top_names")  # a profiled call's 5 longest ops
        if top is not None:
            ops[impl].update(json.loads(top) if isinstance(top, str) else top)
        if "attnscope.module" in s["tags"] and s["tags"].get("attnscope.tier") == "profile":
            profiled[impl] += 1
            backends[impl].add(str(s["tags"]["attnscope.backend"]))
    assert set(backends) == {"naive", "sdpa"} and backends["naive"] != backends["sdpa"]
    blocks = text.split("attnscope report — attention.")[1:]
    assert [b.split()[0] for b in blocks] == ["naive", "sdpa"]
    for block in blocks:
        impl = block.split()[0]
        lines = block.splitlines()
        calls_row = next(line for line in lines if line.split()[:2] == ["all", "layers"])
        assert calls_row.split()[-1] == ",".join(sorted(backends[impl])), calls_row
        head = next(i for i, line in enumerate(lines) if line.startswith("Top kernels/ops"))
        assert lines[head].split()[:5] == ["Top", "kernels/ops", "of", "the", str(profiled[impl])]
        rule = next(i for i in range(head, len(lines)) if lines[i].strip().startswith("─"))
        listed = []
        for line in lines[rule + 1:]:
            if not line.strip():
                break
            listed.append(line.split()[0])
        assert listed and set(listed) <= ops[impl], (impl, listed, ops[impl])
