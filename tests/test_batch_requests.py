"""attnscope.batch(rows=...) end to end: each request's share of the batched attention calls,
against brute-force counts from the eager attention weights of a real transformers model."""

from __future__ import annotations

import inspect
import logging
from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider

import attnscope
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")

HEADS, HIDDEN, LAYERS = 4, 32, 2
HEAD_DIM = HIDDEN // HEADS
PER_PAIR = 2 * (HEAD_DIM + HEAD_DIM)  # QK^T and PV, per visible (query, key) pair
REQ = "attnscope.request."


def _model() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=HIDDEN, intermediate_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager", pad_token_id=0, eos_token_id=None, bos_token_id=None)
    model = transformers.LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model)
    return model


def _useful_pairs(weights: torch.Tensor, real_queries: torch.Tensor) -> list[int]:
    """Per row: visible (query, key) pairs of the real query rows, over the heads, counted from
    the softmax weights (a masked key's weight is exactly 0 in eager attention)."""
    seen = (weights > 0) & real_queries[:, None, :, None]
    return [int(x) for x in seen.sum((1, 2, 3))]


def _calls(spans: list[Any]) -> list[Any]:
    return [s for s in spans if "attnscope.flops" in (s.attributes or {})]


def test_generate_left_padded_each_request_gets_its_exact_share() -> None:
    model = _model()
    app = TracerProvider().get_tracer("app")
    ids = torch.tensor([[0, 0, 0, 5, 6, 7], [0, 8, 9, 10, 11, 12], [13, 14, 15, 16, 17, 18]])
    mask = (ids != 0).long()
    new = 8
    with capture_spans() as spans:
        requests = [app.start_span(f"request-{i}") for i in range(3)]
        with torch.no_grad(), attnscope.batch(rows=requests):
            out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                                 do_sample=False, output_attentions=True,
                                 return_dict_in_generate=True)
        for r in requests:
            r.end()
    # brute force: every step's every layer, from the eager weights
    useful = [0, 0, 0]
    tokens = [0, 0, 0]
    padded = [0, 0, 0]  # each row's share of the padded shape: causal pairs of the whole row
    for step, layers in enumerate(out.attentions):
        for w in layers:
            sq, skv = w.shape[-2], w.shape[-1]
            real = mask.bool() if step == 0 else torch.ones(3, 1, dtype=torch.bool)
            for b, n in enumerate(_useful_pairs(w, real)):
                useful[b] += PER_PAIR * n
                tokens[b] += int(real[b].sum())
                padded[b] += PER_PAIR * HEADS * sum(min(skv, skv - sq + i + 1) for i in range(sq))
    assert len(out.attentions) == new
    made = [s for s in spans if s.name == "attnscope.request"]
    assert len(made) == 3
    calls = _calls(spans)
    assert len(calls) == LAYERS * new
    for b, request in enumerate(requests):
        mine = [s for s in made if s.parent is not None
                and s.parent.span_id == request.get_span_context().span_id]
        assert len(mine) == 1, b
        a = mine[0].attributes
        assert a[REQ + "useful_flops"] == useful[b]
        assert a[REQ + "tokens"] == tokens[b]
        assert a[REQ + "flops"] == padded[b] == a[REQ + "useful_flops"] + a[REQ + "padding_flops"]
        assert a[REQ + "sampled_calls"] == LAYERS * new
        assert a[REQ + "prefill.calls"] == LAYERS and a[REQ + "decode.calls"] == LAYERS * (new - 1)
        assert a[REQ + "calls_unapportioned"] == 0 and REQ + "exact" not in a
        assert a[REQ + "all_calls.flops"] == a[REQ + "flops"]  # every call sampled
        assert len(mine[0].links) == LAYERS * new
        assert {link.context.span_id for link in mine[0].links} == {
            c.context.span_id for c in calls}
    # rows' sums are the calls' totals, and each call's padding fraction is what is left
    assert sum(s.attributes[REQ + "flops"] for s in made) == sum(
        c.attributes["attnscope.flops"] for c in calls)
    assert sum(s.attributes[REQ + "attention_ns"] for s in made) == pytest.approx(
        sum(c.attributes["attnscope.wall_ns"] for c in calls), abs=3)
    assert 1 - sum(useful) / sum(padded) == pytest.approx(
        sum(c.attributes["attnscope.padding_fraction"] * c.attributes["attnscope.flops"]
            for c in calls) / sum(c.attributes["attnscope.flops"] for c in calls), abs=1e-3)


def test_a_left_padded_decode_step_is_exact() -> None:
    """One query over a left-padded cache: the mask shows no causality (nothing is later than
    the query), yet the padded shape's pairs are known: the FLOPs are exact, not marked."""
    model = _model()
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 10]])
    with capture_spans() as spans, torch.no_grad():
        model.generate(input_ids=ids, attention_mask=(ids != 0).long(), max_new_tokens=3,
                       do_sample=False)
    decode = [c for c in _calls(spans) if c.attributes.get("attnscope.phase") == "decode"]
    assert len(decode) == LAYERS * 2
    for c in decode:
        skv = c.attributes["attnscope.seq_len_kv"]
        assert "attnscope.exact" not in c.attributes
        assert c.attributes["attnscope.flops"] == PER_PAIR * 2 * HEADS * skv
        assert c.attributes["attnscope.tokens"] == 2


