"""transformers' continuous batching (``generate_batch()``, ``transformers serve``): the
requests of a step packed into one row over a paged cache attnscope cannot read. The keys come
from the call's 4-D mask, the phase from the longest sequence's new tokens; a cache whose length
is not read is never taken for an empty one."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
import transformers

import attnscope
from attnscope._capture import retain
from attnscope._derive.call import derive
from attnscope._instrument.transformers import hidden_state_extractor
from attnscope._record.capture import Capture, TensorMeta
from attnscope._record.facts import NOT_READ, Facts
from attnscope.testing import capture_spans

PROMPTS = [[5, 6, 7, 8, 9], [10, 11, 12], [20, 21, 22, 23, 24, 25, 26]]
NEW = 4
HEADS, HEAD_DIM = 4, 16


def _llama() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=128, hidden_size=HEADS * HEAD_DIM, intermediate_size=128,
        num_hidden_layers=2, num_attention_heads=HEADS, num_key_value_heads=2,
        max_position_embeddings=256, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    return transformers.LlamaForCausalLM(cfg).eval()


def _generate_batch(model: Any, cuda_graphs: bool | None = None) -> None:
    config = pytest.importorskip("transformers.generation.configuration_utils")
    if not hasattr(config, "ContinuousBatchingConfig") or not hasattr(model, "generate_batch"):
        pytest.skip("this transformers has no continuous batching configuration")
    gc = transformers.GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=-1,
                                       pad_token_id=0)
    cb = config.ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=32, page_size=16,
                                         use_cuda_graph=cuda_graphs)
    with torch.no_grad():
        out = model.generate_batch(inputs=PROMPTS, generation_config=gc,
                                   continuous_batching_config=cb, warmup=False)
    assert all(len(o.generated_tokens) == NEW for o in out.values())


def _flops(pairs: int) -> int:
    return 2 * pairs * HEADS * (HEAD_DIM + HEAD_DIM)


def test_packed_steps_say_their_phase_keys_tokens_and_exact_flops() -> None:
    model = _llama()
    attnscope.instrument(model, trace_model=True)
    try:
        with capture_spans() as spans:
            _generate_batch(model)
    finally:
        attnscope.uninstrument(model)
    layer = check_packed_layer(spans)
    lengths = [len(p) for p in PROMPTS]
    # the keys held are all the requests' together: no one row's cache length
    assert all("attnscope.kv_cache_len" not in a.attributes for a in layer)
    forwards = sorted((s for s in spans if s.attributes.get("code.function.name")
                       == "LlamaForCausalLM.forward"), key=lambda s: s.start_time)
    assert [(f.attributes["attnscope.phase"], f.attributes["attnscope.tokens"])
            for f in forwards] == [("prefill", sum(lengths))] + [("decode", 3)] * (NEW - 1)
    assert forwards[0].attributes["gen_ai.usage.input_tokens"] == sum(lengths)


def test_prompts_split_over_steps_and_mixed_with_decodes_add_up() -> None:
    # a step of at most 6 tokens: the prompts go in chunks, some steps mix a chunk with decodes
    config = pytest.importorskip("transformers.generation.configuration_utils")
    if not hasattr(config, "ContinuousBatchingConfig"):
        pytest.skip("this transformers has no continuous batching configuration")
    model = _llama()
    attnscope.instrument(model)
    gc = transformers.GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=-1,
                                       pad_token_id=0)
    cb = config.ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=6, page_size=16)
    try:
        with capture_spans() as spans, torch.no_grad():
            model.generate_batch(inputs=PROMPTS, generation_config=gc,
                                 continuous_batching_config=cb, warmup=False)
    finally:
        attnscope.uninstrument(model)
    layer = [s.attributes for s in spans
             if s.attributes.get("attnscope.module") == "model.layers.0.self_attn"]
    lengths = [len(p) for p in PROMPTS]
    assert max(a["attnscope.seq_len_q"] for a in layer) <= 6 < sum(lengths)
    # every prompt causal on its own, then one query a step over each request's keys
    pairs = (sum(n * (n + 1) // 2 for n in lengths)
             + sum(n + step for n in lengths for step in range(1, NEW)))
    assert sum(a["attnscope.flops"] for a in layer) == _flops(pairs)
    assert sum(a["attnscope.tokens"] for a in layer) == sum(lengths) + len(lengths) * (NEW - 1)
    assert all("attnscope.inexact_reason" not in a for a in layer)
    steps_of_one = [a for a in layer if a["attnscope.phase"] == "decode"]
    assert steps_of_one and all(a["attnscope.tokens"] == a["attnscope.seq_len_q"]
                                for a in steps_of_one)


def check_packed_layer(spans: Any) -> list[Any]:
    """The first layer's spans of :func:`_generate_batch`, checked against the prompts; they
    are returned, in order."""
    layer = sorted((s for s in spans if s.attributes.get("attnscope.module")
                    == "model.layers.0.self_attn"), key=lambda s: s.start_time)
    lengths = [len(p) for p in PROMPTS]
    # one prefill of every prompt packed together, then a decode step of one token each
    decode_keys = [sum(n + step for n in lengths) for step in range(1, NEW)]
    assert [(a.attributes["attnscope.phase"], a.attributes["attnscope.seq_len_q"],
             a.attributes["attnscope.seq_len_kv"], a.attributes["attnscope.tokens"])
            for a in layer] == ([("prefill", sum(lengths), sum(lengths), sum(lengths))]
                                + [("decode", 3, k, 3) for k in decode_keys])
    # each prompt causal on its own (no pair across requests); a decode query sees its own keys
    assert layer[0].attributes["attnscope.flops"] == _flops(sum(n * (n + 1) // 2
                                                                for n in lengths))
    assert [a.attributes["attnscope.flops"] for a in layer[1:]] == [_flops(k)
                                                                   for k in decode_keys]
    assert all("attnscope.inexact_reason" not in a.attributes for a in layer)
    return layer


class _Unknown:
    """A cache attnscope does not know: no layers, no get_seq_length."""


def test_a_cache_whose_length_is_not_read_is_no_empty_one() -> None:
    model = _llama()
    layer = model.model.layers[0].self_attn
    extract = hidden_state_extractor(layer, tuple(inspect.signature(type(layer).forward)
                                                  .parameters))
    hidden = torch.zeros(1, 3, HEADS * HEAD_DIM)
    got = extract(layer, (), {"hidden_states": hidden, "past_key_values": _Unknown(),
                              "attention_mask": None})
    assert isinstance(got, Facts) and got.attention is not None
    assert got.attention.past is NOT_READ
    out = derive([], layer, facts=got)
    assert out.exact is False and out.inexact_reason == "cache_unread"
    assert (out.phase, out.kv_cache_len, out.seq_len_kv, out.flops) == (None, None, None, None)
    # with a 4-D mask shaped to the scores, its key axis is the keys the call attends
    mask = torch.zeros(1, 1, 3, 10)
    got = extract(layer, (), {"hidden_states": hidden, "past_key_values": _Unknown(),
                              "attention_mask": mask})
    assert got is not None and got.attention is not None and got.attention.past == 7
    out = derive([], layer, facts=got)
    assert (out.phase, out.seq_len_kv, out.inexact_reason) == ("prefill", 10, None)
    assert out.flops == 2 * 3 * 10 * HEADS * 2 * HEAD_DIM  # the mask hides no pair
    assert out.kv_cache_len == 7  # not packed: every row holds the same keys


def test_a_small_view_of_a_large_host_mask_is_copied_not_dropped() -> None:
    # continuous batching's mask: a view of a buffer far over the keeping budget, rewritten in
    # place at the next step, before the worker counts it
    buffer = torch.zeros(1, 1, 64, (retain.KEEP_TENSOR_BYTES // 4) // 64 + 64)
    view = buffer[:, :, :3, :18]
    view[0, 0, 0, 8:] = float("-inf")
    cap = Capture.__new__(Capture)
    cap.kept_bytes = 0
    kept = retain._keep_mask(cap, view)
    assert isinstance(kept, torch.Tensor) and kept.data_ptr() != view.data_ptr()
    assert cap.kept_bytes == view.numel() * view.element_size()
    buffer.fill_(float("-inf"))
    assert int((kept == 0).sum()) == 8 + 18 + 18
    retain.release(cap)
    # beyond the copy's bound: its shape only, as before
    big = torch.zeros(1, 1, 1024, 8192)[:, :, :, :4096]
    assert type(retain._keep_mask(cap, big)) is TensorMeta
