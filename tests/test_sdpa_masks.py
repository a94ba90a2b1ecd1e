"""A traced function's or SDPA call's mask decides causality, window and pairs (issue 12's general
fix, on the @trace / instrument_sdpa() path), checked against pairs counted here from shapes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope.testing import capture_spans


def _band(sq: int, skv: int, window: int | None = None) -> torch.Tensor:
    """Bottom-right causal "may attend" matrix, optionally a sliding window of ``window`` keys."""
    d = torch.arange(skv).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - (skv - sq)
    keep = d <= 0
    return keep & (d > -window) if window else keep


def _pairs(keep: torch.Tensor) -> int:
    return sum(1 for i in range(keep.shape[0]) for j in range(keep.shape[1]) if bool(keep[i, j]))


@attnscope.trace
def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("additive", [False, True])
def test_a_causal_mask_given_to_a_traced_function_counts_the_causal_pairs(
        window: int | None, additive: bool) -> None:
    b, h, sq, skv, d = 2, 4, 6, 9, 8
    keep = _band(sq, skv, window)
    mask: Any = keep.expand(b, 1, sq, skv)
    if additive:
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    q, k = torch.randn(b, h, sq, d), torch.randn(b, h, skv, d)
    with capture_spans() as spans, attnscope.sampling():
        masked(q, k, k, attn_mask=mask)
    a = spans[0].attributes
    assert a["attnscope.causal"] is True
    assert a["attnscope.flops"] == 2 * b * h * _pairs(keep) * (d + d)
    assert a.get("attnscope.sliding_window") == window
    assert a["attnscope.tokens"] == b * sq


@attnscope.trace
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
         attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal, attn_mask=attn_mask)


def test_without_a_mask_the_is_causal_argument_still_decides() -> None:
    q = torch.randn(1, 2, 5, 8)
    with capture_spans() as spans, attnscope.sampling():
        sdpa(q, q, q, is_causal=True)
        sdpa(q, q, q, attn_mask=torch.ones(1, 1, 5, 5, dtype=torch.bool))
    causal, full = sorted(spans, key=lambda s: s.start_time)
    assert causal.attributes["attnscope.causal"] is True
    assert causal.attributes["attnscope.flops"] == 2 * 2 * _pairs(_band(5, 5)) * 16
    assert full.attributes["attnscope.causal"] is False  # the mask shows every pair visible
    assert full.attributes["attnscope.flops"] == 2 * 2 * 25 * 16


def test_instrument_sdpa_on_a_padded_llama_batch_counts_causal_pairs() -> None:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=2, num_hidden_layers=2,
        intermediate_size=64, vocab_size=64, attn_implementation="sdpa", pad_token_id=0)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    ids = torch.tensor([[0, 0, 5, 6, 7, 8], [3, 4, 5, 6, 7, 8]])
    attention_mask = (ids != 0).long()
    attnscope.instrument_sdpa()
    try:
        with capture_spans() as spans, attnscope.sampling(), torch.no_grad():
            model(ids, attention_mask=attention_mask)
    finally:
        attnscope.uninstrument_sdpa()
    assert len(spans) == 2
    head_dim = 32 // 4
    for s in spans:
        a = s.attributes
        assert a["attnscope.causal"] is True, a
        # padding does not reduce FLOPs (kernels compute padded positions): the causal band
        assert a["attnscope.flops"] == 2 * 2 * 4 * _pairs(_band(6, 6)) * (head_dim * 2)
        assert a["attnscope.tokens"] == 4 + 6


def test_a_slice_of_a_causal_buffer_over_the_keeping_budget_is_counted() -> None:
    # nanoGPT's pattern: one (1, 1, max, max) causal buffer, each call a slice of it; at 8192
    # positions the buffer (64 MiB) is over the keeping budget, which a slice keeps alive
    from attnscope._capture.retain import KEEP_TENSOR_BYTES

    side = 8192
    buffer = torch.tril(torch.ones(side, side, dtype=torch.bool)).view(1, 1, side, side)
    assert buffer.numel() > KEEP_TENSOR_BYTES
    b, h, s, d = 1, 2, 48, 16
    q = torch.randn(b, h, s, d)
    with capture_spans() as spans:
        masked(q, q, q, attn_mask=buffer[:, :, :s, :s])
    (a,) = [sp.attributes for sp in spans]
    assert "attnscope.inexact_reason" not in a
    assert a["attnscope.causal"] is True and a["attnscope.tokens"] == b * s
    assert a["attnscope.flops"] == 2 * b * h * _pairs(_band(s, s)) * 2 * d
