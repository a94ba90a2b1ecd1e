"""Spans against an eager reference on architectures with their own cache, window or fast path.

The reference is what the model itself computed: the softmax weights of eager attention (a
(query, key) pair is visible when its weight is not zero), the shapes of those weights, and the
cache each step really held. Nothing here is a number copied from attnscope's own output.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")

PROMPT = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12]])


def _attrs(span: Any) -> dict[str, Any]:
    return {k.removeprefix("attnscope."): v for k, v in span.attributes.items()}


def _by_start(spans: list[Any]) -> list[dict[str, Any]]:
    return [_attrs(s) for s in sorted(spans, key=lambda s: s.start_time)]


def _pairs_flops(weights: torch.Tensor, head_dim: int) -> int:
    """QKᵀ and PV FLOPs of the pairs the softmax left visible (2 per multiply-add)."""
    return int((weights != 0).sum()) * 2 * (head_dim + head_dim)


# ---- GPT-Neo: per-layer cache (layer_id) and local attention (window_size) ----------------------


def _gpt_neo() -> Any:
    cfg = transformers.GPTNeoConfig(
        vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, max_position_embeddings=64,
        attention_types=[[["global", "local"], 1]], window_size=4, intermediate_size=64,
        attn_implementation="eager", pad_token_id=0, eos_token_id=None, bos_token_id=None,
    )
    torch.manual_seed(0)
    return transformers.GPTNeoForCausalLM(cfg).eval()


def test_gpt_neo_prefill_per_layer_cache_and_local_window() -> None:
    model = _gpt_neo()
    with torch.no_grad():
        ref = model(PROMPT, output_attentions=True, use_cache=True).attentions
    attnscope.instrument(model)
    with capture_spans() as spans, torch.no_grad():
        model(PROMPT, use_cache=True)
    got = sorted((_attrs(s) for s in spans), key=lambda a: a["layer_index"])
    assert len(got) == len(ref) == 2
    for layer, (a, weights) in enumerate(zip(got, ref, strict=True)):
        assert a["seq_len_kv"] == weights.shape[-1] == 8, layer
        assert a["kv_cache_len"] == 0 and a["phase"] == "prefill", layer
        assert a["flops"] == _pairs_flops(weights, a["head_dim"]), layer
    assert got[1]["sliding_window"] == 4 and "sliding_window" not in got[0]


def test_gpt_neo_generate_decode_steps_match_the_cache() -> None:
    model = _gpt_neo()
    kw: dict[str, Any] = {"max_new_tokens": 3, "do_sample": False, "min_new_tokens": 3}
    with torch.no_grad():
        ref = model.generate(PROMPT, output_attentions=True, return_dict_in_generate=True, **kw)
    weights = [w for step in ref.attentions for w in step]  # step-major, layer-minor
    attnscope.instrument(model)
    with capture_spans() as spans, torch.no_grad():
        model.generate(PROMPT, **kw)
    got = _by_start(spans)
    assert len(got) == len(weights) == 6
    for i, (a, w) in enumerate(zip(got, weights, strict=True)):
        skv = w.shape[-1]
        assert (a["seq_len_q"], a["seq_len_kv"]) == (w.shape[-2], skv), i
        assert a["kv_cache_len"] == skv - w.shape[-2], i
        assert a["phase"] == ("prefill" if i < 2 else "decode"), i
        assert a["flops"] == _pairs_flops(w, a["head_dim"]), i


# ---- encoder-decoder generate: cross-attention phase and cache --------------------------------


def _bart(kind: str) -> Any:
    small = dict(vocab_size=64, d_model=32, encoder_layers=1, decoder_layers=1,
                 encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
                 decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1,
                 bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
                 attn_implementation="eager")
    torch.manual_seed(0)
    if kind == "marian":
        return transformers.MarianMTModel(transformers.MarianConfig(**small)).eval()
    if kind == "mbart":
        return transformers.MBartForConditionalGeneration(transformers.MBartConfig(**small)).eval()
    return transformers.BartForConditionalGeneration(transformers.BartConfig(**small)).eval()


def _bert2bert() -> Any:
    def bert(decoder: bool) -> Any:
        return transformers.BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
            intermediate_size=64, max_position_embeddings=64, is_decoder=decoder,
            add_cross_attention=decoder, attn_implementation="eager")
    cfg = transformers.EncoderDecoderConfig.from_encoder_decoder_configs(bert(False), bert(True))
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = 3, 0, None
    torch.manual_seed(0)
    model = transformers.EncoderDecoderModel(config=cfg).eval()
    model.set_attn_implementation("eager")  # the sub-configs' choice is not carried over
    model.generation_config.decoder_start_token_id = 3
    model.generation_config.pad_token_id = 0
    return model


def _decoder_steps(spans: list[Any]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(self-attention, cross-attention) attributes of each decoder step, in call order."""
    calls = [a for a in _by_start(spans) if "decoder" in a["module"]]
    selfs = [a for a in calls if "seq_len_kv" in a and "cross" not in a["module"]
             and "encoder_attn" not in a["module"] and "crossattention" not in a["module"]]
    cross = [a for a in calls if a not in selfs]
    return list(zip(selfs, cross, strict=True))


