"""What every family module fills in: its :class:`Family` entry, and the reading of a module
attribute they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Family", "pos_int"]


class Family(NamedTuple):
    """One model family whose attention layers differ from the plain one.

    ``detect(module)`` runs once per layer, when instrumenting, and returns the value of the
    :class:`~attnscope._record.facts.LayerTraits` field named ``trait`` (the field's default: the
    layer is not of this family); the worker hands that value to the family's rule. ``models``:
    the transformers model types of the architecture sweep (``tests/test_arch_sweep.py``) that
    exercise it.
    """

    name: str
    trait: str
    detect: Callable[[Any], Any]
    models: tuple[str, ...]


def pos_int(value: Any) -> int | None:
    """``value`` when it is a positive int (not a bool), else None."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None
