"""Gemma 3n's KV-shared layers: they attend the keys the last layer of their kind stored this call
(``shared_kv_states[layer_type]``; in transformers 5.20.2 ``shared_kv_states[
kv_shared_layer_index]``, the storing layer's index), never their own cache slot.

Detector: :func:`shared_kind` (``is_kv_shared_layer``, its ``layer_type`` and its
``kv_shared_layer_index``: the keys the shared keys may be stored under). Extractor tweak:
:func:`shared_past`, the keys before this call's tokens read from the shared keys (read there,
every decode step was a prefill of one key). No rule of its own on the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..._record.facts import NOT_READ, Facts
from .base import Family

__all__ = ["FAMILY", "shared_kind", "shared_past"]


def shared_kind(module: Any) -> tuple[Any, ...] | None:
    """The keys ``shared_kv_states`` may hold a KV-shared layer's keys under (its layer type,
    the storing layer's index); None: not such a layer."""
    held = vars(module)
    if held.get("is_kv_shared_layer") is not True:
        return None
    return tuple(k for k in (held.get("layer_type"), held.get("kv_shared_layer_index"))
                 if k is not None)


def shared_past(out: Facts | None, kwargs: Mapping[str, Any], kind: tuple[Any, ...]) -> None:
    """A shared layer's cache length in its facts ``out``: the shared keys' length less this
    call's tokens; unknown (``cache_unread`` on the worker) where the call does not pass them.
    On the calling thread, after the layer's usual extractor."""
    states = kwargs.get("shared_kv_states")
    # transformers' KVSharingDict is a UserDict (no dict: FSDP2 leaves it alone)
    keys = None
    if isinstance(states, Mapping):
        keys = next((states[k] for k in kind if k in states), None)
    if out is not None and out.attention is not None:
        facts = out.attention
        key = keys[0] if isinstance(keys, (tuple, list)) and keys else None
        if isinstance(key, torch.Tensor) and key.ndim == 4 and facts.cached:
            facts.past = key.shape[-2] - facts.seq_q
        elif facts.cached:  # its own slot is not what it attends: unknown (cache_unread)
            facts.past = NOT_READ


def _is_shared(module: Any) -> bool:
    return shared_kind(module) is not None


FAMILY = Family("Gemma 3n KV-shared layers", ("gemma3n_text",), _is_shared)
