"""A CUDA capture's device values, replaced by pinned host copies of their counts (calling thread).

Without this the worker would read the values itself: kernels on its own stream (the legacy default
stream, behind all of the user's work there), temporaries that move the user's allocator figures,
and ``.item()`` host synchronisations that raise under ``torch.cuda.set_sync_debug_mode("error")``
— and the capture would keep the mask alive until then. Instead, right after the call's end event,
the few reductions of :mod:`.reduce` are enqueued on the call's own stream, their int64 results are
copied into pinned memory without blocking, and the device timer records a third event behind
them (:func:`wrapper.leave`). The worker reads the copies once that event has passed
(:class:`record.HostCopy`); a capture whose events time out is built without them.

Cost on the calling thread of a sampled CUDA call with a mask: about 60 small kernel launches and
one pinned copy; nothing is read or waited for. Masks over the keeping budget were never kept and
are not reduced either (their temporaries would cost the user's memory).
"""

from __future__ import annotations

from typing import Any

import torch

from . import retain as _retain
from ..record.capture import MASK_NAMES, AttentionFacts, Capture, HostCopy, ModelFacts, find_qkv
from ..record.reduce import (attend, enqueue_to_host, generated_numbers, mask_numbers,
                             plan_mask, row_numbers, row_sums)

__all__ = ["to_host"]


def to_host(cap: Capture) -> bool:
    """Replace ``cap``'s device tensors that the worker would read (masks, cache lengths,
    ``generate()`` ids) by :class:`HostCopy` counts enqueued on the current stream. True when
    any was: the caller then records the timer's third event."""
    copied = False
    summary = cap.summary
    for i, (key, value) in enumerate(summary):
        if isinstance(value, AttentionFacts):
            copied = _attention(cap, value) or copied
        elif isinstance(value, ModelFacts):
            copied = _model(cap, value) or copied
        elif key in MASK_NAMES and _on_device(value):
            summary[i] = (key, _argument_mask(cap, value, key == "key_padding_mask"))
            copied = True
    return copied


def _argument_mask(cap: Capture, mask: torch.Tensor, ignores: bool) -> Any:
    """A traced function's mask: read for the call's shape when its (q, k, v) are known (tokens,
    causality, window, pairs, as for instrumented layers), else per key position."""
    qkv = find_qkv(cap.summary)
    if qkv is None or mask.ndim not in (2, 3, 4):
        return _positions(cap, mask, ignores)
    b, hq, sq, _ = qkv[0].shape
    return _mask_copy(cap, mask, ignores, b, hq, sq, qkv[1].shape[2])


def _on_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_cuda


def _attention(cap: Capture, f: AttentionFacts) -> bool:
    copied = False
    if _on_device(f.mask):
        if f.seq_kv is None:  # self-attention: the mask is read (cross-attention counts b * sq)
            skv = (f.past if f.past is not None else 0) + f.seq_q
            if cap.rows is not None and isinstance(skv, int) and f.heads:
                # inside attnscope.batch(): the per-row counts too, before the mask goes
                rows = row_numbers(f.mask, f.mask_ignores, f.batch, f.heads, f.seq_q, skv,
                                   f.window)
                if rows is not None:
                    f.row_counts = HostCopy(enqueue_to_host(rows.reshape(-1)), "rows",
                                            tuple(rows.shape))
            f.mask = _mask_copy(cap, f.mask, f.mask_ignores, f.batch, f.heads, f.seq_q, skv)
            copied = True
        else:
            _retain.drop(cap, f.mask)
            f.mask = None
    if _on_device(f.past):
        f.past = _int_copy(f.past)
        copied = True
    return copied


def _model(cap: Capture, f: ModelFacts) -> bool:
    copied = False
    if _on_device(f.mask):
        skv = (f.past if f.past is not None else 0) + f.seq_q if f.cached else None
        keys = skv if skv is not None else f.seq_q
        if not f.generate and isinstance(keys, int):
            sums = row_sums(f.mask, f.batch, f.seq_q, keys)
            if sums is not None:
                f.row_sums = HostCopy(enqueue_to_host(sums), "int")
        f.mask = _mask_copy(cap, f.mask, False, f.batch, None, f.seq_q, skv)
        copied = True
    if _on_device(f.past):
        f.past = _int_copy(f.past)
        copied = True
    ids = f.output
    if _on_device(ids) and ids.ndim == 2:
        prompt = f.seq_q if f.prompt_len is None else f.prompt_len
        if ids.shape[1] >= prompt:
            _retain.drop(cap, ids)
            f.output = HostCopy(enqueue_to_host(generated_numbers(ids, prompt, f.eos)), "int")
            copied = True
    return copied


def _mask_copy(cap: Capture, mask: torch.Tensor, ignores: bool, batch: int, heads: int | None,
               sq: int, skv: Any) -> HostCopy:
    """The mask's counts for this call, enqueued; ``skv``: an int, a 0-d device tensor (a
    static cache's length, past + sq) or None (the mask's last axis)."""
    plan = plan_mask(tuple(mask.shape), batch, heads, sq, skv if isinstance(skv, int) else None)
    numbers = mask_numbers(mask, ignores, plan, sq, skv)
    _retain.drop(cap, mask)
    return HostCopy(enqueue_to_host(numbers), "mask", plan)


def _int_copy(value: torch.Tensor) -> HostCopy:
    return HostCopy(enqueue_to_host(value.reshape(1).to(torch.long)), "int")


def _positions(cap: Capture, mask: torch.Tensor, ignores: bool) -> Any:
    """Per key position, how many batch rows see it: the worker picks this call's queries."""
    if mask.ndim not in (2, 3, 4):
        return _retain.meta(cap, mask)
    seen = attend(mask, ignores)
    s = seen.shape[-1]
    key_real = seen.reshape(seen.shape[0], -1, s).any(1) if seen.ndim > 2 else seen
    counts = key_real.sum(0, dtype=torch.long)
    _retain.drop(cap, mask)
    return HostCopy(enqueue_to_host(counts), "positions", tuple(mask.shape))
