"""A mask (or generated ids) reduced to a few counts by tensor operations that never read a value.

The worker runs them on a host tensor: on CPU the mask the capture kept; on CUDA a copy that the
calling thread enqueued on the call's own stream right after the call's end event. That copy is
the mask's boolean "may attend" view (:func:`ship`: one comparison, broadcast dimensions copied
once, bit-packed when large) written into pinned host memory without blocking; the worker unpacks
it (:func:`land`) once a third event has passed and computes the numbers when they are first read
(:class:`Later`). So a sampled CUDA call with a mask enqueues at most six operations whatever the
mask's size (issue 37), the worker launches no kernel, allocates nothing on the device and never
synchronises, and the capture does not keep the mask alive. The copy's pinned bytes stay within
the tensor-keeping budget, as a kept CPU mask's do.

The numbers (:data:`FIELDS`), with ``d = j - i - (Skv - Sq)`` a pair's key offset (bottom-right
alignment) and "structured" rows those that see some keys but not all:

- ``tokens``: real key positions among this call's queries (the last ``Sq`` of the ``Skv`` keys);
- ``pairs``: visible (query, key) pairs of the mask as stored (broadcast dims not repeated);
- ``visible_any``: some structured row sees a key; ``full``: every pair is visible;
- ``vlo``/``vhi``: the lowest and highest offset a structured row sees;
- ``inside``/``above``/``below``: a real key is hidden from a real query at an offset inside,
  above or below ``[vlo, vhi]`` (a hidden pair counts only when its query sees some key and its
  key is seen by some query, so padding is not structure).

:func:`attnscope._attention.masks.read_counts` turns them into causality, window and pairs.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, NamedTuple

import torch

__all__ = ["FIELDS", "MASKED_BELOW", "PACK_FROM", "MaskPlan", "Shipment", "Later", "attend",
           "mask_numbers", "plan_mask", "query_key_shape", "generated_numbers", "enqueue_to_host",
           "row_numbers", "row_layout", "row_sums", "position_counts", "ship", "land"]

# A float mask entry at or below this is "masked": covers -inf, finfo.min and the -10000 of
# older models.
MASKED_BELOW = -5000.0
FIELDS = ("tokens", "pairs", "visible_any", "full", "vlo", "vhi", "inside", "above", "below")
_FAR = 1 << 40  # an offset no mask reaches: the min/max of an empty selection
# A one-query host mask of at most this many stored elements is read as Python lists (below:
# ~2 µs for 144, ~10 for 1,280); a larger one by three reductions first.
_AS_LISTS = 4096
# A shipped view of at least this many elements travels as bits (8 a byte): one more kernel,
# an eighth of the copy. Below it the copy of the bytes is the cheaper (about 20 µs a MiB).
PACK_FROM = 1 << 20
# Eight 0/1 bytes read as one little-endian int64, times this, hold the eight as the bits of their
# top byte (byte k lands on bit 56 + k; every other product lands on its own bit below 56 or past
# 63): one multiplication packs, a strided view of byte 7 keeps the bits.
_PACK = 0x0102040810204080
_LITTLE = sys.byteorder == "little"  # the host's order is the device's (both little on CUDA)
_BITS = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8)
_UNPACKED = (torch.arange(256, dtype=torch.uint8).unsqueeze(-1) & _BITS) != 0  # byte -> 8 bools


class MaskPlan(NamedTuple):
    """What the shapes alone decide about reading a mask for one call (host side, no values)."""

    structure: bool  # the mask has a query axis matching the call: causality, window, pairs
    # multiply the token count by this (a batch-broadcast mask); None: no count
    token_scale: int | None
    pair_scale: int  # batch and head broadcasts of the pair count


def query_key_shape(shape: tuple[int, ...], batch: int, sq: int) -> tuple[int, ...] | None:
    """The 4-D shape a traced call's 2-D mask is read as when it can only be ``(Sq, Skv)``, the
    shape SDPA broadcasts over batch and heads: its first axis is the query length and is
    neither 1 nor the call's batch (which a ``(B, Skv)`` padding mask would have). None: the
    mask is read as it is."""
    if len(shape) == 2 and shape[0] == sq and sq not in (1, batch):
        return (1, 1, *shape)
    return None


def plan_mask(shape: tuple[int, ...], batch: int, heads: int | None, sq: int,
              skv: int | None) -> MaskPlan:
    """How a mask of ``shape`` is read for a call of ``batch`` x ``heads`` x ``sq`` queries over
    ``skv`` keys (None: not known on the host yet, e.g. a static cache's device length)."""
    if len(shape) not in (2, 3, 4) or sq < 1:
        return MaskPlan(False, None, 1)
    mb = shape[0]
    token_scale = None if mb not in (1, batch) else (batch if mb == 1 and batch > 1 else 1)
    four = shape if len(shape) == 4 else (shape[0], 1, *shape[1:]) if len(shape) == 3 else None
    structure = (four is not None and heads is not None and four[-2] == sq and four[1] in (1, heads)
                 and mb in (1, batch) and (skv is None or four[-1] >= skv >= sq))
    pair_scale = 1
    if structure and four is not None and heads is not None:
        pair_scale = (batch if mb == 1 else 1) * (heads if four[1] == 1 else 1)
    return MaskPlan(bool(structure), token_scale, pair_scale)


def attend(mask: torch.Tensor, ignores: bool, keys: torch.Tensor | None = None) -> torch.Tensor:
    """Boolean "may attend" view of ``mask``, without reading a value on the host.

    Float masks are additive (at or below ``MASKED_BELOW`` = masked), except 2-D padding masks
    (1 = real). ``ignores``: the layer's convention is True/nonzero = masked (MPT,
    ``key_padding_mask``). A boolean mask with a query axis and no stated convention takes its
    polarity from the diagonal (query ``i``'s own key is ``keys - Sq + i``; ``keys``: the mask's
    last axis unless given as a device tensor), since a query always sees itself in real rows:
    decided on the device, as a tensor.
    """
    m = mask.detach()
    if m.dtype == torch.bool:
        if ignores:
            return ~m
        if m.ndim >= 3 and m.shape[-2] > 1:
            return m ^ _diagonal_masked(m, keys)
        return m
    if m.is_floating_point():
        if ignores or m.ndim != 2:
            return m > MASKED_BELOW  # False for NaN too
        return m != 0
    return m == 0 if ignores else m != 0


def _diagonal_masked(m: torch.Tensor, keys: torch.Tensor | None) -> torch.Tensor | bool:
    """Whether most queries' own key is False (then True means masked), as a 0-d tensor."""
    sq, s = m.shape[-2], m.shape[-1]
    if keys is None:
        diag = m.diagonal(offset=s - sq, dim1=-2, dim2=-1)
        return bool(diag.numel()) and 2 * diag.sum() < diag.numel()
    own = (torch.arange(sq, device=m.device) + (keys - sq)).clamp(0, s - 1)
    diag = m.gather(-1, own.unsqueeze(-1).expand(*m.shape[:-1], 1))
    return 2 * diag.sum() < diag.numel()


def mask_numbers(mask: torch.Tensor, ignores: bool, plan: MaskPlan, sq: int,
                 skv: int | torch.Tensor | None, attended: bool = False) -> torch.Tensor:
    """The :data:`FIELDS` of ``mask`` as an int64 vector on the mask's device.

    ``skv``: the keys of this call, a Python int or a 0-d device tensor (a static cache's length,
    not readable on the host); None: the mask's last axis. Keys beyond ``skv`` (the unfilled part of
    a static cache's buffer) are neither seen nor hidden. ``attended``: ``mask`` is already the
    "may attend" view (:func:`attend`). No operation here reads a value of a device tensor on
    the host (a host mask with one query per row is finished on the host: :func:`_one_query`).
    """
    if isinstance(skv, int) and 0 < skv < mask.shape[-1]:
        mask = mask[..., :skv]  # a static cache's buffer, filled up to skv
    device_keys = skv if isinstance(skv, torch.Tensor) else None
    seen = mask if attended else attend(mask, ignores, device_keys)
    s = seen.shape[-1]
    if (plan.structure and device_keys is None and seen.shape[-2] == 1
            and seen.device.type == "cpu"):
        four = seen if seen.ndim == 4 else seen.unsqueeze(1)
        return _one_query(_stored(four, keep_last=True), four.shape[:-1])
    col = torch.arange(s, device=seen.device)
    keys = s if skv is None or isinstance(skv, int) else skv  # an int: the mask was cut to it
    valid = col < keys
    if not isinstance(keys, int):
        seen = seen & valid
    tail = valid & (col >= keys - sq)
    if not plan.structure:
        key_real = seen.reshape(seen.shape[0], -1, s).any(1) if seen.ndim > 2 else seen
        rest = [seen.new_zeros((), dtype=torch.long)] * (len(FIELDS) - 1)
        return torch.stack([(key_real & tail).sum(), *rest])
    four = seen if seen.ndim == 4 else seen.unsqueeze(1)
    return torch.stack(_structure(four, valid, tail, sq, keys))


def _stored(t: torch.Tensor, keep_last: bool = False) -> torch.Tensor:
    """``t`` without its broadcast dimensions (stride 0): each copy is read once. ``keep_last``:
    the last (key) axis stays whole, as the per-row counts need it."""
    dims = t.ndim - 1 if keep_last else t.ndim
    for dim, (size, stride) in enumerate(zip(t.shape[:dims], t.stride()[:dims], strict=True)):
        if stride == 0 and size > 1:
            t = t.narrow(dim, 0, 1)
    return t


def _one_query(one: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """:func:`_structure`'s numbers where each (batch row, head) has one query (every decode
    step), on the host: three passes over the stored rows, read as ints, then arithmetic on
    (B, H) values in Python instead of ~80 operations. The query's key of offset 0 is the last,
    every key is valid, and a row sees only keys its own band holds: no hidden pair lies inside,
    above or below it (the keys a structured row's (batch row, head) shows are that row's
    own). ``one``: the stored ``(B', H', 1, S)`` view; ``shape``: ``(B, H, 1)`` it expands to."""
    s = one.shape[-1]
    if one.numel() <= _AS_LISTS:  # the rows as Python lists: two operations, then C loops
        rows = one.reshape(-1, s).tolist()
        seen_by = [row.count(True) for row in rows]
        first = [row.index(True) if n else 0 for row, n in zip(rows, seen_by, strict=True)]
        from_end = [row[::-1].index(True) if n else 0
                    for row, n in zip(rows, seen_by, strict=True)]
    else:
        flags = one.view(torch.uint8)
        seen_by, first, from_end = torch.stack(
            [one.sum(-1), flags.argmax(-1), flags.flip(-1).argmax(-1)]).reshape(3, -1).tolist()
    copies = (shape[0] // one.shape[0]) * (shape[1] // one.shape[1])
    heads = one.shape[1]
    structured = [i for i, n in enumerate(seen_by) if 0 < n < s]
    base = s - 1  # the key of offset 0
    vlo = min((first[i] - base for i in structured), default=_FAR)
    vhi = max((s - 1 - from_end[i] - base for i in structured), default=-_FAR)
    # a batch row's token: some head's query sees its own key (the last)
    own = [n > 0 and end == 0 for n, end in zip(seen_by, from_end, strict=True)]
    tokens = sum(any(own[r:r + heads]) for r in range(0, len(own), heads))
    return torch.tensor([tokens * (shape[0] // one.shape[0]), sum(seen_by) * copies,
                         int(bool(structured)), int(all(n == s for n in seen_by)), vlo, vhi,
                         0, 0, 0], dtype=torch.long)


def _structure(seen: torch.Tensor, valid: torch.Tensor, tail: torch.Tensor, sq: int,
               keys: int | torch.Tensor) -> list[torch.Tensor]:
    """The :data:`FIELDS` of a ``(B, H, Sq, S)`` "may attend" view, from five passes over it (per
    row: the keys seen, the first and the last; per key: the queries that see it) and arithmetic
    on those. With ``d`` a pair's offset, a structured row one that sees some keys but not all,
    and ``cols`` the keys some structured row of the same (batch row, head) sees: a hidden pair
    (structured query, key in ``cols``, not seen) lies above the band when a structured row is
    farther than ``vhi`` from the last of ``cols``, below it likewise, and inside it when a
    structured row's band ``[vlo, vhi]`` holds more of ``cols`` than the row sees (all that it
    sees lies in the band and in ``cols``). ``cols`` needs no second pass: a row that sees every
    key adds one to every key's count, so a key is in ``cols`` when more queries see it than
    there are such rows."""
    shape, s = seen.shape[:-1], seen.shape[-1]
    one = _stored(seen, keep_last=True)  # broadcast copies read once; the per-row numbers
    # expanded back (not the key axis: a row's count is over every key)
    flags = one.view(torch.uint8)
    # int32 sums: several times faster than int64 ones on CPU; a row's or a key's count fits
    seen_by = one.sum(-1, dtype=torch.int32).expand(shape)  # (B, H, Sq): keys each query sees
    counted = one.sum(-2, dtype=torch.int32).expand(*shape[:-1], s)  # (B, H, S): its queries
    first = flags.argmax(-1).expand(shape)
    last = (s - 1 - flags.flip(-1).argmax(-1)).expand(shape)
    nvalid = valid.sum()
    every = seen_by == nvalid
    rows = (seen_by > 0) & ~every  # structured queries
    base = torch.arange(shape[-1], device=seen.device) + (keys - sq)  # key of offset 0, per query
    vlo = (first - base).masked_fill(~rows, _FAR).min()
    vhi = (last - base).masked_fill(~rows, -_FAR).max()
    cols = counted > (every & (seen_by > 0)).sum(-1, keepdim=True)
    col = torch.arange(s, device=seen.device)
    has = rows.any(-1)  # (B, H): a structured row (and so a key in cols)
    above = has & (col.masked_fill(~cols, -_FAR).amax(-1)
                   - base.masked_fill(~rows, _FAR).amin(-1) > vhi)
    below = has & (col.masked_fill(~cols, _FAR).amin(-1)
                   - base.masked_fill(~rows, -_FAR).amax(-1) < vlo)
    # keys of cols before each key index: counts of cols in any range of keys
    before = torch.nn.functional.pad(cols.to(torch.long).cumsum(-1), (1, 0))
    index = torch.stack([(base + vlo).clamp(0, s), (base + vhi + 1).clamp(0, s)])
    ends = before.gather(-1, index.reshape(-1).expand(*shape[:-1], -1))
    in_band = ends[..., shape[-1]:] - ends[..., :shape[-1]]  # (B, H, Sq): cols in the row's band
    inside = rows & (in_band > seen_by)
    tokens = ((counted.sum(1) > 0) & tail).sum()  # keys of the call's queries seen in a batch row
    pairs = seen_by.sum(dtype=torch.long)
    return [x.to(torch.long) for x in (tokens, pairs, rows.any(), every.all(), vlo, vhi,
                                       inside.any(), above.any(), below.any())]


def row_layout(shape: tuple[int, ...], batch: int, heads: int, sq: int, skv: int) -> int | None:
    """The rows :func:`row_numbers` gives for a mask of ``shape`` (shapes only), None for a mask
    of another layout."""
    if (len(shape) not in (2, 3, 4) or shape[0] not in (1, batch) or shape[-1] < skv or sq < 1
            or skv < sq):
        return None
    if len(shape) > 2 and (shape[-2] != sq or (len(shape) == 4 and shape[1] not in (1, heads))):
        return None
    return shape[0]


def row_numbers(m: torch.Tensor, ignores: bool, batch: int, heads: int, sq: int, skv: int,
                window: int | None, attended: bool = False) -> torch.Tensor | None:
    """Per mask row, as a (5, rows) int64 tensor on the mask's device: tokens and useful pairs
    with a causal band (``window``: its width, or None) applied, the same with none, and the
    shown pairs (-1: a 2-D mask, none shown). No value is read on the host. None for a mask of
    another layout (:func:`row_layout`); ``attended`` as for :func:`mask_numbers`."""
    if row_layout(tuple(m.shape), batch, heads, sq, skv) is None:
        return None
    m = m.detach()[..., :skv]
    if m.ndim == 2:  # (rows, keys) padding: 1 = real
        real = m if attended else attend(m, ignores)
        seen = real[:, None, None, :].expand(m.shape[0], 1, sq, skv)
        shown = torch.full((m.shape[0],), -1, dtype=torch.long, device=m.device)
    else:
        four = m if m.ndim == 4 else m.unsqueeze(1)
        seen = four if attended else attend(four, ignores)
        shown = seen.sum((1, 2, 3), dtype=torch.long)
    head_scale = heads if seen.shape[1] == 1 else 1
    d = (torch.arange(skv, device=m.device).unsqueeze(0)
         - torch.arange(sq, device=m.device).unsqueeze(1)) - (skv - sq)
    band = d <= 0
    if window:
        band &= d > -window
    out = []
    for view in (seen & band, seen):
        key_real = view.flatten(1, 2).any(1)  # (rows, keys): seen by some query of the row
        real_q = key_real[:, skv - sq:]  # (rows, queries): the query's own key is real
        out.append(real_q.sum(1, dtype=torch.long))
        out.append((view & real_q[:, None, :, None]).sum((1, 2, 3), dtype=torch.long))
    if seen.shape[1] == 1:
        out[1], out[3] = out[1] * head_scale, out[3] * head_scale
        shown = torch.where(shown >= 0, shown * head_scale, shown)
    return torch.stack([*out, shown])


def row_sums(mask: torch.Tensor, batch: int, sq: int, keys: int) -> torch.Tensor | None:
    """(Σ rows N_Q², Σ rows N_Q · N_KV) of a model forward's 2-D padding mask ``(rows, ≥ keys)``
    (1 = real), as an int64 pair on the mask's device: N_KV the row's real keys among the first
    ``keys``, N_Q its real positions among the last ``sq`` of them. None for another layout."""
    m = mask.detach()
    if m.ndim != 2 or m.shape[0] not in (1, batch) or m.shape[-1] < keys or keys < sq:
        return None
    real = attend(m[:, :keys], False)
    nkv = real.sum(1, dtype=torch.long)
    nq = real[:, keys - sq:].sum(1, dtype=torch.long)
    scale = batch if m.shape[0] == 1 else 1
    return torch.stack([(nq * nq).sum(), (nq * nkv).sum()]) * scale


def generated_numbers(ids: torch.Tensor, prompt_len: int, eos: tuple[int, ...]) -> torch.Tensor:
    """New tokens per row up to and including the first end-of-sequence token, summed: a 1-element
    int64 vector on the ids' device (shapes decided on the host, values never read)."""
    new = ids.detach()[:, prompt_len:]
    if new.numel() == 0 or not eos:
        return torch.full((1,), new.numel(), dtype=torch.long, device=new.device)
    is_eos = new == eos[0]  # compared with Python ints: no host-to-device copy
    for token in eos[1:]:
        is_eos |= new == token
    after_first = (is_eos.cumsum(dim=1) - is_eos.long()) > 0
    return (new.numel() - after_first.sum()).reshape(1).to(torch.long)


def position_counts(mask: torch.Tensor, ignores: bool, attended: bool = False) -> torch.Tensor:
    """Per key position, how many batch rows see it (some query of the row may attend to it)."""
    seen = mask if attended else attend(mask, ignores)
    s = seen.shape[-1]
    key_real = seen.reshape(seen.shape[0], -1, s).any(1) if seen.ndim > 2 else seen
    return key_real.sum(0, dtype=torch.long)


class Shipment(NamedTuple):
    """How a device mask travels to the host (:func:`ship`) and is read back (:func:`land`)."""

    shape: tuple[int, ...]  # the mask's, sliced to the call's keys: the worker expands to it
    stored: tuple[int, ...]  # what is copied: broadcast dimensions once
    raw: bool  # a boolean mask copied as it is: its polarity is read on the worker (attend)
    packed: bool  # copied as bits, 8 a byte
    nbytes: int  # of what is copied


def ship(mask: torch.Tensor, ignores: bool, keys: int | None
         ) -> tuple[torch.Tensor, Shipment]:
    """What of ``mask`` to copy to the host, enqueued on the current stream: at most two
    operations (a comparison for a mask that is not boolean, or the copy that makes a strided
    boolean view flat, and a multiplication that packs bits from :data:`PACK_FROM` elements on)
    and no host read. ``keys``: the call's keys when known on the host (the mask is cut to
    them)."""
    m = mask.detach()
    if keys is not None and 0 < keys < m.shape[-1]:
        m = m[..., :keys]  # a static cache's buffer, filled up to keys
    shape = tuple(m.shape)
    if not m.is_contiguous():  # a broadcast dimension (stride 0): its one copy travels
        m = _stored(m)
    raw = m.dtype == torch.bool
    data = m if raw else attend(m, ignores)
    packed = data.numel() >= PACK_FROM and data.numel() % 8 == 0 and _LITTLE
    if packed:
        flat = data.reshape(-1)  # a copy only for a strided view, which then starts aligned
        packed = flat.storage_offset() % 8 == 0
        if packed:
            data = (flat.view(torch.int64) * _PACK).view(torch.uint8)[7::8]
    return data, Shipment(shape, tuple(m.shape), raw, packed, data.numel() * data.element_size())


def land(shipment: Shipment, host: torch.Tensor) -> torch.Tensor:
    """The shipped mask back on the host (the worker's: a pass over its bits at most): a boolean
    tensor of the mask's shape, raw (``shipment.raw``) or its "may attend" view."""
    data = host.reshape(-1)
    if shipment.packed:  # a table lookup: several times faster than masking each bit out
        data = _UNPACKED.index_select(0, data.to(torch.int32))
    return data.view(torch.bool).reshape(shipment.stored).expand(shipment.shape)


class Later:
    """Numbers the worker computes from host copies when they are first read: the ``values`` of
    a :class:`~attnscope._record.capture.HostCopy`, read only once the copies have landed."""

    __slots__ = ("_compute", "_values")

    def __init__(self, compute: Callable[[], torch.Tensor | None]) -> None:
        self._compute: Callable[[], torch.Tensor | None] | None = compute
        self._values: list[int] = []

    def tolist(self) -> list[int]:
        compute = self._compute
        if compute is not None:  # two workers (one retiring) would compute the same
            values = compute()  # None: a layout the calling thread had ruled out
            self._values = [] if values is None else [int(v) for v in values.reshape(-1).tolist()]
            self._compute = None  # and what it held (the copies) with it
        return self._values


def enqueue_to_host(values: torch.Tensor) -> Any:
    """A host copy of ``values`` enqueued on the current stream (no wait), pinned for a CUDA
    tensor: readable once an event recorded after it has passed."""
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=values.is_cuda)
    host.copy_(values, non_blocking=True)
    return host
