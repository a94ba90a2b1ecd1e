"""Each sampled call of a ``batch`` block split by row (its request spans: ``_spans.requests``).

A call's FLOPs are the work of its padded shape (what the kernel computes). Per row they split
into **useful** FLOPs, the row's real queries times the keys each of them attends to (read from
the call's mask, the layer's causality and window applied), and **padding** FLOPs, the rest of
that row's share of the call: for every call split here, Σ rows (useful + padding) = the call's
FLOPs, exactly. A row's share is the call's FLOPs over its rows when the call counted the padded
shape's pairs (a band: each row has the same), or the pairs the mask shows in that row when the
call counted the mask's pairs one by one. A padding row (``None``) is all padding.

A fused kernel does not time rows apart, so each row's time is an **estimate**: at prefill the
row's share of the call's FLOPs, at decode its share of the KV cache read, which in a padded
batch is the same for every row (each row's cache is read whole). Figures of sampled calls are
scaled to all calls by 1 / the call's sample rate (``all_calls.*``: estimates too).

A call is left unsplit (counted in ``calls_unapportioned``) when its rows are not the block's,
its mask is on a device or not kept (per-row counts are read on the worker, from a host mask
only, today; cross-attention over padded keys keeps none), or its FLOPs are not a per-row sum
this module can reproduce (a chunked layer over left padding): never a guessed split. A call
nested in another attention call of the same block (an SDPA call inside an instrumented layer)
is left to the outer one, counted once.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .. import _schema as schema
from .._record.batches import BatchRecord, rows_for
from .._record.capture import MASK_NAMES, Capture, HostCopy, find_qkv
from .._record.reduce import row_numbers
from .._spans.requests import BlockCalls, RowCall

__all__ = ["RowCall", "Ledger", "split_rows", "mask_rows", "read_rows"]

_MAX_CALLS = 65_536  # call records one block keeps; later calls are counted unapportioned
_FLOPS, _PHASE, _BATCH = schema.FLOPS.name, schema.PHASE.name, schema.BATCH_SIZE.name
_SQ, _SKV, _CAUSAL = schema.SEQ_LEN_Q.name, schema.SEQ_LEN_KV.name, schema.CAUSAL.name
_WINDOW, _KV_READ, _EXACT = (schema.SLIDING_WINDOW.name, schema.KV_BYTES_READ.name,
                             schema.EXACT.name)
_NOT_KEPT = object()  # a call whose keys a mask hid that the call's facts do not keep


def mask_rows(mask: torch.Tensor, ignores: bool, batch: int, heads: int, sq: int, skv: int,
              causal: bool, window: int | None
              ) -> tuple[list[int], list[int], list[int] | None] | None:
    """Per batch row of a host mask: (real query tokens, useful pairs, pairs the mask shows).

    Useful pairs: over the query heads, each real query (one whose own key some query of its row
    sees) times the keys it sees, the mask and the layer's causality and window together. Shown
    pairs: the mask's visible pairs as stored (None for a 2-D padding mask, which shows none).
    None for a mask of another layout. Reads the mask's values: the worker's, CPU tensors only.
    """
    m = mask.detach()
    if m.is_cuda or m.is_meta:
        return None
    numbers = row_numbers(m, ignores, batch, heads, sq, skv, window if causal else None)
    return None if numbers is None else read_rows(numbers.tolist(), batch, causal)


def read_rows(numbers: list[list[int]], batch: int, causal: bool
              ) -> tuple[list[int], list[int], list[int] | None]:
    """:func:`row_numbers`' lists as (tokens, useful pairs, shown pairs) per row of ``batch``,
    the causal or the plain reading."""
    tokens, useful = (numbers[0], numbers[1]) if causal else (numbers[2], numbers[3])
    shown: list[int] | None = numbers[4] if numbers[4][0] >= 0 else None
    if len(tokens) == 1 and batch > 1:
        tokens, useful = tokens * batch, useful * batch
        shown = None if shown is None else shown * batch
    return tokens, useful, shown


def _facts(cap: Capture) -> tuple[Any, bool, int, int, int, int | None, Any] | None:
    """(mask, its polarity, query heads, FLOPs per pair, cores, chunk, a CUDA mask's per-row
    counts) of an attention call."""
    f, traits = cap.facts.attention, cap.facts.traits
    if f is not None:
        if not f.heads or not f.head_dim:
            return None
        cores = traits.cores if traits is not None else 1
        chunk = traits.chunk if traits is not None else None
        if traits is not None and traits.band is not None:
            return None  # blocked layouts (LongT5): no per-row reading of their masks
        per_pair = 2 * (f.head_dim + (f.head_dim_v or f.head_dim)) * cores
        # cross-attention over masked keys keeps no mask (keys_masked): its padding is unknown,
        # and calling all of it useful would be a guess (``_read``: "mask_unread")
        mask = _NOT_KEPT if f.mask is None and f.keys_masked else f.mask
        return mask, f.mask_ignores, f.heads, per_pair, cores, chunk, f.row_counts
    qkv = find_qkv(cap.summary)
    if qkv is None:
        return None
    q, _, v = qkv
    summary = dict(cap.summary)
    mask = next((summary[n] for n in MASK_NAMES if n in summary), None)
    ignores = "key_padding_mask" in summary and mask is summary["key_padding_mask"]
    return mask, ignores, q.shape[1], 2 * (q.shape[3] + v.shape[3]), 1, None, None


def split_rows(cap: Capture, shape: dict[str, Any], rows: tuple[Any, ...],
               time_ns: float | None, device_reads: bool = True) -> RowCall:
    """The call's figures per row of ``rows`` (see the module docstring). ``device_reads``:
    the call's events passed, so its pinned copies can be read."""
    call = RowCall(cap.capture_id, cap.parent_id)
    flops, batch = shape.get(_FLOPS), shape.get(_BATCH)
    sq, skv = shape.get(_SQ), shape.get(_SKV)
    facts = _facts(cap)
    if facts is None or type(flops) is not int or type(batch) is not int or batch < 1 \
            or type(sq) is not int or type(skv) is not int:
        call.reason = "no_figures"
        return call
    if rows_for(rows, batch) is None:
        call.reason = "rows_mismatch"
        return call
    mask, ignores, heads, per_pair, _, chunk, copied = facts
    if mask is None:
        tokens, useful, shown = [sq] * batch, None, None
    else:
        read = _read(mask, copied, ignores, batch, heads, sq, skv, shape, device_reads)
        if isinstance(read, str):
            call.reason = read
            return call
        tokens, pairs, shown = read
        useful = [per_pair * p for p in pairs]
    if shown is not None and per_pair * sum(shown) == flops:
        totals = [per_pair * s for s in shown]
    elif flops % batch == 0 and chunk is None:
        totals = [flops // batch] * batch
    else:
        call.reason = "not_per_row"
        return call
    if useful is None:
        useful = list(totals)
    for i, row in enumerate(rows):
        if row is None:  # a padding row: all of its share is padding
            tokens[i], useful[i] = 0, 0
    padding = [t - u for t, u in zip(totals, useful, strict=True)]
    if min(padding) < 0:  # the mask shows more than the call counted: no honest split
        call.reason = "not_per_row"
        return call
    phase = shape.get(_PHASE)
    call.phase = phase if isinstance(phase, str) else None
    # a call outside the random sample (attnscope.extra) stands for itself alone: in the
    # request's sampled figures, not in its estimate of all calls
    call.weight = 0.0 if cap.grant is not None and cap.grant.extra else \
        1.0 / cap.sample_rate if cap.sample_rate and cap.sample_rate > 0 else 1.0
    # a forward recomputed in backward (checkpointing): its work is the request's, its tokens
    # were counted by the forward
    call.tokens = [0] * len(tokens) if cap.recompute else tokens
    call.useful, call.padding = useful, padding
    call.exact = shape.get(_EXACT) is not False
    if time_ns is not None:
        if call.phase == "decode":
            call.time_ns = [time_ns / batch] * batch
        else:
            call.time_ns = [time_ns * t / flops if flops else time_ns / batch for t in totals]
    kv = shape.get(_KV_READ)
    if type(kv) is int and call.phase == "decode":
        call.kv_bytes = _split(kv, useful if sum(useful) else [1] * batch)
    return call


def _read(mask: Any, copied: Any, ignores: bool, batch: int, heads: int, sq: int, skv: int,
          shape: dict[str, Any], device_reads: bool
          ) -> tuple[list[int], list[int], list[int] | None] | str:
    """A call's mask per row (:func:`mask_rows`, or the copies of a CUDA mask's counts), or
    why there is no reading."""
    causal = shape.get(_CAUSAL) is True
    if isinstance(mask, torch.Tensor):
        read = mask_rows(mask, ignores, batch, heads, sq, skv, causal, shape.get(_WINDOW))
    elif isinstance(copied, HostCopy):
        if not device_reads:  # the call's events timed out: the copies may not have landed
            return "mask_unread"
        flat = copied.read()
        width = copied.plan[1]
        read = read_rows([flat[i * width:(i + 1) * width] for i in range(5)], batch, causal)
    else:  # a mask over the keeping budget, or a device mask's call-level counts only
        return "mask_unread"
    return "mask_layout" if read is None else read


def _split(total: int, weights: list[int]) -> list[int]:
    """``total`` in integer parts proportional to ``weights`` that sum to it (largest remainder)."""
    whole = sum(weights)
    parts = [total * w // whole for w in weights]
    rest = total - sum(parts)
    order = sorted(range(len(weights)), key=lambda i: -(total * weights[i] % whole))
    for i in order[:rest]:
        parts[i] += 1
    return parts


class Ledger:
    """The worker's record of each ``batch`` block's calls, split by row (worker thread only).

    Keyed weakly by the calling side's ``BatchRecord``, which the worker never writes: a block
    whose end never reaches the worker (dropped over the bound) takes its entry with it."""

    def __init__(self) -> None:
        self._calls: weakref.WeakKeyDictionary[BatchRecord, BlockCalls] = (
            weakref.WeakKeyDictionary())

    def observe(self, cap: Capture, shape: dict[str, Any], time_ns: float | None,
                device_reads: bool = True) -> float | None:
        """Split one call of a ``batch`` block into the block's record; returns the share of the
        call's FLOPs spent on padding when it was split (the call's own span says it), or None."""
        block = cap.batch
        if not isinstance(block, BatchRecord) or _FLOPS not in shape:
            return None  # not an attention call (a model's forward, generate): nothing to split
        acc = self._calls.get(block)
        if acc is None:
            acc = self._calls[block] = BlockCalls()
        acc.attention_ids.add(cap.capture_id)
        if len(acc.calls) >= _MAX_CALLS:
            acc.calls.append(RowCall(cap.capture_id, cap.parent_id, "over_bound"))
            return None
        call = split_rows(cap, shape, block.rows, time_ns, device_reads)
        acc.calls.append(call)
        flops = shape[_FLOPS]
        return sum(call.padding) / flops if call.reason is None and flops else None

    def take(self, block: BatchRecord) -> BlockCalls | None:
        """The block's record, handed over once (its end): None when no call of it was split."""
        return self._calls.pop(block, None)

    def __len__(self) -> int:
        """Blocks whose calls the worker holds now."""
        return len(self._calls)
