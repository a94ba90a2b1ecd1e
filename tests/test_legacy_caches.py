"""Tuple-style (legacy) KV caches: the model's tuple of per-layer pairs, a layer's own pair, and
an encoder-decoder layer's 4-tuple (issue 12 item 8: every decode step looked like prefill); the
first call of a tuple-cache model, which passes no cache but ``use_cache=True`` (GPT-2 up to
transformers 4.51, GPT-Neo 4.44: their first spans had no phase)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope._instrument.transformers import _past_length
from attnscope._record.facts import NOT_READ
from attnscope.testing import capture_spans
from tests.support.helpers import base_name


def _kv(seq: int) -> torch.Tensor:
    return torch.zeros(1, 2, seq, 4)


def test_the_models_tuple_of_layer_pairs() -> None:
    cache = ((_kv(5), _kv(5)), (_kv(7), _kv(7)))
    assert _past_length(cache, None) == 5  # was None: the pair of pairs was read as one pair
    assert _past_length(cache, 1) == 7
    assert _past_length(cache, 2) == 0  # a layer the cache has not reached yet


def test_one_layers_pair_and_an_encoder_decoder_4_tuple() -> None:
    assert _past_length((_kv(3), _kv(3)), 0) == 3
    layer = (_kv(3), _kv(3), _kv(9), _kv(9))  # self key/value, then cross key/value
    assert _past_length(layer, 0) == 3
    assert _past_length(layer, 0, cross=True) == 9
    assert _past_length(((_kv(3), _kv(3), _kv(9), _kv(9)),), 0, cross=True) == 9


def test_empty_and_unknown() -> None:
    assert _past_length((), None) == 0  # nothing held yet
    # what it cannot read is unknown (cache_unread on the worker), never an empty cache
    assert _past_length((object(), object()), None) is NOT_READ


# ---- a tuple-cache model as transformers wrote them before Cache classes (GPT-2 <= 4.51) -------


class _TupleAttention(torch.nn.Module):
    """GPT-2's old layer: fused projection, ``layer_past`` a (key, value) pair or None."""

    def __init__(self, dim: int = 16, heads: int = 4) -> None:
        super().__init__()
        self.c_attn = torch.nn.Linear(dim, 3 * dim)
        self.num_heads, self.head_dim = heads, dim // heads

    def forward(
        self, hidden_states: torch.Tensor, layer_past: Any = None, use_cache: bool = False
    ) -> tuple[torch.Tensor, Any]:
        b, s, dim = hidden_states.shape
        q, k, v = (
            t.view(b, s, self.num_heads, self.head_dim).transpose(1, 2)
            for t in self.c_attn(hidden_states).split(dim, 2)
        )
        if layer_past is not None:
            k, v = torch.cat([layer_past[0], k], 2), torch.cat([layer_past[1], v], 2)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=s > 1)
        return out.transpose(1, 2).reshape(b, s, dim), (k, v) if use_cache else None


class _TupleModel(torch.nn.Module):
    def __init__(self, layers: int = 2) -> None:
        super().__init__()
        self.wte = torch.nn.Embedding(32, 16)
        self.h = torch.nn.ModuleList(_TupleAttention() for _ in range(layers))

    def forward(
        self, input_ids: torch.Tensor, past_key_values: Any = None, use_cache: bool | None = None
    ) -> tuple[torch.Tensor, Any]:
        x, presents = self.wte(input_ids), []
        for i, layer in enumerate(self.h):
            past = None if past_key_values is None else past_key_values[i]
            x, present = layer(x, layer_past=past, use_cache=use_cache is True)
            presents.append(present)
        return x, tuple(presents) if use_cache else None


def _phases(spans: list[Any], name: str) -> list[tuple[Any, ...]]:
    keys = ("phase", "kv_cache_len", "seq_len_kv", "tokens")
    return [
        tuple(s.attributes.get(f"attnscope.{k}") for k in keys)
        for s in sorted(spans, key=lambda s: s.start_time)
        if base_name(s) == name
    ]


