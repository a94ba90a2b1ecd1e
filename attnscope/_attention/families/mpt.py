"""MPT's attention: its boolean mask is True where a pair is masked (other layers' polarity is
read from the mask's diagonal on the worker).

Detector: the layer's class name. Extractor tweak: the mask's polarity flipped
(``AttentionFacts.mask_ignores``); no rule of its own.
"""

from __future__ import annotations

from typing import Any

from .base import Family

__all__ = ["FAMILY", "masked_where_true"]

_CLASSES = ("MptAttention",)


def masked_where_true(module: Any) -> bool:
    """Whether ``module``'s boolean mask is True where a pair is masked (MPT's)."""
    return type(module).__name__ in _CLASSES


FAMILY = Family("MPT masked-where-true mask", ("mpt",), masked_where_true)
