"""A mask's counts (``capture.reduce.FIELDS``) turned into tokens, causality, window and pairs.

The counts come from the same reductions on both devices: on CUDA the call's stream computed them
and copied them to pinned memory (a :class:`HostCopy`); on CPU the worker computes them here from
the mask the capture kept. Either way this side only does integer arithmetic on a few numbers.
"""

from __future__ import annotations

from typing import Any

import torch

from ..capture.record import HostCopy
from ..capture.reduce import FIELDS, MaskPlan, mask_numbers, plan_mask
from .masks import MaskReading, band_pairs

__all__ = ["MaskCounts", "counts_of", "read_counts", "positions_tokens"]


class MaskCounts:
    """A mask's counts for one call, with the plan they were computed for."""

    __slots__ = ("values", "plan")

    def __init__(self, values: list[int], plan: MaskPlan) -> None:
        self.values = dict(zip(FIELDS, values, strict=True))
        self.plan = plan


def counts_of(mask: Any, ignores: bool, batch: int, heads: int | None, sq: int,
              skv: int | None, device_reads: bool = True) -> MaskCounts | None:
    """The counts of a kept mask (a CPU tensor: computed here) or of a :class:`HostCopy`; None
    when there are none to read (a mask over the budget, a device tensor, a timed-out copy)."""
    if isinstance(mask, HostCopy):
        if mask.kind != "mask" or not device_reads:
            return None
        return MaskCounts(mask.read(), mask.plan)
    if (not isinstance(mask, torch.Tensor) or mask.is_cuda or mask.is_meta or mask.numel() == 0
            or mask.ndim < 2):
        return None
    plan = plan_mask(tuple(mask.shape), batch, heads, sq, skv)
    return MaskCounts(mask_numbers(mask, ignores, plan, sq, skv).tolist(), plan)


def read_counts(counts: MaskCounts, batch: int, heads: int | None, sq: int,
                skv: int | None) -> tuple[MaskReading | None, int | None]:
    """(what the mask's structure says, real query tokens): see ``capture.reduce``. No structure
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
