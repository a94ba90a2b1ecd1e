"""A CUDA capture's device values, replaced by pinned host copies the worker reads (calling thread).

Without this the worker would read the values itself: kernels on its own stream (the legacy default
stream, behind all of the user's work there), temporaries that move the user's allocator figures,
and ``.item()`` host synchronisations that raise under ``torch.cuda.set_sync_debug_mode("error")``
— and the capture would keep the mask alive until then. Instead, right after the call's end event,
each value is copied into pinned memory without blocking, on the call's own stream — a mask as its
boolean "may attend" view (``record.reduce.ship``) — and the device timer records a third event
behind the copies (:func:`wrapper.leave`). The worker reads them once that event has passed
(:class:`record.HostCopy`) and computes the counts there (``record.reduce.Later``); a capture whose
events time out is built without them.

Cost on the calling thread of a sampled CUDA call with a mask: at most six operations whatever the
mask's size (issue 37; ``tests/test_mask_launches.py`` counts them): a comparison (none for a
boolean mask), a multiplication that packs a large mask's bits, one pinned allocation, the mask's
copy and a static cache's length's; none at all for the next call given the same mask (every
layer of a forward is), which shares the first one's copy and counts. Nothing is read or waited
for. The pinned bytes are the tensor-keeping budget's, in place of the mask's: masks over the
budget were never kept and are not copied either.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .._record.capture import (
    MASK_NAMES,
    AttentionFacts,
    Capture,
    HostCopy,
    HostKind,
    ModelFacts,
    TensorMeta,
    find_qkv,
)
from .._record.reduce import (
    Later,
    Shipment,
    enqueue_to_host,
    generated_numbers,
    land,
    plan_mask,
    position_counts,
    query_key_shape,
    row_layout,
    row_numbers,
    row_sums,
    ship,
)
from .._runtime import runtime
from . import retain as _retain

__all__ = ["to_host"]

_ALIGN = 8  # bytes: each copy's place in a shared buffer suits an int64 view


class _Slot:
    """Where one copy lands on the host; ``host`` is set once it is enqueued. As the values of
    an ``HostKind.INT`` :class:`HostCopy` it reads as its numbers."""

    __slots__ = ("host",)

    def __init__(self) -> None:
        self.host: Any = None

    def tolist(self) -> list[Any]:
        return list(self.host.reshape(-1).tolist())


class _Sends:
    """One capture's copies: enqueued together, into one pinned buffer when there are several;
    what replaces the device values is written only once they are (an error before leaves the
    device values, which the worker does not read)."""

    __slots__ = ("parts", "slots", "writes")

    def __init__(self) -> None:
        self.parts: list[torch.Tensor] = []
        self.slots: list[_Slot] = []
        self.writes: list[Callable[[], None]] = []

    def add(self, part: torch.Tensor) -> _Slot:
        slot = _Slot()
        self.parts.append(part)
        self.slots.append(slot)
        return slot

    def send(self) -> bool:
        parts = self.parts
        if len(parts) == 1:
            self.slots[0].host = enqueue_to_host(parts[0])
        elif parts:
            for slot, host in zip(self.slots, _together(parts), strict=True):
                slot.host = host
        for write in self.writes:
            write()
        return bool(parts or self.writes)


def _together(parts: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of ``parts`` enqueued into one host buffer (pinned for CUDA tensors)."""
    offsets, total = [], 0
    for part in parts:
        offsets.append(total)
        total += -(-part.numel() * part.element_size() // _ALIGN) * _ALIGN
    buffer = torch.empty(total, dtype=torch.uint8, pin_memory=parts[0].is_cuda)
    hosts = []
    for part, start in zip(parts, offsets, strict=True):
        size = part.numel() * part.element_size()
        host = buffer[start:start + size].view(part.dtype).view(part.shape)
        host.copy_(part, non_blocking=True)
        hosts.append(host)
    return hosts


def to_host(cap: Capture) -> bool:
    """Replace ``cap``'s device tensors that the worker would read (masks, cache lengths,
    ``generate()`` ids) by :class:`HostCopy` values copied on the current stream. True when
    any was: the caller then records the timer's third event."""
    sends = _Sends()
    if cap.facts.attention is not None:
        _attention(cap, cap.facts.attention, sends)
    if cap.facts.model is not None:
        _model(cap, cap.facts.model, sends)
    summary = cap.summary  # a traced call's mask made it pairs (a flat one holds no tensor)
    for i, (key, value) in enumerate(summary):
        if key in MASK_NAMES and _on_device(value):
            copy = _argument_mask(cap, value, key == "key_padding_mask", sends)
            sends.writes.append(functools.partial(summary.__setitem__, i, (key, copy)))
    return sends.send()


def _argument_mask(cap: Capture, mask: torch.Tensor, ignores: bool, sends: _Sends) -> Any:
    """A traced function's mask: read for the call's shape when its (q, k, v) are known (tokens,
    causality, window, pairs, as for instrumented layers), else per key position."""
    qkv = find_qkv(cap.summary)
    if qkv is None or mask.ndim not in (2, 3, 4):
        return _positions(cap, mask, ignores, sends)
    b, hq, sq, _ = qkv[0].shape
    # SDPA's 2-D (Sq, Skv) mask, read as (1, 1, Sq, Skv) as the worker reads a host one
    shape = None if ignores else query_key_shape(tuple(mask.shape), b, sq)
    if shape is not None:
        mask = mask.view(shape)
    return _mask_copy(cap, mask, ignores, b, hq, sq, qkv[1].shape[2], sends)[0]


def _on_device(value: Any) -> bool:
    return isinstance(value, torch.Tensor) and value.is_cuda


def _keys(past: Any, past_slot: _Slot | None, sq: int) -> Any:
    """The call's keys (past + ``sq``): an int, or read on the worker from the copied length."""
    if past_slot is not None:
        return lambda: int(past_slot.host.reshape(-1)[0]) + sq
    if past is None:
        return sq
    if isinstance(past, (int, torch.Tensor)):
        return int(past) + sq  # an int (or a host tensor's value)
    return None  # a length not read (NOT_READ): the keys are unknown


def _past(f: AttentionFacts | ModelFacts, sends: _Sends) -> _Slot | None:
    """A device cache length, copied (as it is: the worker reads any integer type)."""
    if not _on_device(f.past):
        return None
    slot = sends.add(f.past.detach().reshape(1))
    sends.writes.append(lambda: setattr(f, "past", HostCopy(slot, HostKind.INT)))
    return slot


def _attention(cap: Capture, f: AttentionFacts, sends: _Sends) -> None:
    past_slot = _past(f, sends)
    if not _on_device(f.mask):
        return
    if f.seq_kv is not None:  # cross-attention counts b * sq: its mask is not read
        _retain.drop(cap, f.mask)
        f.mask = None
        return
    skv = _keys(f.past, past_slot, f.seq_q)
    mask = f.mask
    copy, read = _mask_copy(cap, mask, f.mask_ignores, f.batch, f.heads, f.seq_q, skv, sends)
    rows = None
    if (cap.batch is not None and isinstance(skv, int) and f.heads and read is not None
            and row_layout(tuple(mask.shape), f.batch, f.heads, f.seq_q, skv) is not None):
        # inside attnscope.batch(): the per-row counts too, from the same copy
        width = mask.shape[0]
        ignores, batch, heads, sq, window = f.mask_ignores, f.batch, f.heads, f.seq_q, f.window
        seen, attended = read
        rows = HostCopy(Later(lambda: row_numbers(seen(), ignores, batch, heads, sq, skv, window,
                                                   attended)), HostKind.ROWS, (5, width))

    def write() -> None:
        f.mask = copy
        if rows is not None:
            f.row_counts = rows

    sends.writes.append(write)


def _model(cap: Capture, f: ModelFacts, sends: _Sends) -> None:
    past_slot = _past(f, sends)
    if _on_device(f.mask):
        skv = _keys(f.past, past_slot, f.seq_q) if f.cached else None
        keys = skv if skv is not None else f.seq_q
        mask = f.mask
        copy, read = _mask_copy(cap, mask, False, f.batch, None, f.seq_q, skv, sends)
        sums = None
        if (not f.generate and isinstance(keys, int) and read is not None and mask.ndim == 2
                and mask.shape[0] in (1, f.batch) and mask.shape[-1] >= keys >= f.seq_q):
            seen = read[0]
            batch, sq = f.batch, f.seq_q
            sums = HostCopy(Later(lambda: row_sums(seen(), batch, sq, keys)), HostKind.INT)

        def write() -> None:
            f.mask = copy
            if sums is not None:
                f.row_sums = sums

        sends.writes.append(write)
    ids = f.output
    if _on_device(ids) and ids.ndim == 2:
        prompt = f.seq_q if f.prompt_len is None else f.prompt_len
        if ids.shape[1] >= prompt:
            _retain.drop(cap, ids)
            new = ids.detach()[:, prompt:]  # only the new tokens travel
            out = _ids_copy(cap, new, f.eos, sends)
            sends.writes.append(lambda: setattr(f, "output", out))


def _ids_copy(cap: Capture, new: torch.Tensor, eos: tuple[int, ...], sends: _Sends) -> Any:
    if not _reserve(cap, new.numel() * new.element_size()):
        return TensorMeta.of(new)
    if new.numel() == 0:
        return HostCopy(Later(lambda: torch.zeros(1, dtype=torch.long)), HostKind.INT)
    slot = sends.add(new)
    return HostCopy(Later(lambda: generated_numbers(slot.host, 0, eos)), HostKind.INT)


def _reserve(cap: Capture, n: int) -> bool:
    """Keep ``n`` bytes of host copies within the tensor-keeping budget, as kept tensors are."""
    if not runtime.retention.take(n):
        return False
    cap.kept_bytes += n
    return True


class _Recent:
    """The calling thread's last mask copy, for the next call given the same mask (every layer
    of a forward is): that call enqueues nothing and shares the copy and its counts, which the
    worker then computes once. Same mask: the same tensor object (a weak reference: the mask is
    not kept alive), unchanged since (its version counter: any in-place write through torch
    bumps it), cut the same way, copied on the same stream (the call's third event then follows
    the copy)."""

    __slots__ = ("ref", "key", "slot", "shipment", "seen", "numbers")

    def __init__(self, mask: torch.Tensor, key: tuple[Any, ...] | None, slot: _Slot,
                 shipment: Shipment, seen: Callable[[], torch.Tensor]) -> None:
        self.ref = weakref.ref(mask)
        self.key = key
        self.slot = slot
        self.shipment = shipment
        self.seen = seen
        self.numbers: dict[tuple[Any, ...], Later] = {}  # per call shape: at most _SHAPES


_SHAPES = 8
# per calling thread (no lock, no sharing across streams of different threads); a stale entry
# only misses, so no reset or fork handler is needed
_recent = threading.local()


_current_stream = getattr(torch._C, "_cuda_getCurrentStream", None)  # a tuple, no Stream object


def _stream_of(mask: torch.Tensor) -> Any:
    """The current stream of the mask's device, where the copy is enqueued (None on CPU)."""
    if not mask.is_cuda:
        return None
    index = mask.get_device()
    if _current_stream is not None:
        return _current_stream(index)[0]  # (stream id, device index, device type)
    return torch.cuda.current_stream(index).stream_id


def _share_key(mask: torch.Tensor, ignores: bool, keys: int | None) -> tuple[Any, ...] | None:
    """What must not have changed for the next call to share this mask's copy; None: never
    shared (an inference tensor has no version counter and may be written in place unseen, and
    a tensor subclass may have none either)."""
    try:
        if mask.is_inference():
            return None
        return (mask._version, ignores, keys, _stream_of(mask))
    except Exception:
        return None


def _shipped(cap: Capture, mask: torch.Tensor, ignores: bool, keys: int | None, sends: _Sends
             ) -> _Recent | None:
    """``mask`` copied (its bytes in the budget in place of the mask's, which it no longer
    keeps), or the copy of the same mask the thread's last call made; None over the budget."""
    _retain.drop(cap, mask)
    key = _share_key(mask, ignores, keys)
    last: _Recent | None = getattr(_recent, "last", None)
    if (key is not None and last is not None and last.ref() is mask and last.key == key
            and last.slot.host is not None):  # sent (a failed call's copy never was)
        return last if _reserve(cap, last.shipment.nbytes) else None
    data, shipment = ship(mask, ignores, keys)
    if not _reserve(cap, shipment.nbytes):
        return None
    slot = sends.add(data)
    recent = _Recent(mask, key, slot, shipment, _landing(slot, shipment))
    _recent.last = recent if key is not None else None
    return recent


def _landing(slot: _Slot, shipment: Shipment) -> Callable[[], torch.Tensor]:
    """The copy as the worker reads it (:func:`reduce.land`), unpacked once for all its counts."""
    landed: list[torch.Tensor] = []

    def seen() -> torch.Tensor:
        if not landed:
            landed.append(land(shipment, slot.host))
        return landed[0]

    return seen


def _mask_copy(cap: Capture, mask: torch.Tensor, ignores: bool, batch: int, heads: int | None,
               sq: int, skv: Any, sends: _Sends
               ) -> tuple[Any, tuple[Callable[[], torch.Tensor], bool] | None]:
    """The mask's counts for this call, computed on the worker from its copy, and how to read the
    copy for more (the landed mask, and whether it is the "may attend" view already); ``skv``: an
    int, a callable reading a device cache length on the worker, or None (the mask's last axis).
    Over the budget: the mask's metadata, and None."""
    plan = plan_mask(tuple(mask.shape), batch, heads, sq, skv if isinstance(skv, int) else None)
    if mask.numel() == 0:  # nothing to read, as for an empty host mask (_attention.masks.counts_of)
        _retain.drop(cap, mask)
        return HostCopy(None, HostKind.UNREAD, plan), None
    shipped = _shipped(cap, mask, ignores, skv if isinstance(skv, int) else None, sends)
    if shipped is None:
        return TensorMeta.of(mask), None
    seen, attended = shipped.seen, not shipped.shipment.raw
    shape = (plan, sq, skv) if not callable(skv) else None  # a device length: this call's own
    later = shipped.numbers.get(shape) if shape is not None else None
    if later is None:
        def numbers() -> torch.Tensor:
            keys = skv() if callable(skv) else skv
            return runtime.masks.numbers(seen(), ignores, plan, sq, keys, attended)

        later = Later(numbers)
        if shape is not None and len(shipped.numbers) < _SHAPES:
            shipped.numbers[shape] = later
    return HostCopy(later, HostKind.MASK, plan), (seen, attended)


def _positions(cap: Capture, mask: torch.Tensor, ignores: bool, sends: _Sends) -> Any:
    """Per key position, how many batch rows see it: the worker picks this call's queries."""
    if mask.ndim not in (2, 3, 4) or mask.numel() == 0:
        return _retain.meta(cap, mask)
    shipped = _shipped(cap, mask, ignores, None, sends)
    if shipped is None:
        return TensorMeta.of(mask)
    seen, attended = shipped.seen, not shipped.shipment.raw
    return HostCopy(Later(lambda: position_counts(seen(), ignores, attended)), HostKind.POSITIONS,
                    tuple(mask.shape))
