"""``attnscope compare --from TRACE``: the implementations compared on the shapes a real trace's
attention calls had, the most time first (decode steps grouped by their keys' power of two)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli_traces import TraceFiles, generate, jaeger_spans
from tests.support.helpers import brute_force_flops

BATCH, PROMPT, NEW, REPEATS = 2, 24, 6, 3
HEADS, KV_HEADS, HEAD_DIM = 8, 2, 8  # cli_traces' Llama: hidden 64, 8 heads, 2 KV heads


@pytest.fixture(scope="module")
def trace(tmp_path_factory: pytest.TempPathFactory) -> TraceFiles:
    return generate(tmp_path_factory.mktemp("from_trace"), batch=BATCH, prompt_len=PROMPT,
                    new_tokens=NEW, repeats=REPEATS, profile_rate=0.1)


def _compare(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attnscope", "compare", *args],
                          capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, PYTHONPATH=os.getcwd()))


def _expected(trace: TraceFiles) -> dict[tuple[int, int], dict[str, Any]]:
    """Per (queries, keys' group) from the raw file: calls, the keys seen, the estimated time
    (wall time × 1/rate of the unprofiled calls, scaled to every call of the group)."""
    groups: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for s in jaeger_spans(trace.jaeger):
        t = s["tags"]
        if "attnscope.num_heads" not in t or "attnscope.seq_len_q" not in t:
            continue
        sq, skv = t["attnscope.seq_len_q"], t["attnscope.seq_len_kv"]
        groups[(sq, skv.bit_length() if sq == 1 else skv)].append(t)
    out = {}
    for key, tags in groups.items():
        plain = [t for t in tags if t.get("attnscope.tier") != "profile"
                 and "attnscope.profiled_by" not in t] or tags
        per_call = sum(t["attnscope.wall_ns"] for t in plain) / len(plain)  # rate 1: weight 1
        keys = sorted(t["attnscope.seq_len_kv"] for t in tags)
        out[key] = {"calls": len(tags), "time": per_call * len(tags),
                    "keys": keys[(len(keys) - 1) // 2], "range": [keys[0], keys[-1]]}
    return out


def test_the_top_shapes_of_a_trace_are_compared_most_time_first(trace: TraceFiles) -> None:
    done = _compare("--from", str(trace.directory), "--top", "2", "--runs", "4", "--warmup",
                    "1", "--profile-runs", "0", "--impl", "naive,flash", "--json",
                    "--no-progress")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    expected = _expected(trace)
    assert doc["shapes_in_trace"] == len(expected) == 2 and doc["calls_without_a_shape"] == 0
    # the prompt's calls, then one new token a step over a cache of PROMPT + 1 ... keys
    prefill = expected[(PROMPT, PROMPT)]
    decode = expected[(1, (PROMPT + NEW - 1).bit_length())]
    assert prefill["calls"] == REPEATS * 2 and decode["calls"] == REPEATS * 2 * (NEW - 1)
    assert decode["range"] == [PROMPT + 1, PROMPT + NEW - 1]
    comparisons = doc["comparisons"]
    times = [c["trace_shape"]["time_ns"] for c in comparisons]
    assert times == sorted(times, reverse=True)
    by_queries = {c["shape"]["seq_len"]: c for c in comparisons}
    total = prefill["time"] + decode["time"]
    for sq, want, causal in ((PROMPT, prefill, True), (1, decode, False)):
        c = by_queries[sq]
        assert c["shape"] == {"batch": BATCH, "heads": HEADS, "kv_heads": KV_HEADS,
                              "seq_len": sq, "kv_len": want["keys"], "head_dim": HEAD_DIM}
        assert c["causal"] is causal and c["dtype"] == "float32"
        shape = c["trace_shape"]
        assert shape["calls"] == want["calls"] and shape["kv_range"] == want["range"]
        assert shape["time_ns"] == pytest.approx(want["time"])
        assert shape["share"] == pytest.approx(want["time"] / total)
        assert shape["masked"] is False  # no padding: dense inputs are the calls' own
        flops = brute_force_flops(BATCH, HEADS, sq, want["keys"], HEAD_DIM, HEAD_DIM, causal)
        for row in c["implementations"]:
            assert row["status"] == "ok" and row["flops"] == flops, row


def test_the_table_says_which_shape_each_comparison_is(trace: TraceFiles) -> None:
    done = _compare("--from", str(trace.jaeger), "--top", "1", "--runs", "3", "--warmup", "0",
                    "--profile-runs", "0", "--impl", "flash", "--no-progress")
    assert done.returncode == 0, done.stderr
    first = done.stdout.splitlines()[0]
    assert first.startswith(f"shape 1 of 1 from {trace.jaeger}: B={BATCH} H={HEADS}, "
                            f"{KV_HEADS} KV heads S=")
    assert "of its attention time" in first
    assert "attnscope compare — " in done.stdout


def test_a_trace_without_attention_is_one_line(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    done = _compare("--from", str(empty), "--no-progress")
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr


def test_a_repeat_directory_gives_every_runs_calls(trace: TraceFiles, tmp_path: Path) -> None:
    import shutil

    for k in (1, 2):  # the layout `attnscope run --repeat 2` writes
        shutil.copytree(trace.directory, tmp_path / "rep" / f"run-{k}")
    done = _compare("--from", str(tmp_path / "rep"), "--top", "1", "--runs", "3", "--warmup",
                    "0", "--profile-runs", "0", "--impl", "flash", "--json", "--no-progress")
    assert done.returncode == 0, done.stderr
    (c,) = json.loads(done.stdout)["comparisons"]
    calls = {(1, (PROMPT + NEW - 1).bit_length()): REPEATS * 2 * (NEW - 1),
             (PROMPT, PROMPT): REPEATS * 2}
    sq = c["shape"]["seq_len"]
    key = (1, (PROMPT + NEW - 1).bit_length()) if sq == 1 else (PROMPT, PROMPT)
    assert c["trace_shape"]["calls"] == 2 * calls[key]