def _step(model: Any, ids: torch.Tensor, mask: torch.Tensor, past: Any) -> tuple[Any, Any]:
    # the cache's keyword: `cache` in recent transformers, `past_key_values` in 5.20.2
    name = "cache" if "cache" in inspect.signature(model.forward).parameters \
        else "past_key_values"
    out = model(input_ids=ids, attention_mask=mask, use_cache=True, output_attentions=True,
                **{name: past})
    return getattr(out, name), out


def test_rows_that_change_between_steps_give_each_request_only_its_steps() -> None:
    """An engine's loop declaring rows per step: row 2 is padding for the prompt and the first
    decode step, then request "c" takes it. "c" gets only the steps it was in; the padding
    row's share is padding in the calls' figures."""
    model = _model()
    ids = torch.tensor([[5, 6, 7], [8, 9, 10], [0, 0, 0]])
    mask = torch.tensor([[1, 1, 1], [1, 1, 1], [0, 0, 0]])
    per_step = [["a", "b", None], ["a", "b", None], ["a", "b", "c"], ["a", "b", "c"]]
    expected: dict[str, int] = {"a": 0, "b": 0, "c": 0}
    with capture_spans() as spans, torch.no_grad():
        past = None
        cur = ids
        for rows in per_step:
            if rows[2] == "c":
                mask = torch.cat([mask[:, :-1], torch.ones(3, 1, dtype=mask.dtype)], 1)
            with attnscope.batch(rows=rows):
                past, out = _step(model, cur, mask, past)
            for w in out.attentions:
                sq = w.shape[-2]
                real = mask[:, -sq:].bool()
                for b, n in enumerate(_useful_pairs(w, real)):
                    if rows[b] is not None:
                        expected[rows[b]] += PER_PAIR * n
            cur = out.logits[:, -1:].argmax(-1)
            mask = torch.cat([mask, torch.ones(3, 1, dtype=mask.dtype)], 1)
    made = [s for s in spans if s.name == "attnscope.request"]
    got: dict[str, int] = {}
    steps: dict[str, int] = {}
    for s in made:
        rid = s.attributes[REQ + "id"]
        got[rid] = got.get(rid, 0) + s.attributes[REQ + "useful_flops"]
        steps[rid] = steps.get(rid, 0) + 1
    assert got == expected
    assert steps == {"a": 4, "b": 4, "c": 2}
    calls = _calls(spans)
    assert sum(s.attributes[REQ + "flops"] for s in made) < sum(
        c.attributes["attnscope.flops"] for c in calls)  # the padding row's share is nobody's
    first = [c for c in calls if c.attributes.get("attnscope.phase") == "prefill"]
    # prompt: rows a and b real (6 causal pairs each), the padding row all padding
    assert all(c.attributes["attnscope.padding_fraction"] == pytest.approx(1 / 3, abs=1e-3)
               for c in first)


def test_a_row_count_that_does_not_match_is_logged_once_and_not_split(
        caplog: pytest.LogCaptureFixture) -> None:
    model = _model()
    ids = torch.tensor([[5, 6, 7], [8, 9, 10]])
    with capture_spans() as spans, torch.no_grad(), caplog.at_level(logging.WARNING):
        with attnscope.batch(rows=["a", "b", "c"]):
            out = model(input_ids=ids)
            model(input_ids=ids)
    assert out.logits.shape == (2, 3, 64)  # the calls proceed
    made = [s for s in spans if s.name == "attnscope.request"]
    assert len(made) == 3
    for s in made:
        assert s.attributes[REQ + "sampled_calls"] == 0
        assert s.attributes[REQ + "calls_unapportioned"] == 2 * LAYERS
    assert all("attnscope.padding_fraction" not in c.attributes for c in _calls(spans))
    assert sum("different number of rows" in r.getMessage() for r in caplog.records) == 1


def test_a_plain_request_id_hangs_under_the_span_around_the_block_and_scales_by_the_rate(
        ) -> None:
    model = _model()
    app = TracerProvider().get_tracer("app")
    ids = torch.tensor([[5, 6, 7, 8]])
    with capture_spans(sample_rate=0.5) as spans, torch.no_grad():
        with app.start_as_current_span("server") as server:
            for _ in range(20):
                with attnscope.batch(rows=["r-1"]):
                    model(input_ids=ids)
    made = [s for s in spans if s.name == "attnscope.request"]
    assert made, "20 blocks of 2 calls at rate 0.5: some call is sampled"
    for s in made:
        assert s.parent is not None and s.parent.span_id == server.get_span_context().span_id
        a = s.attributes
        assert a[REQ + "id"] == "r-1"
        assert a[REQ + "all_calls.flops"] == 2 * a[REQ + "flops"]
        assert a[REQ + "all_calls.attention_ns"] == pytest.approx(2 * a[REQ + "attention_ns"],
                                                                  abs=2)


