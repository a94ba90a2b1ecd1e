"""Llama 4's chunked attention: a query sees the keys of its own chunk only.

Detector: the config's ``attention_chunk_size`` on the layers ``config.layer_types`` calls
``"chunked_attention"``. Rule: the mask's pairs counted one by one (a chunk boundary hides older
keys of the same row, so they cannot be read as a band).
"""

from __future__ import annotations

from typing import Any

import torch

from ..flops import attention_flops
from ..masks import chunked_pairs, left_padding
from .base import Family, pos_int

__all__ = ["FAMILY", "chunk_size", "chunked_flops"]


def chunk_size(module: Any) -> int | None:
    """The chunk of a chunked-attention layer (Llama 4's ``attention_chunk_size``): a query sees
    the keys of its own chunk only, chunks counted from each row's first real token. Set on the
    config for the model; ``config.layer_types`` says which layers are chunked (none listed:
    every layer is, as transformers' mask builder reads it)."""
    config = getattr(module, "config", None)
    size = pos_int(getattr(config, "attention_chunk_size", None))
    if size is None:
        return None
    kinds = getattr(config, "layer_types", None)
    layer = getattr(module, "layer_idx", None)
    if isinstance(kinds, (list, tuple)) and kinds:
        if not isinstance(layer, int) or isinstance(layer, bool) or not 0 <= layer < len(kinds):
            return None
        return size if kinds[layer] == "chunked_attention" else None
    return size


def chunked_flops(batch: int, heads: int, sq: int, skv: int, dk: int, dv: int, chunk: int,
                  shown: int, real: int | None, mask: Any, ignores: bool,
                  past: int | None) -> tuple[int, bool]:
    """(FLOPs, exact) of a chunked layer's call whose mask showed ``shown`` pairs.

    With every query real those are the pairs the layer computes: at decode the keys of the
    query's chunk, which left padding never reaches (the chunks start at each row's first real
    token). Padded query rows are computed over the padded chunk layout like any padded position
    (padding does not reduce FLOPs): counted by :func:`..masks.chunked_pairs` from each row's left
    padding, read from a first call's host mask; otherwise (a device mask's counts, padded queries
    over a cache) the figure is the causal count, an upper bound: not exact (``mask_unread``).
    """
    dims = dk + dv
    if real == batch * sq:
        return 2 * shown * dims, True
    rows = (left_padding(mask, ignores, batch)
            if not past and isinstance(mask, torch.Tensor) else None)
    if rows is None:
        return attention_flops(batch, heads, sq, skv, dk, dv, True), False
    pairs = sum(chunked_pairs(sq, skv, chunk, shift) for shift in rows)
    return 2 * heads * pairs * dims, True


FAMILY = Family("Llama 4 chunked attention", ("llama4_text",), chunk_size, "chunk")
