"""GPT-Neo's local layers: a causal mask from the model, the window in the layer's own buffer.

Detector: the layer's kind, ``"local"`` or ``"global"`` (:func:`layer_kind`); a local layer's
window is the config's ``window_size``, the layer's own (not the config's: the model's mask does
not show it; :func:`.config_window.layer_window` reads it). Rule: the worker's window reading
(``_derive.call._structure``): a causal layer that declares a narrower window than its mask
shows applies it itself.
"""

from __future__ import annotations

from typing import Any

import torch

from .base import Family, layer_index, pos_int

__all__ = ["FAMILY", "layer_kind", "local_window"]


def layer_kind(module: Any, config: Any, layer_idx: int | None) -> Any:
    """GPT-Neo's "local"/"global": on the layer (transformers 5), else in the config's
    ``attention_layers`` at its ``layer_id`` (4.48 to 4.57 checked), else (4.44: no ``layer_id``)
    only in the causal buffer, whose local band was cut ``window_size`` below the diagonal."""
    kind = vars(module).get("attention_type")
    layers = getattr(config, "attention_layers", None)
    if kind is not None or not isinstance(layers, (list, tuple)):
        return kind
    if layer_idx is not None:
        return layers[layer_idx] if layer_idx < len(layers) else None
    bias, window = module._buffers.get("bias"), pos_int(getattr(config, "window_size", None))
    if not isinstance(bias, torch.Tensor) or bias.dtype != torch.bool or bias.ndim != 4:
        return None
    if window is None or window >= bias.shape[-1] or bias.device.type == "meta":
        return None
    return "global" if bool(bias[0, 0, window, 0]) else "local"  # once, when instrumenting


def local_window(kind: Any, config: Any) -> int | None:
    """The window of a layer of ``kind``: a "local" layer sees its last ``window_size`` keys."""
    return pos_int(getattr(config, "window_size", None)) if kind == "local" else None


def _is_gpt_neo(module: Any) -> bool:
    kind = layer_kind(module, getattr(module, "config", None), layer_index(module))
    return kind in ("local", "global")


FAMILY = Family("GPT-Neo local layers", ("gpt_neo",), _is_gpt_neo)
