"""What every family module fills in: its :class:`Family` entry, and the reading of a module
attribute they share."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

__all__ = ["Family", "pos_int"]


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
