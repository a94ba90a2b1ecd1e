"""HRM's recurrent passes: the layers run several times per forward, each pass a cache slot of its
own (HRM's H/L cycles; Dory's and Inkling 2's loops alike).

The call gives the pass's offset (``cycle_offset``, ``cache_offset``); the slot is the layer's
index plus it. Detector: :func:`offset_per_call`. Extractor tweak: :func:`offset_slot`
(``_instrument.transformers._cache_slot``). No trait, no rule of its own on the worker.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from .base import Family, forward_names, index_of, layer_index

__all__ = ["FAMILY", "OFFSETS", "offset_per_call", "offset_slot"]

OFFSETS = ("cycle_offset", "cache_offset")


def offset_per_call(layer_idx: int | None, names: Container[str]) -> bool:
    """Whether a layer of index ``layer_idx`` whose forward takes ``names`` is given a cache-slot
    offset with each call."""
    return layer_idx is not None and any(name in names for name in OFFSETS)


def offset_slot(idx: int | None, offset: Any) -> int | None:
    """The cache slot ``idx`` moved by a call's ``offset`` (not an index: not moved)."""
    return None if idx is None else idx + (index_of(offset) or 0)


def _recurrent(module: Any) -> bool:
    return offset_per_call(layer_index(module), forward_names(module))


FAMILY = Family("HRM recurrent passes", ("hrm_text",), _recurrent)
