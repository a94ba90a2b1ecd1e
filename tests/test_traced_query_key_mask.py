"""A traced function given SDPA's 2-D ``(Sq, Skv)`` mask: read as SDPA reads it, broadcast over
batch and heads, so its FLOPs are exact and its causality and window are named, as for the same
mask given as ``(1, 1, Sq, Skv)``.

The reference is independent of attnscope's reductions: the mask expanded to ``(B, H, Sq, Skv)``
by torch's own broadcasting, its visible pairs summed, and the call's output compared with an
untraced SDPA call.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._record.reduce import query_key_shape
from attnscope.testing import capture_spans

B, H, SQ, D = 2, 4, 8, 16


@attnscope.trace
def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def _visible_pairs(mask: torch.Tensor, shape: tuple[int, int, int, int]) -> int:
    """Pairs SDPA computes a weight for: the mask broadcast to the call's (B, H, Sq, Skv)."""
    visible = mask if mask.dtype == torch.bool else mask > float("-inf")
    return int(visible.expand(shape).sum())


def _causal(sq: int, skv: int) -> torch.Tensor:
    return torch.ones(sq, skv, dtype=torch.bool).tril(skv - sq)


def _cases() -> dict[str, tuple[torch.Tensor, int]]:
    """name: (a 2-D mask over SQ queries, its keys)."""
    causal = _causal(SQ, SQ)
    band = causal & ~torch.ones(SQ, SQ, dtype=torch.bool).tril(-3)
    g = torch.Generator().manual_seed(3)
    scattered = (torch.rand(SQ, SQ, generator=g) < 0.5) | torch.eye(SQ, dtype=torch.bool)
    return {
        "causal": (causal, SQ),
        "band": (band, SQ),
        "additive": (torch.zeros(SQ, SQ).masked_fill(~causal, float("-inf")), SQ),
        "scattered": (scattered, SQ),
        "cross": (_causal(SQ, 12), 12),  # queries over a longer key sequence, bottom-right
    }


def _span_of(mask: torch.Tensor, skv: int) -> tuple[dict[str, Any], torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(B, H, SQ, D, generator=g)
    kv = torch.randn(B, H, skv, D, generator=g)
    attnscope.configure(sample_rate=1.0, warmup_calls=0, overhead_budget=1.0, profile_rate=0.0,
                        metrics=False)
    with capture_spans() as spans:
        out = attend(q, kv, kv, attn_mask=mask)
        assert attnscope.flush(timeout_s=30)
    assert torch.equal(out, F.scaled_dot_product_attention(q, kv, kv, attn_mask=mask))
    assert len(spans) == 1
    return dict(spans[0].attributes or {}), mask


@pytest.mark.parametrize("case", sorted(_cases()))
def test_a_2d_mask_gives_the_pairs_sdpa_computes(case: str) -> None:
    mask, skv = _cases()[case]
    attributes, _ = _span_of(mask, skv)
    pairs = _visible_pairs(mask, (B, H, SQ, skv))
    assert attributes["attnscope.flops"] == 2 * pairs * (D + D)
    assert attributes.get("attnscope.exact") is not False
    if case in ("causal", "band", "additive", "cross"):
        assert attributes["attnscope.causal"] is True
    if case == "band":
        assert attributes["attnscope.sliding_window"] == 3
    else:
        assert "attnscope.sliding_window" not in attributes


def test_a_2d_mask_reads_as_the_same_mask_given_4d() -> None:
    """Every figure the 2-D mask gives, the same mask as (1, 1, Sq, Skv) gives too (the bytes
    moved included: the mask's elements are the same)."""
    mask, skv = _cases()["band"]
    two, _ = _span_of(mask, skv)
    four, _ = _span_of(mask[None, None], skv)
    keys = ("attnscope.flops", "attnscope.causal", "attnscope.sliding_window",
            "attnscope.tokens", "attnscope.bytes")
    assert {k: two.get(k) for k in keys} == {k: four.get(k) for k in keys}
    assert two["attnscope.bytes"] is not None


def test_only_a_mask_that_cannot_be_a_padding_mask_is_read_as_query_by_key() -> None:
    """(Sq, Skv) with Sq neither 1 nor the batch: SDPA's; (B, Skv) or (1, Skv), which a padding
    mask has too, and any other rank: read as before."""
    assert query_key_shape((8, 12), batch=2, sq=8) == (1, 1, 8, 12)
    assert query_key_shape((2, 12), batch=2, sq=8) is None  # (B, Skv): padding
    assert query_key_shape((8, 12), batch=8, sq=8) is None  # B == Sq: either, left as before
    assert query_key_shape((1, 12), batch=2, sq=1) is None  # one query: either
    assert query_key_shape((4, 12), batch=2, sq=8) is None  # neither: not read as a band
    assert query_key_shape((1, 8, 12), batch=2, sq=8) is None