@pytest.mark.parametrize("kind", ["bart", "mbart", "marian", "bert2bert"])
def test_encoder_decoder_generate_cross_attention_phase_and_cache(kind: str) -> None:
    model = _bert2bert() if kind == "bert2bert" else _bart(kind)
    src = torch.tensor([[5, 6, 7, 8, 9, 10, 2]])
    kw: dict[str, Any] = {"max_new_tokens": 3, "min_new_tokens": 3, "do_sample": False}
    with torch.no_grad():
        ref = model.generate(src, output_attentions=True, return_dict_in_generate=True, **kw)
    attnscope.instrument(model)
    with capture_spans() as spans, torch.no_grad():
        model.generate(src, **kw)
    steps = _decoder_steps(spans)
    assert len(steps) == len(ref.cross_attentions) == 3
    for i, ((own, cross), w_self, w_cross) in enumerate(
        zip(steps, ref.decoder_attentions, ref.cross_attentions, strict=True)
    ):
        assert own["phase"] == ("prefill" if i == 0 else "decode"), i
        assert cross["phase"] == own["phase"], i
        assert own["seq_len_kv"] == w_self[0].shape[-1], i
        assert cross["seq_len_kv"] == w_cross[0].shape[-1] == src.shape[-1], i
        # the cross-attention cache holds the source keys from the first step on
        assert cross["kv_cache_len"] == (0 if i == 0 else src.shape[-1]), i
        assert cross["flops"] == _pairs_flops(w_cross[0], cross["head_dim"]), i


# ---- nn.TransformerEncoderLayer: the fused inference fast path --------------------------------


def _encoder(nested: bool) -> Any:
    torch.manual_seed(0)
    layer = torch.nn.TransformerEncoderLayer(d_model=16, nhead=4, dim_feedforward=32,
                                             dropout=0.0, batch_first=True)
    return torch.nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=nested).eval()


SRC = torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(0))
PAD = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])  # True = padding


@pytest.mark.parametrize("nested", [False, True])
def test_encoder_fast_path_one_span_per_layer(nested: bool) -> None:
    enc = _encoder(nested)
    attn = enc.layers[0].self_attn
    with torch.no_grad():
        ref = enc(SRC, src_key_padding_mask=PAD)
    attnscope.instrument(enc)
    with capture_spans() as spans, torch.no_grad():
        out = enc(SRC, src_key_padding_mask=PAD)
    assert sorted(s.name for s in spans) == ["layers.0", "layers.1"]
    d = attn.head_dim
    for a in map(_attrs, spans):
        assert a["module_class"] == "TransformerEncoderLayer"
        assert a["fused"] == "attention+feed_forward"
        assert (a["batch_size"], a["seq_len_q"], a["seq_len_kv"]) == (2, 6, 6)
        assert (a["num_heads"], a["head_dim"], a["causal"]) == (attn.num_heads, d, False)
        assert a["tokens"] == int((~PAD).sum())
        assert a["flops"] == 2 * 2 * attn.num_heads * 6 * 6 * (d + d)
    attnscope.uninstrument(enc)
    with torch.no_grad():
        assert torch.equal(out, ref) and torch.equal(enc(SRC, src_key_padding_mask=PAD), ref)


def test_encoder_slow_path_keeps_the_attention_spans() -> None:
    enc = _encoder(False)
    attnscope.instrument(enc)
    assert attnscope.instrumented_modules(enc) == [
        "layers.0", "layers.0.self_attn", "layers.1", "layers.1.self_attn"]
    with capture_spans() as spans:  # gradients on: torch takes the unfused path
        enc(SRC, src_key_padding_mask=PAD)
    assert sorted(s.name for s in spans) == ["layers.0.self_attn", "layers.1.self_attn"]
    assert all("attnscope.fused" not in s.attributes for s in spans)
    attnscope.uninstrument(enc)
    assert attnscope.instrumented_modules(enc) == []


def test_compressed_pairs_closed_form_matches_counting_each_query() -> None:
    """DeepSeek V4's compressed layers: the query at position p sees (p + 1) // rate entries,
    at most top-k; the closed form the worker uses against the sum query by query."""
    from attnscope._attention.families.deepseek_v4 import compressed_pairs

    for seen in range(12):
        for sq in range(1, 10):
            for rate in range(1, 6):
                for topk in range(4):
                    cap = topk or 1 << 30
                    want = sum(min((p + 1) // rate, cap) for p in range(seen, seen + sq))
                    assert compressed_pairs(seen, sq, rate, topk) == want
