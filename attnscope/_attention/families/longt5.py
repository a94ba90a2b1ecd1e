"""LongT5's blocked local attention (``LocalAttention``, ``TransientGlobalAttention``).

Detector: ``block_len == local_radius + 1`` on the layer (plus ``global_block_size`` for the
transient-global one). Rule: the two-sided band's pairs plus every query's global keys.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..masks import band_pairs, blocked_tokens
from .base import Family, pos_int

__all__ = ["FAMILY", "Banded", "blocked_band", "banded"]


def blocked_band(module: Any) -> tuple[int, int] | None:
    """(radius, global block size) of a layer that splits its sequence into blocks of
    ``block_len = local_radius + 1`` and lets each query see the keys within ``local_radius`` of
    it (LongT5's ``LocalAttention``), plus one summary key per ``global_block_size`` tokens
    (``TransientGlobalAttention``; 0: none). Read once, when instrumenting."""
    radius = getattr(module, "local_radius", None)
    block = pos_int(getattr(module, "block_len", None))
    if not isinstance(radius, int) or isinstance(radius, bool) or radius < 0 or block != radius + 1:
        return None
    return radius, pos_int(getattr(module, "global_block_size", None)) or 0


class Banded(NamedTuple):
    """What a blocked layer's call computes: its FLOPs, its window (both sides and itself), and
    its real tokens when a blocked host mask says them (None: left to the usual reading)."""

    flops: int
    window: int
    tokens: int | None


def banded(batch: int, heads: int, sq: int, skv: int, dk: int, dv: int, band: tuple[int, int],
           mask: Any, ignores: bool) -> Banded:
    """A layer that splits its sequence into blocks and lets each query see the keys within
    ``radius`` of it, plus one summary key per ``globals`` tokens (LongT5's local and
    transient-global encoder attention): the two-sided band's pairs plus every query's global
    keys (padding does not reduce FLOPs; the rows that pad the last block are not queries). The
    tokens come from a blocked host mask (a local layer's); a transient-global layer's padding
    mask is left to the usual reading, a blocked mask on a device to its mark."""
    radius, globals_every = band
    keys = band_pairs(sq, skv, -radius, radius)
    if globals_every:
        keys += sq * (skv // globals_every)
    tokens = blocked_tokens(mask, ignores, batch) if isinstance(mask, torch.Tensor) else None
    return Banded(2 * batch * heads * keys * (dk + dv), 2 * radius + 1, tokens)


FAMILY = Family("LongT5 blocked local attention", ("longt5",), blocked_band, "band")
