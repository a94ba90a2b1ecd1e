"""Facts about an attention module that every integration reads the same way: its head counts.

Read once, when instrumenting (and by the worker for ``@trace``'d forwards): the module first,
then its ``config``, under the attribute names used across model families.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from .._attention.families import detected_traits
from .._attention.families.base import pos_int
from .._record.facts import LayerTraits

__all__ = ["LayerTraits", "head_info", "layer_traits", "pos_int"]

_K_PROJ = ("k_proj", "key", "k", "wk", "to_k", "k_lin", "key_proj")
_HEADS = ("num_heads", "num_attention_heads", "n_heads", "n_head", "num_q_heads")
_KV_HEADS = (
    "num_key_value_heads",
    "num_kv_heads",
    "n_kv_heads",
    "n_head_kv",
    "multi_query_group_num",
)
_HEAD_DIM = (
    "qk_head_dim",
    "head_dim",
    "attention_head_size",
    "key_value_proj_dim",
    "head_size",
    "d_kv",
    "kv_channels",
    "d_head",  # Funnel's config (d_model is not heads x d_head there)
)
_FUSED_QKV = ("qkv", "qkv_proj", "Wqkv", "c_attn", "in_proj")
_WIDTH = ("embed_dim", "hidden_size", "d_model", "n_embd", "all_head_size", "inner_dim")


def _first_int(owners: Iterable[Any], names: Iterable[str]) -> int | None:
    for owner in owners:
        if owner is None:
            continue
        for name in names:
            try:
                value = pos_int(getattr(owner, name, None))
            except Exception:
                value = None
            if value is not None:
                return value
    return None


def head_info(module: Any) -> tuple[int | None, int | None, int | None, int | None]:
    """(query heads, kv heads, q/k head size, v head size): the module first, then its config."""
    config = getattr(module, "config", None)
    owners = (module, config)
    heads = _first_int(owners, _HEADS)
    head_dim = _first_int(owners, _HEAD_DIM)
    if heads and not head_dim:
        width = _first_int(owners, _WIDTH)
        if width and width % heads == 0:
            head_dim = width // heads
    kv_heads = _first_int(owners, _KV_HEADS)
    if heads and not head_dim and kv_heads in (None, heads):
        # nothing but a fused projection says the width (TimeSformer's qkv): q, k and v of
        # equal width, so a third of its outputs per head; a model with fewer kv heads names them
        for name in _FUSED_QKV:
            out = pos_int(getattr(getattr(module, name, None), "out_features", None))
            if out and out % (3 * heads) == 0:
                head_dim = out // (3 * heads)
                break
    if kv_heads is None and heads:
        groups = pos_int(getattr(module, "num_key_value_groups", None))
        if groups and heads % groups == 0:
            kv_heads = heads // groups
        elif getattr(config, "multi_query", False) is True:
            kv_heads = 1
    if kv_heads is None and head_dim:
        for name in _K_PROJ:  # a key projection's width is kv_heads * head_dim
            out = pos_int(getattr(getattr(module, name, None), "out_features", None))
            if out and out % head_dim == 0 and heads and heads % (out // head_dim) == 0:
                kv_heads = out // head_dim
                break
    head_dim_v = _first_int(owners, ("v_head_dim",)) or head_dim
    return heads, kv_heads or heads, head_dim, head_dim_v


def layer_traits(module: Any, bidirectional: bool = False) -> LayerTraits | None:
    """The module's :class:`LayerTraits`, or None when it has none (most layers).
    ``bidirectional``: its model says its layers attend both ways
    (:func:`.._attention.families.xlm.bidirectional_model`)."""
    encoder = getattr(module, "is_decoder", None) is False
    # each family's trait from its detector (_attention.families), the rest from here
    traits = LayerTraits(bidirectional=bidirectional or encoder, **detected_traits(module))
    return traits if traits != LayerTraits() else None
