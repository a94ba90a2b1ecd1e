"""Funnel's attention: ``(query, key, value, attention_inputs)`` hidden states, the query pooled
below its keys in the first layer of a block, the padding mask third of ``attention_inputs``.

Detector: the layer's module. Extractor: :func:`pooled_facts` (a pooled query attends to every
key, as cross-attention does: all ``Sq x Skv`` pairs, its tokens the pooled queries); no rule of
its own on the worker.
"""

from __future__ import annotations

from typing import Any

import torch

from ..._record.facts import AttentionFacts, Facts
from .base import Family

__all__ = ["FAMILY", "pooled_query", "pooled_facts"]

_MODULES = frozenset({"transformers.models.funnel.modeling_funnel"})


def pooled_query(module: Any) -> bool:
    """Whether ``module`` is Funnel's attention (its forward takes a pooled query)."""
    return type(module).__module__ in _MODULES


def pooled_facts(query: Any, key: Any, inputs: Any,
                 dims: tuple[int | None, int | None, int | None, int | None]) -> Facts | None:
    """One call's facts from its query, key and ``attention_inputs`` (``dims``: the layer's
    heads, kv heads, q/k and v head sizes): a query pooled below its keys attends to every key
    (its FLOPs all ``Sq x Skv`` pairs, its tokens the pooled queries: the padding mask is the
    keys'); other layers' queries are their keys, whose padding mask gives the tokens. None: not
    such a call. On the calling thread."""
    if not isinstance(query, torch.Tensor) or query.ndim != 3 or not isinstance(
            key, torch.Tensor) or key.ndim != 3:
        return None
    facts = AttentionFacts(query.shape[0], query.shape[1])
    facts.heads, facts.kv_heads, facts.head_dim, facts.head_dim_v = dims
    facts.dtype, facts.device = query.dtype, query.device
    if key.shape[1] != query.shape[1]:
        facts.seq_kv = key.shape[1]
    elif isinstance(inputs, (tuple, list)) and len(inputs) > 2 and isinstance(
            inputs[2], torch.Tensor):
        facts.mask = inputs[2]  # (batch, keys), 1 = real
    return Facts(facts)


FAMILY = Family("Funnel pooled queries", ("funnel",), pooled_query)
