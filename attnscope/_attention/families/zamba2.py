"""Zamba2's shared attention: one module serves several hybrid layers, each call naming its layer.

The module's own ``layer_idx`` is -1 (no index: :func:`.base.layer_index`) and its forward takes
``layer_idx``. Detector: :func:`index_per_call`. Extractor tweak: the cache slot a call reads is
:func:`call_slot` of the index it is given (``_instrument.transformers._cache_slot``). No trait,
no rule of its own on the worker.
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from .base import Family, forward_names, index_of, layer_index

__all__ = ["FAMILY", "INDEX", "call_slot", "index_per_call"]

INDEX = ("layer_idx",)


def index_per_call(layer_idx: int | None, names: Container[str]) -> bool:
    """Whether a layer of index ``layer_idx`` (None: it has none) whose forward takes ``names``
    is given its index with each call."""
    return layer_idx is None and INDEX[0] in names


def call_slot(value: Any) -> int | None:
    """The cache slot of a call given ``value`` as its layer index (None: not an index)."""
    return index_of(value)


def _is_shared(module: Any) -> bool:
    return index_per_call(layer_index(module), forward_names(module))


FAMILY = Family("Zamba2 shared attention", ("zamba2",), _is_shared)
