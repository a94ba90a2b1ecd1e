"""Causality, windows, FLOPs and tokens read from the mask a layer received, against an eager
reference: visible (query, key) pairs counted from the softmax weights (``output_attentions``).

BLOOM and MPT have no ``is_causal`` attribute (causality comes only through the mask), MPT's
boolean mask is True where a pair is masked, ModernBERT's local layers see a two-sided window.
Padding does not change FLOPs (kernels compute padded positions): a padded batch is compared with
the reference pairs of the same batch unpadded, its tokens with the padding mask.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope._attention.masks import MaskReading, band_pairs, counts_of, read_counts
from attnscope._derive.call import derive_attention
from attnscope._record.capture import AttentionFacts
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")

IDS = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12], [5, 6, 7, 8, 9, 10, 11, 12]])
PADDED = torch.tensor([[1] * 8, [0, 0, 0, 1, 1, 1, 1, 1]])  # 13 real tokens


def _bloom(impl: str) -> Any:
    cfg = transformers.BloomConfig(vocab_size=64, hidden_size=32, n_layer=2, n_head=4,
                                   attn_implementation=impl)
    return transformers.BloomForCausalLM(cfg).eval()


def _mpt(impl: str) -> Any:
    cfg = transformers.MptConfig(vocab_size=64, d_model=32, n_layers=2, n_heads=4, max_seq_len=32,
                                 expansion_ratio=2, attn_implementation=impl)
    return transformers.MptForCausalLM(cfg).eval()


def _modernbert(impl: str) -> Any:
    if not hasattr(transformers, "ModernBertConfig"):
        pytest.skip("ModernBERT arrived in transformers 4.48")
    cfg = transformers.ModernBertConfig(
        vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=64, max_position_embeddings=64, local_attention=4,
        global_attn_every_n_layers=2, pad_token_id=0, attn_implementation=impl)
    return transformers.ModernBertModel(cfg).eval()


BUILDERS = {"bloom": _bloom, "mpt": _mpt, "modernbert": _modernbert}


def _reference(model: Any) -> list[tuple[int, bool]]:
    """Per layer: (visible pairs over batch and heads, causal) from the eager softmax weights of
    the unpadded batch."""
    impl = model.config._attn_implementation
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = model(IDS, attention_mask=torch.ones_like(IDS), output_attentions=True)
    finally:
        model.config._attn_implementation = impl
    result = []
    for weights in out.attentions:
        seen = weights > 0
        above = torch.ones(seen.shape[-2:], dtype=torch.bool).triu(1)
        result.append((int(seen.sum()), not bool(seen[..., above].any())))
    return result


def _spans(model: Any, mask: torch.Tensor) -> list[dict[str, Any]]:
    attnscope.instrument(model)
    try:
        with capture_spans() as spans, torch.no_grad():
            model(IDS, attention_mask=mask)
    finally:
        attnscope.uninstrument(model)
    got = sorted(spans, key=lambda s: s.attributes["attnscope.module"])
    return [{k.removeprefix("attnscope."): v for k, v in s.attributes.items()} for s in got]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "padded"])
@pytest.mark.parametrize("arch,impl", [("bloom", "eager"), ("mpt", "eager"),
                                       ("modernbert", "eager"), ("modernbert", "sdpa")])
def test_layer_spans_match_the_eager_reference(arch: str, impl: str, padded: bool) -> None:
    torch.manual_seed(0)
    model = BUILDERS[arch](impl)
    reference = _reference(model)
    mask = PADDED if padded else torch.ones_like(IDS)
    spans = _spans(model, mask)
    assert len(spans) == len(reference) == 2
    for a, (pairs, causal) in zip(spans, reference, strict=True):
        d = a["head_dim"]
        assert (a["flops"], a["causal"]) == (2 * pairs * (d + d), causal), a["module"]
        assert a["tokens"] == int(mask.sum()), a["module"]


def test_modernbert_local_layer_reports_its_two_sided_window() -> None:
    torch.manual_seed(0)
    spans = _spans(_modernbert("sdpa"), torch.ones_like(IDS))
    assert "sliding_window" not in spans[0] and spans[1]["sliding_window"] == 5  # |i - j| <= 2


# ---- the mask reading itself ---------------------------------------------------------------------


def _brute(sq: int, skv: int, lo: int | None, hi: int | None) -> int:
    return int(_band_mask(sq, skv, lo, hi).sum())


def test_band_pairs_brute_force() -> None:
    for sq in range(1, 6):
        for skv in range(sq, 9):
            for lo in (None, -5, -2, 0):
                for hi in (None, -1, 0, 2):
                    assert band_pairs(sq, skv, lo, hi) == _brute(sq, skv, lo, hi)


def read_mask(mask: torch.Tensor, ignores: bool, batch: int, heads: int, sq: int,
              skv: int) -> MaskReading | None:
    counts = counts_of(mask, ignores, batch, heads, sq, skv)
    return None if counts is None else read_counts(counts, batch, heads, sq, skv)[0]


def _band_mask(sq: int, skv: int, lo: int | None, hi: int | None) -> torch.Tensor:
    d = torch.arange(skv)[None, :] - torch.arange(sq)[:, None] - (skv - sq)
    ok = torch.ones(sq, skv, dtype=torch.bool)
    if lo is not None:
        ok &= d >= lo
    if hi is not None:
        ok &= d <= hi
    return ok


@pytest.mark.parametrize("polarity", ["attend", "masked"])
def test_boolean_polarity_from_the_diagonal_with_padding(polarity: str) -> None:
    ok = _band_mask(6, 6, -2, 0).expand(2, 1, 6, 6).clone()  # causal, window 3
    ok[1, :, :, :2] = False  # row 1: two left-padded keys
    ok[1, :, :2, :] = False  # and their queries see nothing
    mask = ok if polarity == "attend" else ~ok
    reading = read_mask(mask, False, 2, 4, 6, 6)
    assert reading is not None
    assert (reading.causal, reading.window) == (True, 3)
    assert reading.pairs == 2 * 4 * _brute(6, 6, -2, 0)  # padding does not change FLOPs


def test_additive_float_mask_and_the_layer_convention() -> None:
    ok = _band_mask(5, 7, None, 0)  # causal decode-chunk layout: 5 queries after 2 cached keys
    additive = torch.zeros(1, 1, 5, 7).masked_fill(~ok, torch.finfo(torch.float32).min)
    reading = read_mask(additive, False, 3, 2, 5, 7)
    assert reading is not None and (reading.causal, reading.window) == (True, None)
    assert reading.pairs == 3 * 2 * _brute(5, 7, None, 0)
    # most rows padding: the diagonal is outvoted, the layer's convention (MPT) is believed
    heavy = _band_mask(5, 5, None, 0).expand(1, 1, 5, 5).clone()
    heavy[..., :3] = False
    heavy[..., :3, :] = False
    told = read_mask(~heavy, True, 1, 1, 5, 5)
    assert told is not None and (told.causal, told.pairs) == (True, _brute(5, 5, None, 0))
    guessed = read_mask(~heavy, False, 1, 1, 5, 5)
    assert guessed is None or guessed.pairs != told.pairs
    # one real token shows no structure: the module's attributes decide
    lone = torch.full((1, 1, 4, 4), float("-inf"))
    lone[..., 3, 3] = 0.0
    single = read_mask(lone, False, 1, 1, 4, 4)
    assert single is not None and (single.causal, single.pairs) == (None, None)

def test_a_mask_without_a_query_axis_leaves_the_attributes_in_charge() -> None:
    f = AttentionFacts(2, 4)
    f.heads, f.head_dim, f.causal = 2, 8, True
    f.mask = torch.ones(2, 1, 1, 4)  # an extended padding mask: 0 = real
    got = derive_attention(f)
    assert got["causal"] is True and got["flops"] == 2 * 2 * 2 * 10 * 16
    f.mask = torch.zeros(2, 1, 4, 4)  # full attention, read from the mask
    got = derive_attention(f)
    assert got["causal"] is False and got["flops"] == 2 * 2 * 2 * 16 * 16


def test_chunked_pairs_brute_force() -> None:
    """Chunks [shift + c·chunk, ...) with keys held from ``offset`` on, queries the last ones."""
    from attnscope._attention.masks import chunked_pairs

    for sq, skv, chunk, shift, offset in [(10, 10, 4, 0, 0), (10, 10, 4, 3, 0), (10, 10, 4, 5, 0),
                                          (1, 4, 4, 0, 7), (1, 4, 4, 2, 9), (3, 6, 5, 1, 4),
                                          (7, 7, 1, 0, 0), (6, 6, 8, 2, 0)]:
        brute = sum(1 for i in range(sq) for j in range(skv)
                    if j + offset <= i + offset + skv - sq
                    and (j + offset - shift) // chunk == (i + offset + skv - sq - shift) // chunk)
        assert chunked_pairs(sq, skv, chunk, shift, offset) == brute, (sq, skv, chunk, shift)


@pytest.mark.parametrize("dtype", [torch.bool, torch.float32])
def test_left_padding_from_a_layers_mask(dtype: torch.dtype) -> None:
    from attnscope._attention.masks import left_padding

    real = torch.tensor([[1] * 6, [0, 0, 1, 1, 1, 1], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    allowed = torch.ones(6, 6).tril().bool()[None] & real[:, None, :]
    mask = allowed[:, None] if dtype == torch.bool else torch.where(
        allowed, 0.0, torch.finfo(torch.float32).min)[:, None]
    assert left_padding(mask, False, 3) == [0, 2, 6]
    assert left_padding(mask[:1], False, 2) == [0, 0]  # one row broadcast over the batch
    assert left_padding(real.long(), False, 3) is None  # no query axis: not read here
