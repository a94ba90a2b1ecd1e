"""What the attention mask a call received says (causality, window, visible pairs), and the
exact pair counts of a band of key offsets.

The mask is reduced to a few counts by ``capture.reduce`` (on the call's stream for CUDA, on the
worker for CPU) and read by :mod:`.maskread`. Module attributes (``is_causal``,
``sliding_window``) are a fallback for layers that get no mask: where a model builds one, the mask
is what the kernel applied, so it decides.

The structure is read as a band of key offsets: with ``d = j - i - (Skv - Sq)`` (bottom-right
alignment, as in KV-cache decoding), a causal mask shows queries keys with ``d <= 0``, a causal
sliding window ``-w < d <= 0`` and a two-sided window ``|d| <= w``. Padding is told apart from
structure: a masked pair counts as structure only when its query sees some key and its key is seen
by some query (of the same batch row and head), so padding does not change FLOPs (kernels compute
padded positions too) while a window or causality shows wherever a real query is kept from a real
key. Rows that see every key carry no structure and are left out (older transformers un-mask
padded query rows that way). A mask that is not a band (document or block masks) is counted pair
by pair.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["MaskReading", "band_pairs", "pairs_upto"]


class MaskReading(NamedTuple):
    """What a mask says about one call. ``None`` fields: the mask does not tell."""

    causal: bool | None
    window: int | None  # keys one query may see at most (band width), when bounded on both sides
    pairs: int | None  # visible (query, key) pairs summed over batch and query heads


def pairs_upto(sq: int, skv: int, t: int) -> int:
    """(query, key) pairs with ``j - i - (skv - sq) <= t`` in an ``sq`` x ``skv`` matrix."""
    if sq <= 0 or skv <= 0:
        return 0
    offset = skv - sq + t
    # row i sees min(skv, max(0, i + offset + 1)) keys; split rows into empty / growing / full.
    first = max(0, -offset)  # first row that sees at least one key
    if first >= sq:
        return 0
    full_from = max(first, min(sq, skv - offset - 1))  # rows from here see all skv keys
    growing = full_from - first
    lo = first + offset + 1
    hi = full_from + offset
    total = (lo + hi) * growing // 2 if growing > 0 else 0
    return total + (sq - full_from) * skv


def band_pairs(sq: int, skv: int, lo: int | None, hi: int | None) -> int:
    """Pairs whose offset ``d`` lies in ``[lo, hi]`` (None: unbounded on that side)."""
    top = pairs_upto(sq, skv, hi) if hi is not None else sq * skv
    return top - (pairs_upto(sq, skv, lo - 1) if lo is not None else 0)
