"""What the attention mask a layer received says: real tokens, causality, window, visible pairs.

Runs on the worker, after the call, on the mask the capture kept by reference (a mask over the
keeping budget arrives as a TensorMeta and is not read). Module attributes (``is_causal``,
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

import torch

__all__ = ["MASKED_BELOW", "MaskReading", "attend", "band_pairs", "pairs_upto", "read_mask"]

# A float mask entry at or below this is "masked": covers -inf, finfo.min and the -10000 of
# older models.
MASKED_BELOW = -5000.0


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


def attend(mask: torch.Tensor, ignores: bool) -> torch.Tensor:
    """Boolean "may attend" view of ``mask``.

    Float masks are additive (at or below ``MASKED_BELOW`` = masked), except 2-D padding masks
    (1 = real). ``ignores``: the layer's convention is True/nonzero = masked (MPT,
    ``key_padding_mask``). A boolean mask with a query axis and no stated convention takes its
    polarity from the diagonal, since a query always sees itself in real rows.
    """
    m = mask.detach()
    if m.dtype == torch.bool:
        if ignores:
            return ~m
        return ~m if m.ndim >= 3 and _diagonal_masked(m) else m
    if m.is_floating_point():
        if ignores or m.ndim != 2:
            return (m > MASKED_BELOW) & (m == m)
        return m != 0
    return m == 0 if ignores else m != 0


def _diagonal_masked(m: torch.Tensor) -> bool:
    """Whether most queries' own key is False: then True means masked."""
    sq, skv = m.shape[-2], m.shape[-1]
    if sq <= 1:
        return False
    diag = m.diagonal(offset=skv - sq, dim1=-2, dim2=-1)
    return diag.numel() > 0 and 2 * int(diag.sum()) < diag.numel()


def read_mask(seen: torch.Tensor, batch: int, heads: int, sq: int, skv: int) -> MaskReading | None:
    """Structure and visible pairs of a ``(B|1, H|1, Sq, Skv)`` "may attend" mask, or None when
    its layout does not match the call (a padding mask, ``(B, 1, 1, S)``, has no query axis)."""
    if seen.ndim == 3:
        seen = seen.unsqueeze(1)
    if seen.ndim != 4 or tuple(seen.shape[-2:]) != (sq, skv) or sq < 1:
        return None
    mb, mh = seen.shape[0], seen.shape[1]
    if mb not in (1, batch) or mh not in (1, heads):
        return None
    scale = (batch if mb == 1 else 1) * (heads if mh == 1 else 1)
    exact = int(seen.sum()) * scale
    rows = seen.any(-1) & ~seen.all(-1)  # queries that see some keys but not all
    kept = seen & rows.unsqueeze(-1)
    cols = kept.any(-2)
    hidden = (rows.unsqueeze(-1) & cols.unsqueeze(-2) & ~seen).flatten(0, 1).any(0)
    visible = kept.flatten(0, 1).any(0)
    if not bool(visible.any()):  # every row sees all keys or none: no structure to read
        full = bool(seen.all())
        return MaskReading(False if full and sq > 1 else None, None, exact)
    d = (torch.arange(skv, device=seen.device).unsqueeze(0)
         - torch.arange(sq, device=seen.device).unsqueeze(1) - (skv - sq))
    vd = d[visible]
    vlo, vhi = int(vd.min()), int(vd.max())
    hd = d[hidden]
    if bool(((hd >= vlo) & (hd <= vhi)).any()):  # a real key hidden inside the band: not a band
        return MaskReading(None if vhi <= 0 else False, None, exact)
    hi = vhi if bool((hd > vhi).any()) else None
    lo = vlo if bool((hd < vlo).any()) else None
    causal = False if vhi > 0 else (True if hi is not None else None)
    if causal is None:  # no real query is kept from a later real key, nor shown one: unknown
        return MaskReading(None, None, None)
    window = hi - lo + 1 if hi is not None and lo is not None else None
    return MaskReading(causal, window, batch * heads * band_pairs(sq, skv, lo, hi))

