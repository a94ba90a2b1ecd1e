"""What every family module fills in: its :class:`Family` entry, and the readings of a module
they share (an int attribute, the layer's cache index, its forward's parameter names)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Family", "forward_names", "index_of", "layer_index", "pos_int"]


class Family(NamedTuple):
    """One model family whose attention layers differ from the plain one.

    ``detect(module)`` runs once per layer, when instrumenting. With a ``trait`` it returns the
    value of that :class:`~attnscope._record.facts.LayerTraits` field (the field's default: the
    layer is not of this family), which the worker hands to the family's rule; without one it
    says whether the family's extractor tweak applies (its module's functions, called by
    ``_instrument.transformers``). ``models``: the transformers model types of the architecture
    sweep that exercise it (``tests/test_arch_sweep.py``, ``tests/test_arch_families.py``).
    """

    name: str
    models: tuple[str, ...]
    detect: Callable[[Any], Any]
    trait: str | None = None


def pos_int(value: Any) -> int | None:
    """``value`` when it is a positive int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def index_of(value: Any) -> int | None:
    """``value`` when it is an index: a non-negative int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return None


def layer_index(module: Any) -> int | None:
    """The layer's index into a per-layer cache: ``layer_idx``, or GPT-Neo's ``layer_id``."""
    for name in ("layer_idx", "layer_id"):
        value = index_of(getattr(module, name, None))
        if value is not None:
            return value
    return None


def forward_names(module: Any) -> tuple[str, ...]:
    """The parameter names of ``module``'s class's forward (none where it has no signature)."""
    try:
        return tuple(inspect.signature(type(module).forward).parameters)
    except (AttributeError, TypeError, ValueError):
        return ()
