"""`attnscope report`'s context: what the trace was a run of, and the end-to-end figures
(generate() time, TTFT, TPOT, output tokens/s, attention's share of the model's time)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import attnscope
from attnscope._export.destinations import command_args
from attnscope.cli.e2e import end_to_end
from attnscope.cli.report import share_cell
from attnscope.cli.runinfo import describe, run_info
from attnscope.cli.summary import first_calls
from attnscope.cli.traces import SpanRow, load_spans
from tests.support.cli_traces import TraceFiles, generate, jaeger_spans

ROOT = Path(__file__).resolve().parent.parent
MS = 1_000_000


def _span(span_id: str, parent: str | None, start_ms: float, wall_ms: float, *, fn: str,
          **attrs: Any) -> SpanRow:
    a = {"attnscope.tier": "timing", "attnscope.sample_rate": 1.0, "code.function.name": fn,
         "attnscope.wall_ns": int(wall_ms * MS), **attrs}
    start = int(start_ms * MS)
    return SpanRow("t" * 32, span_id, parent, fn.split(".")[0], start, start + int(wall_ms * MS),
                   a, "svc")


def _attn(span_id: str, parent: str | None, start_ms: float, wall_ms: float, phase: str,
          **attrs: Any) -> SpanRow:
    return _span(span_id, parent, start_ms, wall_ms, fn="LlamaAttention.forward",
                 **{"attnscope.num_heads": 4, "attnscope.flops": 100, "attnscope.phase": phase,
                    "attnscope.module": "model.layers.0.self_attn", **attrs})


def _forward(span_id: str, parent: str, start_ms: float, wall_ms: float, phase: str,
             **attrs: Any) -> SpanRow:
    return _span(span_id, parent, start_ms, wall_ms, fn="LlamaForCausalLM.forward",
                 **{"attnscope.phase": phase, **attrs})


def _generate_rows(decode_rate: float = 1.0) -> list[SpanRow]:
    """One generate(): prefill forward at 1-21 ms, three decode forwards of 10 ms, 100 ms in all;
    two attention calls (one layer deep) in each forward."""
    rows = [_span("g", None, 0, 100, fn="GenerationMixin.generate",
                  **{"gen_ai.usage.output_tokens": 8, "attnscope.batch_size": 2})]
    rows.append(_forward("f0", "g", 1, 20, "prefill"))
    rows += [_attn("a0", "f0", 2, 4, "prefill"), _attn("a1", "f0", 8, 6, "prefill")]
    for i in range(3):
        fid = f"f{i + 1}"
        rows.append(_forward(fid, "g", 30 + 20 * i, 10, "decode",
                             **{"attnscope.sample_rate": decode_rate}))
        rows.append(_attn(f"d{i}", fid, 31 + 20 * i, 2 + i, "decode"))
    return rows


def test_ttft_tpot_tokens_per_s_and_share_from_the_spans() -> None:
    e = end_to_end(_generate_rows())
    (g,) = e.generates
    assert g.calls == g.used == 1 and g.output_tokens == 8
    assert g.ttft is not None and g.ttft.p50 == 21 * MS  # prefill ends at 1 + 20 ms
    assert g.tpot is not None and g.tpot.p50 == pytest.approx((100 - 21) * MS / 3)
    assert g.tokens_per_s == pytest.approx(8 / 0.1)
    prefill, decode = e.shares
    assert (prefill.phase, prefill.forwards) == ("prefill", 1)
    assert prefill.model_ns == 20 * MS and prefill.attention_ns == 10 * MS
    assert prefill.share == pytest.approx(0.5) and prefill.calls == 2
    assert decode.model_ns == 30 * MS and decode.attention_ns == (2 + 3 + 4) * MS
    assert decode.share == pytest.approx(9 / 30)


def test_tpot_unknown_unless_every_forward_was_traced_and_ttft_needs_the_prefill() -> None:
    (g,) = end_to_end(_generate_rows(decode_rate=0.5)).generates
    assert g.ttft is not None and g.tpot is None and g.tpot_calls == 0
    no_prefill = [r for r in _generate_rows() if r.span_id not in ("f0", "a0", "a1")]
    (g,) = end_to_end(no_prefill).generates
    assert g.ttft is None and g.tpot is None and g.ttft_calls == 0
    assert g.wall.p50 == 100 * MS  # the call's own time is still known


def test_tpot_unknown_where_a_step_decoded_several_tokens_and_the_report_says_why() -> None:
    # assisted or speculative decoding: after the prefill, steps of 3 and 2 query tokens on the
    # filled cache, then a decode, every forward traced; a step is not a token, so no TPOT
    rows = [r for r in _generate_rows() if r.span_id not in ("f1", "f2", "d0", "d1")]
    rows += [_forward("f1", "g", 30, 10, "prefill", **{"attnscope.kv_cache_len": 6,
                                                       "attnscope.seq_len_q": 3}),
             _forward("f2", "g", 50, 10, "prefill", **{"attnscope.kv_cache_len": 9,
                                                       "attnscope.seq_len_q": 2})]
    (g,) = end_to_end(rows).generates
    assert g.ttft is not None and g.tpot is None and g.tpot_calls == 0
    assert g.unknown == (("several_tokens_a_step", 1),)
    line = g.partial_line()
    assert line is not None and "1 decoding several tokens in a step" in line
    assert "not all traced" not in line
    # the forwards sampled instead: the usual reason
    (g,) = end_to_end(_generate_rows(decode_rate=0.5)).generates
    assert g.unknown == (("not_all_traced", 1),)
    assert "(1 with forwards not all traced)" in str(g.partial_line())
    # a call that begins with a one-token step on a cache carried over (a draft model's later
    # rounds, a chat turn reusing the cache): no prefill of its own, so neither figure
    carried = [r for r in _generate_rows() if r.span_id not in ("f0", "a0", "a1")]
    (g,) = end_to_end(carried).generates
    assert (g.ttft, g.tpot, g.unknown) == (None, None, (("began_on_a_filled_cache", 1),))
    # a prefill alone: a TTFT, no TPOT
    alone = [r for r in _generate_rows() if r.span_id in ("g", "f0", "a0", "a1")]
    (g,) = end_to_end(alone).generates
    assert g.ttft is not None and g.tpot is None and g.unknown == (("one_step", 1),)
    (g,) = end_to_end(_generate_rows()).generates
    assert g.unknown == () and g.partial_line() is None


def test_an_encoder_decoder_calls_encoder_layers_before_its_first_forward_are_no_step() -> None:
    # T5, BART, Whisper: generate() runs the encoder itself (no model forward of its own) and
    # then the decoder's forwards; the encoder's layers are children of the call
    rows = _generate_rows()
    rows.append(_span("e0", "g", 0.2, 0.6, fn="T5Block.forward",
                      **{"attnscope.layer_index": 0, "attnscope.module": "encoder.block.0"}))
    (g,) = end_to_end(rows).generates
    assert g.ttft is not None and g.ttft.p50 == 21 * MS
    assert g.tpot is not None and g.tpot.p50 == pytest.approx((100 - 21) * MS / 3)
    assert g.unknown == ()


def test_generate_without_a_cache_has_its_ttft_and_tpot() -> None:
    # generate(..., use_cache=False): each step a forward over the whole sequence, one token
    # longer each time, with no cache and so no phase; each step still makes one token a row
    rows = [r for r in _generate_rows() if not r.span_id.startswith("f")]
    for i, (start, wall) in enumerate(((1, 20), (30, 10), (50, 10), (70, 10))):
        rows.append(_span(f"f{i}", "g", start, wall, fn="LlamaForCausalLM.forward",
                          **{"attnscope.seq_len_q": 5 + i}))
    (g,) = end_to_end(rows).generates
    assert g.ttft is not None and g.ttft.p50 == 21 * MS
    assert g.tpot is not None and g.tpot.p50 == pytest.approx((100 - 21) * MS / 3)
    assert g.unknown == ()
    # forwards with no phase whose lengths do not grow a token a step: not such a loop
    still = [r for r in rows if r.span_id != "f2"]
    still.append(_span("f2", "g", 50, 10, fn="LlamaForCausalLM.forward",
                       **{"attnscope.seq_len_q": 1}))
    (g,) = end_to_end(still).generates
    assert (g.ttft, g.tpot, g.unknown) == (None, None, (("no_phase", 1),))
    assert "says no phase" in str(g.partial_line())


def test_sampled_forwards_and_calls_are_weighted_by_their_rates() -> None:
    # forward at rate 0.5 holding a call at rate 0.25: the call stands for 1/(0.5*0.25) calls
    rows = [_forward("f", None, 0, 10, "prefill", **{"attnscope.sample_rate": 0.5}),
            _attn("a", "f", 1, 2, "prefill", **{"attnscope.sample_rate": 0.25}),
            _forward("h", None, 20, 10, "prefill", **{"attnscope.sample_rate": 0.5})]
    (s,) = end_to_end(rows).shares
    assert s.model_ns == pytest.approx(2 * 20 * MS)
    assert s.attention_ns == pytest.approx(2 * MS / 0.125)
    assert s.share == pytest.approx((2 / 0.125) / 40)


def test_a_call_outside_the_random_sample_stands_for_no_other_in_a_share() -> None:
    # the forward and call of test above, and a slow-call profile neither the forward's sampler
    # nor the call's had chosen (attnscope.extra, rate 1.0 on the span): a call in f, a forward
    extra = {"attnscope.sample_rate": 1.0, "attnscope.trigger": "slow_call",
             "attnscope.extra": True}
    rows = [_forward("f", None, 0, 10, "prefill", **{"attnscope.sample_rate": 0.5}),
            _attn("a", "f", 1, 2, "prefill", **{"attnscope.sample_rate": 0.25}),
            _attn("b", "f", 4, 3, "prefill", **extra),
            _forward("h", None, 20, 10, "prefill", **{"attnscope.sample_rate": 0.5}),
            _forward("e", None, 40, 10, "prefill", **extra), _attn("c", "e", 41, 5, "prefill")]
    (s,) = end_to_end(rows).shares
    assert s.model_ns == pytest.approx(2 * 20 * MS)  # as without them
    assert s.attention_ns == pytest.approx(2 * MS / 0.125)
    assert s.calls == 1


def test_no_share_without_an_attention_call_to_estimate_it_from() -> None:
    rows = [_forward("f", None, 0, 10, "prefill", **{"attnscope.sample_rate": 0.5}),
            _forward("g", None, 20, 10, "decode"), _attn("a", "g", 21, 3, "decode")]
    prefill, decode = end_to_end(rows).shares
    assert prefill.calls == 0 and prefill.share is None and prefill.model_ns == 20 * MS
    assert decode.calls == 1 and decode.share == pytest.approx(0.3)


def test_forwards_and_calls_holding_a_profiled_call_are_left_out_while_others_remain() -> None:
    rows = _generate_rows()
    rows = [r if r.span_id != "d0" else SpanRow(
        r.trace_id, r.span_id, r.parent_id, r.name, r.start_ns, r.end_ns,
        {**r.attributes, "attnscope.tier": "profile"}, r.service) for r in rows]
    decode = end_to_end(rows).shares[1]
    assert (decode.forwards, decode.used) == (3, 2)
    assert decode.model_ns == 20 * MS and decode.attention_ns == (3 + 4) * MS
    (g,) = end_to_end(rows).generates  # the only generate holds it: kept, all there is
    assert (g.calls, g.used) == (1, 1)


def _block(span_id: str, parent: str | None, start_ms: float, wall_ms: float, name: str,
           **attrs: Any) -> SpanRow:
    """An attnscope.span block: no function, the name the application gave."""
    a = {"attnscope.tier": "timing", "attnscope.sample_rate": 1.0,
         "attnscope.wall_ns": int(wall_ms * MS), **attrs}
    start = int(start_ms * MS)
    return SpanRow("t" * 32, span_id, parent, name, start, start + int(wall_ms * MS), a, "svc")


def test_blocks_are_the_applications_own_spans_with_their_attention_share() -> None:
    # a request block (tokens 16) around the generate() of _generate_rows (100 ms, attention
    # 10 + 9 ms); another at rate 0.5 holding one attention call at rate 0.25 directly
    rows = [_block("r", None, 0, 200, "request", **{"attnscope.tokens": 16})]
    rows += [r if r.span_id != "g" else SpanRow(r.trace_id, r.span_id, "r", r.name, r.start_ns,
                                                 r.end_ns, r.attributes, r.service)
             for r in _generate_rows()]
    rows += [_block("s", None, 300, 40, "request", **{"attnscope.sample_rate": 0.5}),
             _attn("x", "s", 301, 5, "decode", **{"attnscope.sample_rate": 0.25}),
             # not blocks: attnscope's own spans, an operator span, a replay
             _block("q", "s", 302, 1, "attnscope.request"),
             _block("k", "x", 302, 1, "aten::mm", **{"attnscope.kernel.kind": "op"}),
             _block("c", None, 400, 1, "cuda_graph.replay", **{"attnscope.graph.replay": 3})]
    (b,) = end_to_end(rows).blocks
    assert (b.name, b.calls, b.used) == ("request", 2, 2)
    assert (b.wall.min, b.wall.max) == (40 * MS, 200 * MS)
    assert b.tokens_per_s == pytest.approx(16 / 0.2)  # of the blocks that counted tokens
    assert b.attention_calls == 2 + 3 + 1  # the prefill and decode calls of generate(), x
    assert b.block_ns == pytest.approx(200 * MS + 40 * MS / 0.5)
    # the call in s stands for 1/(0.5*0.25) calls
    assert b.attention_ns == pytest.approx((10 + 9) * MS + 5 * MS / 0.125)
    assert b.share == pytest.approx(b.attention_ns / b.block_ns)
    assert end_to_end(_generate_rows()).blocks == []  # generate, forwards, calls: none


def test_attention_calls_outside_every_block_while_one_was_open_are_counted() -> None:
    # two requests (0-100 ms, 90-150 ms: overlapping) and one at 300-310 ms; attention calls in
    # no block: two during the first pair, one between them and the third, one during the third
    # but written by another process; and one inside a block, which is no such call
    other = SpanRow("t" * 32, "o", None, "x", 305 * MS, 306 * MS,
                    _attn("o", "", 305, 1, "decode").attributes, "svc",
                    {"service.instance.id": "another"})
    rows = [_block("r1", None, 0, 100, "request"), _block("r2", None, 90, 60, "request"),
            _block("r3", None, 300, 10, "request"),
            _attn("a", None, 10, 1, "prefill"), _attn("b", None, 140, 1, "decode"),
            _attn("c", None, 200, 1, "decode"), other,
            _attn("d", "r3", 301, 1, "decode")]
    got = end_to_end(rows)
    assert got.outside_blocks == 2  # a and b
    assert end_to_end([r for r in rows if r.name != "request"]).outside_blocks == 0  # no block


def test_a_share_of_sampled_calls_has_its_bootstrap_interval_and_an_exact_one_none() -> None:
    # 40 request blocks sampled at rate 0.5, each holding its one attention call (rate 1): the
    # blocks alternate 10 ms with 2 ms of attention and 10 ms with 6 ms (share 40% overall)
    rows: list[SpanRow] = []
    for i in range(40):
        rows.append(_block(f"b{i}", None, 100 * i, 10, "request",
                           **{"attnscope.sample_rate": 0.5}))
        rows.append(_attn(f"a{i}", f"b{i}", 100 * i + 1, 2 if i % 2 else 6, "decode"))
    (b,) = end_to_end(rows).blocks
    assert b.share == pytest.approx(0.4) and b.share_interval is not None
    lo, hi = b.share_interval
    assert lo < 0.4 < hi and hi - lo < 0.2  # 40 blocks: a few percent either way
    # resampling 40 of them, the share stays inside what 40 blocks of one kind could give
    assert 0.2 <= lo and hi <= 0.6
    same = [r for r in rows if r.span_id in {f"b{i}" for i in range(0, 40, 2)}
            or r.span_id in {f"a{i}" for i in range(0, 40, 2)}]
    (c,) = end_to_end(same).blocks  # every block alike: no spread to resample
    assert c.share_interval == pytest.approx((0.6, 0.6))
    # at rate 1 nothing was left out: the share is exact, no interval
    (d,) = end_to_end(_blocks_at_rate_1()).blocks
    assert d.share is not None and d.share_interval is None and not d.sampled
    assert all(s.share_interval is None for s in end_to_end(_generate_rows()).shares)
    # fewer than 10 blocks: an estimate, too few for an interval; the report says "≈"
    few = [r for r in rows if r.span_id in {f"b{i}" for i in range(9)}
           or r.span_id in {f"a{i}" for i in range(9)}]
    (e,) = end_to_end(few).blocks
    assert e.sampled and e.share_interval is None and e.share is not None
    assert share_cell(e.share, e.share_interval, e.sampled) == f"≈{e.share:.1%}"
    assert share_cell(0.4, (0.3, 0.5), True) == "40.0% (30–50%)"
    assert share_cell(0.4, None, False) == "40.0%" and share_cell(None, None, True) == "—"


def test_a_decoder_layer_whose_model_forward_was_not_sampled_is_no_model() -> None:
    # a model forward and, from another step whose model forward was not sampled, a decoder
    # layer on its own: the layer is part of a model's time, not a model of its own
    rows = [_forward("f", None, 0, 10, "decode"), _attn("a", "f", 1, 3, "decode"),
            _span("l", None, 20, 5, fn="LlamaDecoderLayer.forward",
                  **{"attnscope.module": "model.layers.0", "attnscope.layer_index": 0}),
            _attn("b", "l", 21, 4, "decode")]
    (s,) = end_to_end(rows).shares
    assert s.model == "LlamaForCausalLM" and s.forwards == 1 and s.share == pytest.approx(0.3)


def _blocks_at_rate_1() -> list[SpanRow]:
    return [_block("r", None, 0, 10, "request"), _attn("x", "r", 1, 4, "decode")]


def test_command_args_are_bounded() -> None:
    long = ["python", "x" * 2000] + [f"a{i}" for i in range(100)]
    args = command_args(long)
    assert len(args) == 64 and args[-1] == "…(39 more)"
    assert len(args[1]) == 512 and args[1].endswith("…") and args[2] == "a0"
    assert command_args(["python", "app.py"]) == ["python", "app.py"]


# ---- real traces -------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> TraceFiles:
    # every call traced, none profiled: every generate() has all its forwards
    return generate(tmp_path_factory.mktemp("context") / "run", sample_rate=1.0,
                    profile_rate=0.0, repeats=3, new_tokens=4)


def _cli(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    return subprocess.run([sys.executable, "-m", "attnscope", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def test_report_json_end_to_end_matches_the_raw_spans(traces: TraceFiles,
                                                      tmp_path: Path) -> None:
    done = _cli("report", traces.jaeger, "--json", tmp_path / "r.json")
    assert done.returncode == 0, done.stderr
    doc = json.loads((tmp_path / "r.json").read_text())
    spans = jaeger_spans(traces.jaeger)

    def tag(s: dict[str, Any], key: str) -> Any:
        return s["tags"].get(key)

    def parent(s: dict[str, Any]) -> str | None:
        return next((r["spanID"] for r in s.get("references") or ()), None)

    gens = [s for s in spans if str(tag(s, "code.function.name")).endswith(".generate")]
    assert len(gens) == 3
    ttft, tpot, walls, tokens = [], [], [], 0
    for g in gens:
        steps = sorted((s for s in spans if parent(s) == g["spanID"]
                        and str(tag(s, "code.function.name")).endswith(".forward")),
                       key=lambda s: s["startTime"])
        assert tag(steps[0], "attnscope.phase") == "prefill" and len(steps) == 4
        first_end = steps[0]["startTime"] * 1000 + tag(steps[0], "attnscope.wall_ns")
        g_start, g_wall = g["startTime"] * 1000, tag(g, "attnscope.wall_ns")
        ttft.append(first_end - g_start)
        tpot.append((g_start + g_wall - first_end) / 3)
        walls.append(g_wall)
        tokens += tag(g, "gen_ai.usage.output_tokens")
    (row,) = doc["end_to_end"]["generate"]
    assert row["calls"] == 3 and row["output_tokens"] == tokens == 3 * 2 * 4
    assert row["ttft_ns"]["p50"] == pytest.approx(float(np.percentile(ttft, 50)))
    assert row["tpot_ns"]["p50"] == pytest.approx(float(np.percentile(tpot, 50)))
    assert row["wall_ns"]["p95"] == pytest.approx(float(np.percentile(walls, 95)))
    assert row["output_tokens_per_s"] == pytest.approx(tokens / (sum(walls) / 1e9))
    shares = {s["phase"]: s for s in doc["end_to_end"]["attention_share"]}
    for phase in ("prefill", "decode"):
        forwards = [s for s in spans if tag(s, "attnscope.phase") == phase
                    and str(tag(s, "code.function.name")).endswith("ForCausalLM.forward")]
        ids = {f["spanID"] for f in forwards}
        attn = [s for s in spans if parent(s) in ids] + [
            s for s in spans if parent(s) in {x["spanID"] for x in spans if parent(x) in ids}]
        attn_ns = sum(tag(s, "attnscope.wall_ns") for s in attn
                      if tag(s, "attnscope.num_heads") is not None
                      and tag(s, "code.function.name") != "scaled_dot_product_attention")
        model_ns = sum(tag(f, "attnscope.wall_ns") for f in forwards)
        assert shares[phase]["forwards"] == len(forwards)
        assert shares[phase]["model_ns"] == pytest.approx(model_ns)
        assert shares[phase]["attention_ns"] == pytest.approx(attn_ns)
    # the workload's attnscope.span("request") blocks, one around each generate()
    requests = [s for s in spans if s["operationName"] == "request"]
    (block,) = doc["end_to_end"]["blocks"]
    assert block["name"] == "request" and block["calls"] == block["timed"] == len(requests) == 3
    walls = [tag(s, "attnscope.wall_ns") for s in requests]
    for q in ("p50", "p95", "p99"):
        assert block["wall_ns"][q] == pytest.approx(float(np.percentile(walls, int(q[1:]))))
    under: list[dict[str, Any]] = []
    frontier = {s["spanID"] for s in requests}
    while frontier:  # every span under the blocks
        level = [s for s in spans if parent(s) in frontier]
        under += level
        frontier = {s["spanID"] for s in level}
    layers = [s for s in under if tag(s, "attnscope.num_heads") is not None
              and tag(s, "code.function.name") != "scaled_dot_product_attention"]
    assert block["attention_calls"] == len(layers)
    assert block["attention_ns"] == pytest.approx(sum(tag(s, "attnscope.wall_ns") for s in layers))
    assert block["share"] == pytest.approx(block["attention_ns"] / sum(walls))
    # every call sampled: the shares are exact, no interval
    assert block["share_interval"] is None
    assert all(s["share_interval"] is None for s in doc["end_to_end"]["attention_share"])
    assert block["tokens_per_s"] is None  # the blocks were given no tokens
    run = doc["run"]
    assert run["versions"]["torch"] == str(torch.__version__)
    assert run["versions"]["attnscope"] == attnscope.__version__
    assert run["versions"]["transformers"] is not None
    assert run["settings"]["sample_rate"] == 1.0 and run["settings"]["profile_rate"] == 0.0
    assert run["command"].split()[1] == "-c" and run["processes"] == 1
    assert run["source"] == ["resource"]  # written by configure(): no run.json


def test_the_slowest_calls_say_which_is_its_processs_first_of_its_layer_and_phase(
        traces: TraceFiles, tmp_path: Path) -> None:
    # every call sampled, no warm-up calls: a layer and phase's earliest span is its first call
    done = _cli("report", traces.jaeger, "--json", tmp_path / "r.json", "--top", "1000")
    assert done.returncode == 0, done.stderr
    slowest = json.loads((tmp_path / "r.json").read_text())["slowest"]
    spans = jaeger_spans(traces.jaeger)
    earliest: dict[tuple[str, str], tuple[int, str]] = {}
    for s in spans:
        if s["tags"].get("attnscope.num_heads") is None or \
                s["tags"].get("code.function.name") == "scaled_dot_product_attention":
            continue
        key = (s["tags"]["attnscope.module"], s["tags"]["attnscope.phase"])
        earliest[key] = min(earliest.get(key, (s["startTime"], s["spanID"])),
                            (s["startTime"], s["spanID"]))
    firsts = {span_id for _, span_id in earliest.values()}
    assert len(slowest) > len(firsts) >= 4  # 2 layers × prefill, decode: all listed here
    assert {c["span_id"] for c in slowest if c["first_call"]} == firsts
    out = _cli("report", traces.jaeger, "--top", "1000").stdout
    assert out.count("¹") == len(firsts) + 1 and "¹ the first call of its layer" in out


def _row(span_id: str, start_ms: float, *, pid: int | None = 7, rate: float = 1.0,
         warmup: int = 0, phase: str = "decode") -> SpanRow:
    row = _attn(span_id, "p", start_ms, 1, phase, **{"attnscope.sample_rate": rate})
    resource = {"host.name": "h", "attnscope.config.warmup_calls": warmup}
    if pid is not None:
        resource["process.pid"] = pid
    return SpanRow(row.trace_id, row.span_id, None, row.name, row.start_ns, row.end_ns,
                   row.attributes, row.service, resource)


def test_a_first_call_is_one_no_earlier_call_can_have_gone_unsampled_before() -> None:
    rows = [_row("a", 5), _row("b", 1), _row("c", 3, phase="prefill"), _row("d", 2, pid=8)]
    assert first_calls(rows, rows) == {("t" * 32, "b"), ("t" * 32, "c"), ("t" * 32, "d")}
    assert first_calls(rows, rows[:1]) == frozenset()  # only those asked about
    for unsure in ({"rate": 0.5}, {"warmup": 10}, {"pid": None}):  # an earlier one may be missing
        assert first_calls([_row("b", 1, **unsure)], [_row("b", 1, **unsure)]) == frozenset()


def test_report_terminal_shows_the_run_and_the_end_to_end_tables(traces: TraceFiles,
                                                                 tmp_path: Path) -> None:
    done = _cli("report", traces.otlp, "--html", tmp_path / "r.html")
    assert done.returncode == 0, done.stderr
    page = (tmp_path / "r.html").read_text()
    assert "<h2>Run</h2>" in page and f"torch {torch.__version__}" in page
    assert "End to end: generate(), the model" in page and "TTFT p50" in page
    assert "<th>attn share</th>" in page
    out = done.stdout
    assert f"versions: attnscope {attnscope.__version__}, torch {torch.__version__}" in out
    assert "configured: sample rate 1, profile rate 0," in out
    assert "generate() end to end" in out and "Attention's share of the model's time" in out
    assert "Your traced blocks" in out and " request " in out


def test_run_writes_run_json_and_report_reads_it(tmp_path: Path) -> None:
    app = tmp_path / "app.py"
    app.write_text("import torch, torch.nn.functional as F\nimport sys\n"
                   "q = torch.randn(1, 2, 8, 16)\n"
                   "for _ in range(4):\n    F.scaled_dot_product_attention(q, q, q)\n"
                   "sys.exit(0)\n")
    out = tmp_path / "out"
    done = _cli("run", "--no-report", "--sample-rate", "1", "--out", out, "--", "python",
                app, "--flag", "x y", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    info = json.loads((out / "run.json").read_text())
    assert info["command"] == ["python", str(app), "--flag", "x y"]
    assert info["exit_code"] == 0 and info["duration_s"] > 0
    # numbers, as `report --json` and the resource state them (were strings: "1.0")
    assert info["settings"] == {"sample_rate": 1.0, "profile_rate": 0.05,
                                "overhead_budget": 1.0, "warmup_calls": 0}
    assert type(info["settings"]["warmup_calls"]) is int
    meta = run_info(out, load_spans(out))
    assert meta["command"] == f"python {app} --flag 'x y'"
    assert meta["started"] == info["started"] and meta["source"] == ["run.json", "resource"]
    assert describe(meta)[0].startswith(f"run: python {app} --flag 'x y' (started ")
    again = _cli("run", "--no-report", "--out", out, "--", "python", app, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert json.loads((out / "run.json").read_text())["command"] == ["python", str(app)]


def test_report_marks_rows_with_calls_not_exact(tmp_path: Path) -> None:
    trace = tmp_path / "t.json"
    program = (
        "import torch, attnscope\n"
        f"attnscope.configure(exporter='jaeger-json:{trace}', sample_rate=1.0, warmup_calls=0,"
        " overhead_budget=1.0, profile_rate=0.0, metrics=False)\n"
        "@attnscope.trace(name='odd')\n"
        "def odd(q, k, v, attn_mask=None):\n    return q\n"
        "@attnscope.trace(name='plain')\n"
        "def plain(q, k, v, attn_mask=None):\n    return q\n"
        "q = torch.zeros(1, 2, 4, 8)\n"
        "blocked = torch.ones(1, 1, 1, 4, 4, dtype=torch.bool)\n"  # a layout not read
        "causal = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]\n"
        "for _ in range(3):\n    odd(q, q, q, attn_mask=blocked)\n"
        "    plain(q, q, q, attn_mask=causal)\n"
        "attnscope.shutdown()\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=120, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    report = _cli("report", trace, "--json", tmp_path / "r.json")
    assert report.returncode == 0, report.stderr
    groups = {g["module"]: g for g in json.loads((tmp_path / "r.json").read_text())["groups"]}
    assert groups["odd"]["inexact_calls"] == {"mask_unread": 3}
    assert groups["plain"]["inexact_calls"] == {}
    assert "† odd —: 3 of 3 calls not exact: 3 mask_unread (FLOPs an upper bound)" \
        in report.stdout
    flops_cells = [line for line in report.stdout.splitlines()
                   if line.lstrip().startswith(("odd", "plain")) and "k" in line]
    assert any(line.lstrip().startswith("odd") and "†" in line for line in flops_cells)
    assert not any(line.lstrip().startswith("plain") and "†" in line for line in flops_cells)
