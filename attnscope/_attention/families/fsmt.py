"""FSMT's time-first attention: its tensors are (seq, batch, width), its cache ``layer_state``,
and its boolean key padding mask is True where a key is padding.

Detector: the layer's module. Extractor tweak: the shapes read time-first and the mask's
polarity flipped (``_instrument.transformers.hidden_state_extractor``); no rule of its own.
"""

from __future__ import annotations

from typing import Any

from .base import Family

__all__ = ["FAMILY", "time_first"]

_MODULES = frozenset({"transformers.models.fsmt.modeling_fsmt"})


def time_first(module: Any) -> bool:
    """Whether ``module``'s attention takes time-first tensors (FSMT's)."""
    return type(module).__module__ in _MODULES


FAMILY = Family("FSMT time-first attention", ("fsmt",), time_first)
