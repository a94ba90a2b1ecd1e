"""ModernBERT's local layers before transformers 5 (4.48 to 4.57 checked): a two-sided band.

The layer says ``local_attention = (left, right)``; the model hands its band as
``sliding_window_mask`` beside the global ``attention_mask``. Detector: :func:`two_sided_local`.
Extractor tweak: such a layer's mask is :data:`LOCAL_MASK` first (:func:`mask_names`); the
worker reads the band's window from it as from any mask (``_attention.masks``). No trait, no
rule of its own.
"""

from __future__ import annotations

from typing import Any

from .base import Family

__all__ = ["FAMILY", "LOCAL_MASK", "mask_names", "two_sided_local"]

LOCAL_MASK = "sliding_window_mask"


def two_sided_local(module: Any) -> bool:
    """Whether ``module`` is a two-sided local layer: ``local_attention = (left, right)``, not
    ``(-1, -1)`` (a global layer's)."""
    pair = vars(module).get("local_attention")
    return isinstance(pair, tuple) and len(pair) == 2 and pair != (-1, -1)


def mask_names(module: Any, names: tuple[str, ...]) -> tuple[str, ...]:
    """The argument names ``module``'s mask is read from: its band's first for a two-sided local
    layer, else ``names``. Once, when instrumenting."""
    return (LOCAL_MASK, *names) if two_sided_local(module) else names


FAMILY = Family("ModernBERT two-sided local layers", ("modernbert",), two_sided_local)
