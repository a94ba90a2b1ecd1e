"""``torch.nn.MultiheadAttention``: shapes, heads, padding and causality of each call; and
``nn.TransformerEncoderLayer``'s fused inference path, which never calls its attention module."""

from __future__ import annotations

from typing import Any

import torch

from .. import _schema as schema
from .._record.facts import AttentionFacts, Facts
from . import Extractor

__all__ = [
    "FUSED_ATTRIBUTES",
    "encoder_layer_extractor",
    "is_multihead_attention",
    "may_take_fast_path",
    "multihead_extractor",
    "takes_fast_path",
]

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

    def extract(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Facts | None:
        values = dict(zip(_NAMES, args[1:], strict=False))
        values.update(kwargs)
        q, k = values.get("query"), values.get("key")
        if not isinstance(q, torch.Tensor) or not isinstance(k, torch.Tensor):
            return None
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
        return Facts(facts)

    return extract


# ---- nn.TransformerEncoderLayer's fused inference path -------------------------------------------

# On a fused call one kernel runs attention, both layer norms and the feed-forward.
FUSED_ATTRIBUTES = {schema.FUSED.name: "attention+feed_forward"}
_LAYER_NAMES = ("self", "src", "src_mask", "src_key_padding_mask", "is_causal")
_DEVICES = ("cpu", "cuda", "xpu")


def may_take_fast_path(module: Any) -> bool:
    """An encoder layer that can take the fused path at all (its attention is ``batch_first``);
    the rest of torch's conditions are checked per call by :func:`takes_fast_path`."""
    attn = getattr(module, "self_attn", None)
    return (isinstance(module, torch.nn.TransformerEncoderLayer)
            and isinstance(attn, torch.nn.MultiheadAttention) and attn.batch_first is True)


def _layer_args(args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    values = dict(zip(_LAYER_NAMES[1:], args[1:], strict=False))
    values.update(kwargs)
    return values


def takes_fast_path(layer: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """Whether ``TransformerEncoderLayer.forward(*args[1:], **kwargs)`` will skip
    ``self_attn.forward`` for ``torch._transformer_encoder_layer_fwd``: torch's own conditions
    (torch/nn/modules/transformer.py), cheapest first. Never raises (False: the slow path,
    where the attention module's own span is recorded)."""
    try:
        if layer.training or not torch.backends.mha.get_fastpath_enabled():
            return False
        values = _layer_args(args, kwargs)
        src, attn = values.get("src"), layer.self_attn
        if not isinstance(src, torch.Tensor) or src.dim() != 3:
            return False
        if src.is_nested and (values.get("src_mask") is not None
                              or values.get("src_key_padding_mask") is not None):
            return False
        if (not attn.batch_first or attn.in_proj_bias is None or not attn._qkv_same_embed_dim
                or not layer.activation_relu_or_gelu or layer.norm1.eps != layer.norm2.eps
                or attn.num_heads % 2 == 1 or torch.is_autocast_enabled()):
            return False
        if any(m._forward_hooks or m._forward_pre_hooks for m in layer.modules()):
            return False
        tensors = (src, attn.in_proj_weight, attn.in_proj_bias, attn.out_proj.weight,
                   attn.out_proj.bias, layer.norm1.weight, layer.norm1.bias, layer.norm2.weight,
                   layer.norm2.bias, layer.linear1.weight, layer.linear1.bias,
                   layer.linear2.weight, layer.linear2.bias)
        if torch.overrides.has_torch_function(tensors):
            return False
        devices = (*_DEVICES, torch.utils.backend_registration._privateuse1_backend_name)
        if not all(t.device.type in devices for t in tensors):
            return False
        return not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))
    except Exception:
        return False


def encoder_layer_extractor(layer: Any) -> Extractor:
    """Facts of a fused encoder-layer call: those its attention would have reported.

    A nested-tensor input (``nn.TransformerEncoder`` packs a padded batch that way) counts as
    the padded batch: ``seq_q`` is the longest sequence, the others are padding.
    """
    attention = multihead_extractor(layer.self_attn)

    def extract(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Facts | None:
        values = _layer_args(args, kwargs)
        src = values.get("src")
        if not isinstance(src, torch.Tensor):
            return None
        padding = values.get("src_key_padding_mask")
        if src.is_nested:
            lengths = src._nested_tensor_size()[:, 0]
            width = src._nested_tensor_size()[0, -1]
            src = torch.empty((len(lengths), int(lengths.max()), int(width)), device="meta",
                              dtype=src.dtype)
            padding = torch.arange(src.shape[1]) >= lengths[:, None]  # True = padding
        facts = attention(instance.self_attn, (instance.self_attn, src, src, src),
                          {"key_padding_mask": padding, "is_causal": values.get("is_causal")})
        if facts is not None and facts.attention is not None:
            facts.attention.device = values["src"].device
        return facts

    return extract
