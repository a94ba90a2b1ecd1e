"""``torch.nn.MultiheadAttention``: shapes, heads, padding and causality of each call."""

from __future__ import annotations

from typing import Any

import torch

from ..capture.record import ATTENTION_KEY, AttentionFacts
from . import Extractor

__all__ = ["is_multihead_attention", "multihead_extractor"]

_NAMES = (
    "query",
    "key",
    "value",
    "key_padding_mask",
    "need_weights",
    "attn_mask",
    "average_attn_weights",
    "is_causal",
)


def is_multihead_attention(module: Any) -> bool:
    return isinstance(module, torch.nn.MultiheadAttention)


def multihead_extractor(module: torch.nn.MultiheadAttention) -> Extractor:
    """Facts of one ``MultiheadAttention`` call: (L, N, E), (N, L, E) or unbatched (L, E) inputs."""
    heads = module.num_heads
    head_dim = module.head_dim
    batch_first = bool(module.batch_first)

    def extract(
        instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> list[tuple[str, Any]]:
        values = dict(zip(_NAMES, args[1:], strict=False))
        values.update(kwargs)
        q, k = values.get("query"), values.get("key")
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
            return []
        if q.ndim == 2:
            batch, sq, skv = 1, q.shape[0], k.shape[0]
        elif batch_first:
            batch, sq, skv = q.shape[0], q.shape[1], k.shape[1]
        else:
            batch, sq, skv = q.shape[1], q.shape[0], k.shape[0]
        facts = AttentionFacts(batch, sq)
        facts.heads = facts.kv_heads = heads
        facts.head_dim = facts.head_dim_v = head_dim  # q, k and v are all projected to embed_dim
        facts.causal = values.get("is_causal") is True
        facts.dtype, facts.device = q.dtype, q.device
        if sq != skv:
            facts.seq_kv = skv  # cross-attention: key padding says nothing about the queries
        else:
            facts.mask = values.get("key_padding_mask")
            facts.mask_ignores = True  # True / -inf marks padding here
        return [(ATTENTION_KEY, facts)]

    return extract
