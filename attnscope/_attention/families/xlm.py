"""XLM's and FlauBERT's masked LMs that generate: bidirectional layers over a cache.

Detector: the model's config (``causal=False`` with ``is_encoder=True``), read once by
``instrument()`` for the whole model; its layers then carry the ``bidirectional`` trait (as an
encoder's layers do: ``_instrument.facts.layer_traits``). Rule: a one-query step over the cache
is not called causal (``_derive.call._structure``).
"""

from __future__ import annotations

from typing import Any

from .base import Family

__all__ = ["FAMILY", "bidirectional_model"]


def bidirectional_model(model: Any) -> bool:
    """A model whose config says its layers attend both ways though it generates: XLM's and
    FlauBERT's ``causal=False`` with ``is_encoder=True`` (their layers carry no ``is_decoder``; a
    masked LM run through ``generate`` keeps its bidirectional mask over the cache)."""
    config = getattr(model, "config", None)
    return getattr(config, "causal", None) is False and getattr(config, "is_encoder", None) is True


FAMILY = Family("XLM bidirectional generation", ("xlm",), bidirectional_model)