def test_a_manual_decode_loop_feeding_the_tuple_back() -> None:
    torch.manual_seed(0)
    model = _TupleModel().eval()
    attnscope.instrument(model, trace_model=True)
    lengths = []  # what the cache really held before each call
    with capture_spans() as spans, torch.no_grad():
        cache = None
        for ids in (torch.tensor([[1, 2, 3, 4, 5, 6]]), *([torch.tensor([[7]])] * 3)):
            lengths.append(0 if cache is None else cache[0][0].shape[-2])
            _, cache = model(ids, past_key_values=cache, use_cache=True)
    attnscope.uninstrument(model)
    steps = [(0, 6, 6), *((n, n + 1, 1) for n in lengths[1:])]
    expected = [("prefill" if n == 0 else "decode", n, kv, t) for n, kv, t in steps]
    assert lengths == [0, 6, 7, 8]
    assert _phases(spans, "h.0") == _phases(spans, "h.1") == expected
    assert _phases(spans, "_TupleModel") == expected
    usage = [s.attributes.get("gen_ai.usage.input_tokens") for s in spans
             if base_name(s) == "_TupleModel"]
    assert sorted(usage, key=lambda u: u is None) == [6, None, None, None]  # prompt counted once


def test_no_cache_asked_for_means_no_phase() -> None:
    model = _TupleModel(layers=1).eval()
    attnscope.instrument(model)
    with capture_spans() as spans, torch.no_grad():
        model(torch.tensor([[1, 2, 3]]), use_cache=False)
    attnscope.uninstrument(model)
    (a,) = [s.attributes for s in spans]
    assert "attnscope.phase" not in a and "attnscope.kv_cache_len" not in a
    assert a["attnscope.seq_len_kv"] == 3


# ---- real GPT-2 (a tuple cache before transformers 4.52, a Cache object after) ----------------


def test_gpt2_generate_and_manual_loop_with_trace_model() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    kw: dict[str, Any] = {"max_new_tokens": 4, "min_new_tokens": 4, "do_sample": False}
    with torch.no_grad():
        ref = model.generate(ids, pad_token_id=0, **kw)
    attnscope.instrument(model, trace_model=True)
    with capture_spans() as spans, torch.no_grad():
        out = model.generate(ids, pad_token_id=0, **kw)
        first = model(ids, use_cache=True)
        model(ref[:, 6:7], past_key_values=first.past_key_values, use_cache=True)
    attnscope.uninstrument(model)
    assert torch.equal(out, ref)
    forwards = _phases(spans, "GPT2LMHeadModel")
    steps = [("prefill", 0, 6, 6), *(("decode", n, n + 1, 1) for n in (6, 7, 8))]
    assert forwards == [*steps, ("prefill", 0, 6, 6), ("decode", 6, 7, 1)]
    assert _phases(spans, "transformer.h.1.attn") == forwards
    inputs = [s.attributes.get("gen_ai.usage.input_tokens") for s in spans
              if base_name(s) == "GPT2LMHeadModel"]
    assert sorted(inputs, key=lambda u: u is None) == [6, 6, *([None] * 4)]  # not 9: each prompt


# ---- per-layer windows that older releases keep elsewhere ------------------------------------


class _Config:
    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class _OldGPTNeoAttention(torch.nn.Module):
    """GPT-Neo's inner layer before transformers 5: no ``attention_type``; ``layer_id`` from 4.48,
    and in 4.44 not even that: a local layer is known by its causal buffer only."""

    def __init__(self, kind: str, layer_id: int | None, size: int = 16, window: int = 4) -> None:
        super().__init__()
        self.config = _Config(num_heads=2, hidden_size=8, window_size=window,
                              attention_layers=["global", "local"])
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(8, 8) for _ in range(3))
        if layer_id is not None:
            self.layer_id = layer_id
        bias = torch.ones(size, size, dtype=torch.bool).tril().view(1, 1, size, size)
        if kind == "local":  # as GPT-Neo 4.44 built it
            bias = torch.bitwise_xor(bias, torch.tril(bias, -window))
        self.register_buffer("bias", bias, persistent=False)


