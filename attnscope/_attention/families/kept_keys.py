"""Layers that keep some of the keys their mask allows, by the keys' values: Doge's dynamic mask
(its top ``keep_window_size``), Qwen4-exp's indexer (the top blocks of a token budget).

Detector: :func:`key_selection` (how many keys, in blocks of how many: not value-dependent),
copied into each call's facts (``AttentionFacts.key_cap``/``key_block``) by the extractor. Rule:
:func:`capped_pairs`, applied on the worker where it is exact (``_derive.beyond_mask.cap_keys``;
elsewhere the FLOPs are an upper bound, marked ``layer_narrows``).
"""

from __future__ import annotations

from typing import Any

from .base import Family, pos_int

__all__ = ["FAMILY", "key_selection", "capped_pairs"]


def key_selection(module: Any) -> tuple[int | None, int]:
    """(keys kept per query at most, the block they are kept in) of a layer that keeps some of
    the keys its mask allows by their values: Doge's dynamic mask keeps its top
    ``keep_window_size``; Qwen4-exp's indexer the top ``block_topk`` blocks of ``compress_ratio``
    visible keys, and the ones past the last whole block. How many does not depend on values.
    (None, 1): a layer that keeps every key its mask allows. Read once, when instrumenting."""
    cap = pos_int(vars(module).get("keep_window_size"))
    if cap is not None:
        return cap, 1
    indexer = getattr(module, "_modules", {}).get("indexer")
    blocks = pos_int(getattr(indexer, "block_topk", None))
    block = pos_int(getattr(indexer, "compress_ratio", None))
    if blocks is None or block is None or pos_int(getattr(indexer, "token_budget", None)) is None:
        return None, 1
    return blocks * block, block


def _kept(v: int, cap: int, block: int) -> int:
    """Keys kept of ``v`` visible: all while their whole blocks fit in ``cap``, else ``cap`` and
    the ones past the last whole block."""
    return v if v // block * block <= cap else cap + v % block


def _kept_upto(n: int, cap: int, block: int) -> int:
    """``sum(_kept(v) for v in range(n + 1))``, in closed form."""
    fits = min(n, cap + block - 1)  # v up to here keep every key
    total = fits * (fits + 1) // 2
    if n <= fits:
        return total
    def mods(m: int) -> int:  # sum of v % block for v = 0 .. m - 1
        q, r = divmod(m, block)
        return q * block * (block - 1) // 2 + r * (r - 1) // 2
    return total + (n - fits) * cap + mods(n + 1) - mods(fits + 1)


def capped_pairs(sq: int, skv: int, cap: int, causal: bool, block: int = 1) -> int:
    """Pairs of one (batch, head) when each query keeps at most ``cap`` of the keys it may see,
    in blocks of ``block`` (:func:`_kept`; queries aligned bottom-right: query ``q`` of a causal
    call sees ``skv - sq + q + 1`` keys)."""
    if not causal:
        return sq * _kept(skv, cap, block)
    return _kept_upto(skv, cap, block) - _kept_upto(skv - sq, cap, block)


def _keeps_keys(module: Any) -> bool:
    return key_selection(module)[0] is not None


FAMILY = Family("keys kept by value (Doge, Qwen4-exp)", ("doge", "qwen4_exp_text"), _keeps_keys)
