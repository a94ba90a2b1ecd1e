"""CLIP's text layers before transformers 5 (4.57 checked): causality as a mask of its own.

Their forward takes ``causal_attention_mask`` beside ``attention_mask`` (both additive; the
layer adds them). Detector: :func:`causal_mask_apart` (the forward names it). Extractor tweak
(``_instrument.transformers.hidden_state_extractor``): :data:`CAUSAL_MASK` is read with every
call, whatever the detector says (a layer handed one in ``**kwargs`` is read as before); one
given makes the call causal and is its mask when no other is given, else the other mask holds
padding only and the layer applies causality apart (``AttentionFacts.causal_apart``). FSMT's
``attn_mask`` is read the same way (:mod:`.fsmt`). No trait, no rule of its own on the worker.
"""

from __future__ import annotations

from typing import Any

from .base import Family, forward_names

__all__ = ["CAUSAL_MASK", "FAMILY", "causal_mask_apart"]

CAUSAL_MASK = ("causal_attention_mask",)


def causal_mask_apart(module: Any) -> bool:
    """Whether ``module``'s forward takes a causal mask of its own (``causal_attention_mask``)."""
    return any(name in forward_names(module) for name in CAUSAL_MASK)


FAMILY = Family("CLIP causal mask apart", ("clip",), causal_mask_apart)
