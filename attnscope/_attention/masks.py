"""What the attention mask a call received says (tokens, causality, window, visible pairs), read
from its counts, and the exact pair counts of a band of key offsets.

The mask is reduced to a few counts (``record.reduce.FIELDS``) by the same reductions on the
worker for both devices: on CPU from the mask the capture kept, on CUDA from the copy of it that
the call's stream wrote to pinned memory (a :class:`HostCopy`, its counts computed when first
read). Reading them is then integer arithmetic on a few numbers. Module attributes (``is_causal``,
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

from collections.abc import Callable
from typing import Any, NamedTuple

import torch

from .._record.facts import HostCopy, HostKind
from .._record.reduce import FIELDS, MASKED_BELOW, MaskPlan, attend, mask_numbers, plan_mask

__all__ = ["MaskReading", "MaskCounts", "band_pairs", "pairs_upto", "counts_of", "read_counts",
           "positions_tokens", "blocked_tokens", "chunked_pairs", "left_padding", "shown_pairs"]


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


class MaskCounts:
    """A mask's counts for one call, with the plan they were computed for."""

    __slots__ = ("values", "plan")

    def __init__(self, values: list[int], plan: MaskPlan) -> None:
        self.values = dict(zip(FIELDS, values, strict=True))
        self.plan = plan


def counts_of(mask: Any, ignores: bool, batch: int, heads: int | None, sq: int,
              skv: int | None, device_reads: bool = True,
              count: Callable[..., torch.Tensor] = mask_numbers) -> MaskCounts | None:
    """The counts of a kept mask (a CPU tensor) or of a :class:`HostCopy` (a CUDA mask's copy),
    computed here by ``count`` (the worker's: ``runtime.masks.numbers``, which reuses an equal
    mask's); None when there are none to read (a mask over the budget, a device tensor, a
    timed-out copy)."""
    if isinstance(mask, HostCopy):
        if mask.kind is not HostKind.MASK or not device_reads:
            return None
        return MaskCounts(mask.read(), mask.plan)
    if (not isinstance(mask, torch.Tensor) or mask.is_cuda or mask.is_meta or mask.numel() == 0
            or mask.ndim < 2):
        return None
    plan = plan_mask(tuple(mask.shape), batch, heads, sq, skv)
    return MaskCounts(count(mask, ignores, plan, sq, skv).tolist(), plan)


def read_counts(counts: MaskCounts, batch: int, heads: int | None, sq: int,
                skv: int | None) -> tuple[MaskReading | None, int | None]:
    """(what the mask's structure says, real query tokens): see ``record.reduce``. No structure
    without the head count or the keys (a cache length that could not be read)."""
    n, plan = counts.values, counts.plan
    tokens = None if plan.token_scale is None else n["tokens"] * plan.token_scale
    if not plan.structure or heads is None or skv is None:
        return None, tokens
    exact = n["pairs"] * plan.pair_scale
    if not n["visible_any"]:  # every row sees all keys or none: no structure to read
        return MaskReading(False if n["full"] and sq > 1 else None, None, exact), tokens
    vlo, vhi = n["vlo"], n["vhi"]
    if n["inside"]:  # a real key hidden inside the band: not a band, counted pair by pair
        return MaskReading(None if vhi <= 0 else False, None, exact), tokens
    hi = vhi if n["above"] else None
    lo = vlo if n["below"] else None
    causal = False if vhi > 0 else (True if hi is not None else None)
    if causal is None:  # no real query is kept from a later real key, nor shown one: unknown
        return MaskReading(None, None, None), tokens
    window = hi - lo + 1 if hi is not None and lo is not None else None
    return MaskReading(causal, window, batch * heads * band_pairs(sq, skv, lo, hi)), tokens


def positions_tokens(copy: HostCopy, batch: int, sq: int) -> int | None:
    """Real query tokens from per-position counts (the last ``sq`` key positions)."""
    shape: tuple[int, ...] = copy.plan
    if shape[0] not in (1, batch):
        return None
    values = copy.read()
    count = sum(values[-sq:]) if sq > 0 else 0
    return count * batch if shape[0] == 1 and batch > 1 else count


def shown_pairs(counts: MaskCounts) -> int | None:
    """The (query, key) pairs the mask shows, summed over batch and heads (padding hidden too);
    None without a query axis to count them on."""
    if not counts.plan.structure:
        return None
    return counts.values["pairs"] * counts.plan.pair_scale


def chunked_pairs(sq: int, skv: int, chunk: int, shift: int, offset: int = 0) -> int:
    """Causal pairs of one (batch row, head) of chunked attention: a query sees the keys of its
    own chunk up to itself, chunks ``[shift + c·chunk, shift + (c + 1)·chunk)`` (transformers'
    ``chunked_overlay``: ``shift`` is the row's left padding, so the positions before the first
    real token form chunks of their own). The ``skv`` keys sit at positions ``offset`` on (a
    sliding cache holds the last ones), the ``sq`` queries are the last of them. O(sq / chunk)."""
    if sq <= 0 or skv <= 0 or chunk <= 0:
        return 0
    first, last = offset + skv - sq, offset + skv - 1  # the queries' positions
    total = 0
    for c in range((first - shift) // chunk, (last - shift) // chunk + 1):
        start = c * chunk + shift
        lo, hi = max(first, start), min(last, start + chunk - 1)
        base = max(offset, start)  # the chunk's first key held
        if hi >= lo:
            total += (lo - base + 1 + hi - base + 1) * (hi - lo + 1) // 2
    return total


def left_padding(mask: torch.Tensor, ignores: bool, batch: int) -> list[int] | None:
    """Padding positions before each row's first real key, read from a host mask with a query
    axis (a key is real when some query of its row sees it); None for a mask of another layout
    or batch. Reads the mask's values: the worker's, for a CPU tensor only."""
    if mask.is_cuda or mask.is_meta or mask.ndim not in (3, 4) or mask.shape[0] not in (1, batch):
        return None
    seen = attend(mask, ignores)
    real = seen.reshape(seen.shape[0], -1, seen.shape[-1]).any(1)  # (rows, keys)
    keys = real.shape[-1]
    first = torch.where(real.any(-1), real.to(torch.uint8).argmax(-1), keys).tolist()
    return first * batch if len(first) == 1 and batch > 1 else first


def blocked_tokens(mask: torch.Tensor, ignores: bool, batch: int) -> int | None:
    """Real queries of a blocked local mask ``(batch, 1, blocks, block, 3 · block)`` (LongT5's:
    True = attend): a query is real when it sees a key; the rows that pad the last block see
    none. Reads the mask's values: the worker's, for a CPU tensor only; None for another
    layout."""
    if mask.is_cuda or mask.is_meta or mask.ndim != 5 or mask.shape[0] not in (1, batch):
        return None
    m = mask.detach()
    if m.dtype == torch.bool:
        seen = ~m if ignores else m
    elif m.is_floating_point():
        seen = (m > MASKED_BELOW) & (m == m)
    else:
        seen = m == 0 if ignores else m != 0
    rows = int(seen.any(-1).any(1).sum())
    return rows * batch if mask.shape[0] == 1 else rows