def test_the_request_histogram_gets_one_point_per_request_span(bare_env: None) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    model = _model()
    with capture_spans(meter_provider=meters) as spans, torch.no_grad():
        with attnscope.batch(rows=["a", "b"]):
            model(input_ids=torch.tensor([[5, 6, 7], [8, 9, 10]]))
    made = [s for s in spans if s.name == "attnscope.request"]
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "attnscope.request.attention.duration" for p in m.data.data_points]
    assert len(made) == 2 and sum(p.count for p in points) == 2
    assert sum(p.sum for p in points) == pytest.approx(
        sum(s.attributes[REQ + "all_calls.attention_ns"] for s in made) / 1e9, abs=1e-8)
    meters.shutdown()


def test_nothing_sampled_in_a_block_emits_nothing() -> None:
    model = _model()
    with capture_spans(sample_rate=0.0) as spans, torch.no_grad():
        with attnscope.batch(rows=["a"]):
            model(input_ids=torch.tensor([[5, 6]]))
    assert spans == []


def _cap_with(mask: torch.Tensor, rows: tuple[Any, ...], sq: int, past: int) -> Any:
    from attnscope._record.batches import BatchRecord
    from attnscope._record.capture import AttentionFacts, Capture, Facts

    f = AttentionFacts(mask.shape[0], sq)
    f.cached, f.past, f.mask = True, past, mask
    f.heads, f.kv_heads, f.head_dim, f.causal = HEADS, 2, HEAD_DIM, True
    cap = Capture()
    cap.capture_id, cap.facts, cap.batch = 1, Facts(f), BatchRecord(rows)
    return cap


@pytest.mark.parametrize("sq, past", [(6, 0), (1, 6)])
def test_a_device_masks_row_counts_travel_as_pinned_copies_and_split_the_same(
        monkeypatch: pytest.MonkeyPatch, sq: int, past: int) -> None:
    """CPU-testable core of the CUDA path: the calling thread enqueues the per-row counts of a
    device mask (``reduce.row_numbers``) before the mask goes; the worker splits the call from
    those copies exactly as it splits a host mask's."""
    from attnscope._capture import hostread
    from attnscope._derive import call as derive
    from attnscope._worker import apportion

    keys = past + sq
    pad = torch.ones(3, keys, dtype=torch.bool)
    pad[0, :3], pad[1, :1] = False, False
    causal = torch.ones(sq, keys, dtype=torch.bool).tril(keys - sq)
    mask = (pad[:, None, None, :] & causal)  # (3, 1, sq, keys), as transformers builds it
    rows = ("a", "b", None)
    host = _cap_with(mask, rows, sq, past)
    shape = derive.derive(host.summary, facts=host.facts).attributes()
    expected = apportion.split_rows(host, shape, rows, 1000.0)
    assert expected.reason is None and sum(expected.useful) > 0
    monkeypatch.setattr(hostread, "_on_device", lambda v: isinstance(v, torch.Tensor))
    monkeypatch.setattr(hostread, "enqueue_to_host", lambda t: t.clone())
    device = _cap_with(mask, rows, sq, past)
    assert hostread.to_host(device)
    f = device.facts.attention
    assert isinstance(f.mask, apportion.HostCopy) and f.row_counts.kind == "rows"
    got = apportion.split_rows(device, shape, rows, 1000.0)
    assert (got.reason, got.tokens, got.useful, got.padding) == (
        None, expected.tokens, expected.useful, expected.padding)
    assert apportion.split_rows(device, shape, rows, 1000.0, device_reads=False).reason \
        == "mask_unread"


def test_a_call_outside_the_random_sample_adds_nothing_to_a_requests_estimate() -> None:
    """A slow-call profile the sampler had not chosen (``attnscope.extra``) is in the request's
    sampled figures, and stands for no unsampled call in ``all_calls``: weight 0, not 1."""
    from attnscope._derive import call as derive
    from attnscope._runtime.grant import Grant
    from attnscope._spans import requests
    from attnscope._worker import apportion

    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool).tril()
    rows = ("a", "b")
    cap = _cap_with(mask, rows, 4, 0)
    cap.sample_rate = 0.25
    shape = derive.derive(cap.summary, facts=cap.facts).attributes()
    drawn = apportion.split_rows(cap, shape, rows, 1000.0)
    assert drawn.reason is None and drawn.weight == 4.0
    cap.grant = Grant("slow_call")
    cap.grant.extra = True
    extra = apportion.split_rows(cap, shape, rows, 1000.0)
    assert extra.weight == 0.0
    req = requests._Request(0)
    for call in (drawn, extra):
        requests._add(req, call, [0])
    assert req.calls == 2 and req.time_ns == 1000.0  # both calls' own figures: 500 ns each
    assert req.all_time_ns == 4 * 500.0  # the drawn call's alone, scaled
    assert req.all_flops == 4 * (drawn.useful[0] + drawn.padding[0])
