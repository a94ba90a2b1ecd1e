"""A mask (or generated ids) reduced to a few counts by tensor operations that never read a value.

The same operations serve both devices. On CUDA the calling thread enqueues them on the call's
own stream right after the call's end event, and copies the int64 result into pinned host memory
without blocking (:func:`enqueue_to_host`); the worker reads those few numbers once a third event
has passed: no kernel, no allocation and no host synchronisation on the worker, and the capture
does not keep the mask alive. On CPU the worker runs them itself on the kept mask, since on the
calling thread they would cost a pass over the mask instead of a few kernel launches.

The numbers (:data:`FIELDS`), with ``d = j - i - (Skv - Sq)`` a pair's key offset (bottom-right
alignment) and "structured" rows those that see some keys but not all:

- ``tokens``: real key positions among this call's queries (the last ``Sq`` of the ``Skv`` keys);
- ``pairs``: visible (query, key) pairs of the mask as stored (broadcast dims not repeated);
- ``visible_any``: some structured row sees a key; ``full``: every pair is visible;
- ``vlo``/``vhi``: the lowest and highest offset a structured row sees;
- ``inside``/``above``/``below``: a real key is hidden from a real query at an offset inside,
  above or below ``[vlo, vhi]`` (a hidden pair counts only when its query sees some key and its
  key is seen by some query, so padding is not structure).

:func:`attnscope.worker.masks.read_counts` turns them into causality, window and pairs.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

__all__ = ["FIELDS", "MASKED_BELOW", "MaskPlan", "attend", "mask_numbers", "plan_mask",
           "generated_numbers", "enqueue_to_host", "row_numbers", "row_sums"]

# A float mask entry at or below this is "masked": covers -inf, finfo.min and the -10000 of
# older models.
MASKED_BELOW = -5000.0
FIELDS = ("tokens", "pairs", "visible_any", "full", "vlo", "vhi", "inside", "above", "below")
_FAR = 1 << 40  # an offset no mask reaches: the min/max of an empty selection


class MaskPlan(NamedTuple):
    """What the shapes alone decide about reading a mask for one call (host side, no values)."""

    structure: bool  # the mask has a query axis matching the call: causality, window, pairs
    # multiply the token count by this (a batch-broadcast mask); None: no count
    token_scale: int | None
    pair_scale: int  # batch and head broadcasts of the pair count


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
            return (m > MASKED_BELOW) & (m == m)
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
                 skv: int | torch.Tensor | None) -> torch.Tensor:
    """The :data:`FIELDS` of ``mask`` as an int64 vector on the mask's device.

    ``skv``: the keys of this call, a Python int or a 0-d device tensor (a static cache's length,
    not readable on the host); None: the mask's last axis. Keys beyond ``skv`` (the unfilled part of
    a static cache's buffer) are neither seen nor hidden. No operation here reads a value on the
    host.
    """
    if isinstance(skv, int) and 0 < skv < mask.shape[-1]:
        mask = mask[..., :skv]  # a static cache's buffer, filled up to skv
    device_keys = skv if isinstance(skv, torch.Tensor) else None
    seen = attend(mask, ignores, device_keys)
    s = seen.shape[-1]
    col = torch.arange(s, device=seen.device)
    keys = s if skv is None or isinstance(skv, int) else skv
    valid = col < keys
    seen = seen & valid
    tail = valid & (col >= keys - sq)
    key_real = seen.reshape(seen.shape[0], -1, s).any(1) if seen.ndim > 2 else seen
    out = [(key_real & tail).sum()]
    if plan.structure:
        out.extend(_structure(seen if seen.ndim == 4 else seen.unsqueeze(1), valid, col, sq, keys))
    else:
        out.extend([seen.new_zeros((), dtype=torch.long)] * (len(FIELDS) - 1))
    return torch.stack([x.to(torch.long) for x in out])


def _structure(seen: torch.Tensor, valid: torch.Tensor, col: torch.Tensor, sq: int,
               keys: int | torch.Tensor) -> list[torch.Tensor]:
    # Temporaries are booleans (and two uint8) of the mask's size: no int64 offset matrix, which
    # would be eight times the mask of a long sequence.
    rows = seen.any(-1) & ~(seen | ~valid).all(-1)  # queries that see some keys but not all
    kept = seen & rows.unsqueeze(-1)
    cols = kept.any(-2)
    hidden = (rows.unsqueeze(-1) & cols.unsqueeze(-2) & ~seen).flatten(0, 1).any(0)
    visible = kept.flatten(0, 1).any(0)
    has = visible.any(-1)
    row = torch.arange(seen.shape[-2], device=seen.device)
    base = row + (keys - sq)  # key index of offset 0, per query
    first = visible.to(torch.uint8).argmax(-1)
    last = visible.shape[-1] - 1 - visible.flip(-1).to(torch.uint8).argmax(-1)
    vlo = (first - base).masked_fill(~has, _FAR).min()
    vhi = (last - base).masked_fill(~has, -_FAR).max()
    ge = col.unsqueeze(0) >= (base + vlo).unsqueeze(1)  # offset >= vlo
    le = col.unsqueeze(0) <= (base + vhi).unsqueeze(1)  # offset <= vhi
    inside = (hidden & ge & le).any()
    above = (hidden & ~le).any()
    below = (hidden & ~ge).any()
    return [seen.sum(), visible.any(), (seen | ~valid).all(), vlo, vhi, inside, above, below]


def row_numbers(m: torch.Tensor, ignores: bool, batch: int, heads: int, sq: int, skv: int,
                window: int | None) -> torch.Tensor | None:
    """Per mask row, as a (5, rows) int64 tensor on the mask's device: tokens and useful pairs
    with a causal band (``window``: its width, or None) applied, the same with none, and the
    shown pairs (-1: a 2-D mask, none shown). No value is read on the host: the calling thread
    enqueues this for a CUDA mask (``capture.hostread``), the worker runs it on a host mask.
    None for a mask of another layout."""
    if (m.ndim not in (2, 3, 4) or m.shape[0] not in (1, batch) or m.shape[-1] < skv or sq < 1
            or skv < sq):
        return None
    m = m.detach()[..., :skv]
    if m.ndim == 2:  # (rows, keys) padding: 1 = real
        seen = attend(m, ignores)[:, None, None, :].expand(m.shape[0], 1, sq, skv)
        shown = torch.full((m.shape[0],), -1, dtype=torch.long, device=m.device)
    else:
        four = m if m.ndim == 4 else m.unsqueeze(1)
        if four.shape[-2] != sq or four.shape[1] not in (1, heads):
            return None
        seen = attend(four, ignores)
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


def enqueue_to_host(values: torch.Tensor) -> Any:
    """A pinned host copy of ``values`` enqueued on the current stream (no wait): readable once
    an event recorded after it has passed."""
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=True)
    host.copy_(values, non_blocking=True)
    return host
