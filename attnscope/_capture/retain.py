"""The tensors a capture keeps by reference, within a byte budget.

The worker counts real tokens in an attention mask (and generated tokens in a ``generate()``
output) after the call; until then the capture holds the tensor. A 4-D mask of a long context is
hundreds of MB on the device: tracing must not keep such a tensor alive, raising the very memory
peak it reports. So a capture keeps a tensor only if it (its whole storage, for a view) is at most
``KEEP_TENSOR_BYTES`` and all
captures together stay within ``attnscope._runtime.KEEP_TOTAL_BYTES``; any other is replaced by its
:class:`TensorMeta` (shape, dtype, device) and the span carries no count that needed its values.

A host mask that is a view of a larger buffer (the static mask of transformers' continuous
batching, rewritten in place at every step, often before the worker counts the last one; a slice
of a model's own causal buffer, nanoGPT's ``bias[:, :, :T, :T]``) is copied instead, up to
``COPY_MASK_ELEMENTS`` elements: its copy is what the worker counts.
"""

from __future__ import annotations

from typing import Any

import torch

from .._record.capture import MASK_NAMES, NO_FACTS, Capture, TensorMeta
from .._runtime import runtime

__all__ = ["KEEP_TENSOR_BYTES", "COPY_MASK_ELEMENTS", "keep", "keep_summary", "release", "drop",
           "meta"]

KEEP_TENSOR_BYTES = 16 << 20
# A copy runs on the calling thread: ~1 MiB read at most (a decode step's mask is far smaller)
COPY_MASK_ELEMENTS = 1 << 18
_PLAIN = frozenset((int, float, bool, type(None)))


def _size(value: torch.Tensor) -> int:
    try:  # a view keeps its whole storage alive (a slice of a model's static causal mask)
        return max(value.nelement() * value.element_size(), value.untyped_storage().nbytes())
    except Exception:  # no plain storage (nested, meta, a subclass): keep nothing of its values
        return KEEP_TENSOR_BYTES + 1


def keep(cap: Capture, value: Any) -> Any:
    """``value`` if ``cap`` may keep it by reference, else its TensorMeta (non-tensors as given)."""
    if not isinstance(value, torch.Tensor):
        return value
    return _kept(cap, value, _size(value))


def _kept(cap: Capture, value: torch.Tensor, size: int) -> Any:
    """``value`` kept within the budget at ``size`` bytes, else its TensorMeta."""
    if size <= KEEP_TENSOR_BYTES and runtime.retention.take(size):
        cap.kept_bytes += size
        return value
    return TensorMeta.of(value)


def keep_summary(cap: Capture) -> None:
    """Apply the budget to every tensor the capture's summary holds (masks, facts' masks)."""
    # facts first: an instrumented layer has facts and an empty summary (the two are disjoint)
    if cap.facts is not NO_FACTS:  # a traced function's call: nothing to look at here
        for facts in (cap.facts.attention, cap.facts.model):
            if facts is not None and facts.mask is not None:
                facts.mask = _keep_mask(cap, facts.mask)
    summary = cap.summary
    for i, (key, value) in enumerate(summary):
        kind = type(value)
        # most of a summary: shapes and scalars (isinstance(x, torch.Tensor) on a non-tensor goes
        # through torch's own __instancecheck__, ~0.3 µs a value)
        if kind is TensorMeta or kind in _PLAIN:
            continue
        if isinstance(value, torch.Tensor):
            summary[i] = (key, _keep_mask(cap, value) if key in MASK_NAMES else keep(cap, value))


def _keep_mask(cap: Capture, mask: Any) -> Any:
    """:func:`keep` for a mask; for a host mask that is a view of a larger buffer (which the
    program may rewrite before the worker counts it), a copy when it has few elements."""
    if not isinstance(mask, torch.Tensor):
        return mask
    if (mask.device.type == "cpu" and not mask.is_nested and mask.layout is torch.strided
            and mask.numel() <= COPY_MASK_ELEMENTS):
        size = mask.numel() * mask.element_size()
        try:
            stored = mask.untyped_storage().nbytes()
        except Exception:  # no plain storage (a subclass): kept as any tensor is
            return keep(cap, mask)
        if stored <= size:  # its own storage: kept by reference (the storage read once)
            return _kept(cap, mask, size)
        if not runtime.retention.take(size):
            return TensorMeta.of(mask)
        cap.kept_bytes += size
        return mask.detach().clone(memory_format=torch.contiguous_format)
    return keep(cap, mask)


def drop(cap: Capture, value: torch.Tensor) -> None:
    """``cap`` stops keeping ``value`` (kept by :func:`keep`): its bytes go back to the budget."""
    size = min(_size(value), cap.kept_bytes)
    cap.kept_bytes -= size
    runtime.retention.give(size)


def meta(cap: Capture, value: torch.Tensor) -> TensorMeta:
    """``value``'s metadata in its place: :func:`drop` it and keep what no value tells."""
    drop(cap, value)
    return TensorMeta.of(value)


def release(cap: Capture) -> None:
    """The capture no longer needs its tensors (built, dropped, or never handed over)."""
    kept, cap.kept_bytes = cap.kept_bytes, 0
    runtime.retention.give(kept)
