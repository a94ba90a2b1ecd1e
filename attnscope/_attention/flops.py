"""Exact FLOPs of an attention core: the (query, key) pairs a causal or sliding-window mask leaves
visible, queries aligned bottom-right (KV-cache decoding, as in FlashAttention), 2 FLOPs per
multiply-add of QKᵀ and PV."""

from __future__ import annotations

from .masks import pairs_upto

__all__ = ["causal_pairs", "window_pairs", "attention_flops"]


def causal_pairs(sq: int, skv: int) -> int:
    """Unmasked (query, key) pairs of a causal mask aligned bottom-right.

    Query ``i`` (of ``sq``) sees keys ``j <= i + skv - sq``: the layout of KV-cache decoding, as in
    FlashAttention. Rows that would see no key contribute nothing.
    """
    return pairs_upto(sq, skv, 0)


def attention_flops(
    batch: int, heads: int, sq: int, skv: int, head_dim: int, head_dim_v: int | None = None,
    causal: bool = False, window: int | None = None,
) -> int:
    """FLOPs of QKᵀ and PV (2 per multiply-add), counting only the pairs a causal (and
    sliding-window) mask leaves visible."""
    dv = head_dim if head_dim_v is None else head_dim_v
    if causal and window:
        pairs = window_pairs(sq, skv, window)
    elif causal:
        pairs = causal_pairs(sq, skv)
    else:
        pairs = sq * skv
    return 2 * batch * heads * pairs * (head_dim + dv)


def window_pairs(sq: int, skv: int, window: int) -> int:
    """Unmasked pairs of a bottom-right causal mask where a query sees its last ``window`` keys."""
    if window <= 0:
        return 0
    if skv <= window:
        return causal_pairs(sq, skv)
    return causal_pairs(sq, skv) - causal_pairs(sq, skv - window)