@pytest.mark.parametrize("layer_id", [0, 1, None], ids=["global-id", "local-id", "no-id"])
@pytest.mark.parametrize("buffer_kind", ["global", "local"])
def test_gpt_neo_local_window_without_attention_type(layer_id: int | None,
                                                     buffer_kind: str) -> None:
    from attnscope._attention.families.config_window import layer_window as _window

    module = _OldGPTNeoAttention(buffer_kind, layer_id)
    # layer_id indexes the config's attention_layers; without it the buffer is all there is
    kind = buffer_kind if layer_id is None else module.config.attention_layers[layer_id]
    assert _window(module) == (4 if kind == "local" else None)


def test_modernbert_local_layer_reads_its_sliding_window_mask() -> None:
    from attnscope._instrument.transformers import hidden_state_extractor
    from attnscope._record.capture import AttentionFacts

    def facts(local: tuple[int, int]) -> Any:
        module = torch.nn.Module()
        module.Wqkv = torch.nn.Linear(8, 24)
        module.num_heads, module.head_dim, module.local_attention = 2, 4, local
        extract = hidden_state_extractor(module, ("self", "hidden_states", "output_attentions"))
        kw = {"attention_mask": full, "sliding_window_mask": band}
        found = extract(module, (module, torch.zeros(1, 6, 8)), kw).attention
        assert isinstance(found, AttentionFacts)
        return found.mask

    full = torch.zeros(1, 1, 6, 6)
    band = torch.zeros(1, 1, 6, 6)
    assert facts((2, 2)) is band  # the local layer's band, not the global mask
    assert facts((-1, -1)) is full


# ---- causality given as a mask of its own (CLIP's text layers before transformers 5) ----------


class _CausalMaskAttention(torch.nn.Module):
    """CLIP's text attention up to 4.57: ``causal_attention_mask`` beside ``attention_mask``,
    both additive, the layer adds them; eager, so its weights show the visible pairs."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(8, 8) for _ in range(3))
        self.num_heads, self.head_dim = 2, 4

    def forward(self, hidden_states: torch.Tensor, attention_mask: Any = None,
                causal_attention_mask: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, _ = hidden_states.shape
        q, k, v = (p(hidden_states).view(b, s, 2, 4).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        scores = q @ k.transpose(-1, -2) / 2.0
        for mask in (causal_attention_mask, attention_mask):
            if mask is not None:
                scores = scores + mask
        weights = scores.softmax(-1)
        return (weights @ v).transpose(1, 2).reshape(b, s, 8), weights


def _additive(visible: torch.Tensor) -> torch.Tensor:
    return torch.zeros(visible.shape).masked_fill(~visible, torch.finfo(torch.float32).min)


def _causal_mask_case(with_padding: bool) -> None:
    torch.manual_seed(0)
    module = _CausalMaskAttention().eval()
    causal = _additive(torch.ones(6, 6, dtype=torch.bool).tril()).expand(2, 1, 6, 6)
    keep = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]], dtype=torch.bool)
    padding = _additive(keep[:, None, None, :].expand(2, 1, 6, 6)) if with_padding else None
    hidden = torch.randn(2, 6, 8)
    attnscope.instrument(module)
    with capture_spans() as spans, torch.no_grad():
        _, weights = module(hidden, attention_mask=padding, causal_attention_mask=causal)
    attnscope.uninstrument(module)
    (a,) = [s.attributes for s in spans]
    visible = int((weights > 0).sum())  # the pairs the layer really computed with
    assert a["attnscope.causal"] is True
    assert a["attnscope.tokens"] == (int(keep.sum()) if with_padding else 12)
    if with_padding:  # FLOPs count padded pairs too: the causal pairs of the full rows
        visible = 2 * 2 * 21
    assert a["attnscope.flops"] == visible * 2 * (4 + 4)


def test_causal_attention_mask_alone() -> None:
    _causal_mask_case(with_padding=False)


def test_causal_attention_mask_with_a_padding_mask() -> None:
    _causal_mask_case(with_padding=True)
