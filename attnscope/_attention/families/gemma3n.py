"""Gemma 3n's KV-shared layers: they attend the keys the last layer of their kind stored this call
(``shared_kv_states[layer_type]``), never their own cache slot.

Detector: :func:`shared_kind` (``is_kv_shared_layer`` and its ``layer_type``). Extractor tweak:
:func:`shared_past`, the keys before this call's tokens read from the shared keys (read there,
every decode step was a prefill of one key). No rule of its own on the worker.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..._record.facts import Facts
from .base import Family

__all__ = ["FAMILY", "shared_kind", "shared_past"]


def shared_kind(module: Any) -> Any:
    """The layer type whose keys a KV-shared layer attends; None: not such a layer."""
    kind = vars(module).get("layer_type")
    return kind if vars(module).get("is_kv_shared_layer") is True else None


def shared_past(out: Facts | None, kwargs: Mapping[str, Any], kind: Any) -> None:
    """A shared layer's cache length in its facts ``out``: the shared keys' length less this
    call's tokens; unknown (``cache_unread`` on the worker) where the call does not pass them.
    On the calling thread, after the layer's usual extractor."""
    states = kwargs.get("shared_kv_states")
    # transformers' KVSharingDict is a UserDict (no dict: FSDP2 leaves it alone)
    keys = states.get(kind) if isinstance(states, Mapping) else None
    if out is not None and out.attention is not None:
        facts = out.attention
        key = keys[0] if isinstance(keys, (tuple, list)) and keys else None
        if isinstance(key, torch.Tensor) and key.ndim == 4 and facts.cached:
            facts.past = key.shape[-2] - facts.seq_q
        elif facts.cached:  # its own slot is not what it attends: unknown (cache_unread)
            facts.past = "not read"


def _is_shared(module: Any) -> bool:
    return shared_kind(module) is not None


FAMILY = Family("Gemma 3n KV-shared layers", ("gemma3n_text",), _is_shared)
