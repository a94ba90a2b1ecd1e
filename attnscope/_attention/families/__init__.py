"""Model families whose attention layers differ from the plain one: one module each.

A family module holds what attnscope knows of that family in one place: how its layers are
recognised (a detector, read once when instrumenting), the :class:`~attnscope._record.facts.
LayerTraits` field its layers carry to the worker, any extractor tweak, and the rule that turns
the trait into FLOPs and structure on the worker (arithmetic over the call's facts: no threads,
no OpenTelemetry). :data:`FAMILIES` lists them; generic code asks it (:func:`detected_traits`).

Adding a family: one module here (its detector, a ``FAMILY = Family(...)`` entry naming the
LayerTraits field it fills and the sweep's model types that exercise it, its rule), one line in
:data:`FAMILIES`, the model type in the architecture sweep's list (``tests/support/
arch_sweep.py`` / ``tests/test_arch_sweep.py``), and the rule's call where the worker derives a
layer's call (``_derive.call.derive_attention``) when the family adds a new kind of rule.
"""

from __future__ import annotations

from typing import Any

from . import (
    clip,
    config_window,
    deepseek_v4,
    diffllama,
    fsmt,
    funnel,
    gemma3n,
    gpt_neo,
    hrm,
    kept_keys,
    llama4,
    longt5,
    modernbert,
    mpt,
    xlm,
    zamba2,
)
from .base import Family

__all__ = ["FAMILIES", "Family", "detected_traits"]

FAMILIES: tuple[Family, ...] = (
    llama4.FAMILY,
    longt5.FAMILY,
    diffllama.FAMILY,
    deepseek_v4.FAMILY,
    kept_keys.FAMILY,
    funnel.FAMILY,
    fsmt.FAMILY,
    mpt.FAMILY,
    gpt_neo.FAMILY,
    gemma3n.FAMILY,
    xlm.FAMILY,
    config_window.FAMILY,
    clip.FAMILY,
    modernbert.FAMILY,
    zamba2.FAMILY,
    hrm.FAMILY,
)


def detected_traits(module: Any) -> dict[str, Any]:
    """The detectors of the families that carry a trait, on ``module``: ``{LayerTraits field:
    value}`` (a field's default where the layer is not of that family)."""
    return {family.trait: family.detect(module) for family in FAMILIES
            if family.trait is not None}
