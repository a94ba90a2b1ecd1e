"""A window from the config only (Moshi's): the model may build its masks without it.

A layer's window is its own attribute (``sliding_window``), a GPT-Neo local layer's
(:mod:`.gpt_neo`) or, where it declares none, its config's (:func:`layer_window`). A config-only
window is applied in the mask the model builds, if at all: Moshi sets ``config.sliding_window``
and never uses it.

Detector: :func:`config_window` (the layer's window is its config's only), read once when
instrumenting. Carries: ``LayerTraits.config_window``. Rule, on the worker
(``_derive.call._structure``): :func:`window_unapplied`, with :func:`builds_masks` of the
layer: a causal mask over more keys than the window that shows none says the window is not
applied, and so does no mask at all from a model that builds them (sdpa skips the mask only
where no window can bind). The worker's one-query reading (``_derive.call._one_query``) reads
the trait too: a config window may hide keys that are then not padding.
"""

from __future__ import annotations

from typing import Any

from ..masks import MaskReading
from . import gpt_neo
from .base import Family, layer_index, pos_int

__all__ = ["FAMILY", "builds_masks", "config_window", "layer_window", "window_unapplied"]

# transformers' implementations that take the mask the model builds (flash ones take none)
_MASK_TAKERS = frozenset(("eager", "sdpa"))


def layer_window(module: Any) -> int | None:
    """The window a layer declares: its own ``sliding_window``, a GPT-Neo local layer's, else
    its config's (None: full attention). Read once, when instrumenting."""
    return _declared(module)[0]


def config_window(module: Any) -> bool:
    """Whether the layer's window (:func:`layer_window`) is its config's, the layer declaring
    none of its own."""
    return _declared(module)[1]


def _declared(module: Any) -> tuple[int | None, bool]:
    """(:func:`layer_window`, :func:`config_window`)."""
    config = getattr(module, "config", None)
    # Hybrid models (EXAONE 4, ...) give every layer the config's window and say per layer whether
    # it applies: an ``is_sliding`` flag, or ``config.layer_types``.
    if vars(module).get("is_sliding") is False:
        return None, False
    types, layer = getattr(config, "layer_types", None), layer_index(module)
    if isinstance(types, (list, tuple)) and layer is not None and layer < len(types):
        if types[layer] == "full_attention":
            return None, False
    if "sliding_window" in vars(module):  # per-layer setting; None means full attention
        return pos_int(module.sliding_window), False
    kind = gpt_neo.layer_kind(module, config, layer)
    if kind in ("local", "global"):  # GPT-Neo: "local" layers see their last window_size keys
        return gpt_neo.local_window(kind, config), False
    if getattr(config, "use_sliding_window", True) is False:
        return None, False
    window = pos_int(getattr(config, "sliding_window", None)) if config is not None else None
    return window, window is not None


def builds_masks(instance: Any) -> bool:
    """The layer's model hands it the mask it builds (transformers' ``eager``/``sdpa``), so no
    mask means none was needed: sdpa's causal skip, taken only where a window cannot bind. Flash
    kernels take no mask and apply the window they are passed themselves."""
    try:
        impl = getattr(getattr(instance, "config", None), "_attn_implementation", None)
    except Exception:  # noqa: BLE001  (a config property that raises: not known)
        return False
    return type(impl) is str and impl in _MASK_TAKERS


def window_unapplied(window: int | None, skv: int, reading: MaskReading | None,
                     builds: bool, mask: Any) -> bool:
    """Whether a config-only ``window`` over ``skv`` keys was not applied: a causal mask read
    (``reading``) that shows no window over more keys than it, or no ``mask`` at all from a
    model that ``builds`` its masks."""
    return window is not None and skv > window and (
        (reading is not None and reading.causal is True and reading.window is None
         and reading.pairs is not None) or (builds and mask is None))


FAMILY = Family("Config-only window (Moshi)", ("moshi",), config_window, "config_window")
