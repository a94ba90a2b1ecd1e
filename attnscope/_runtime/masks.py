"""Recent masks by value: a token per distinct mask, and each one's numbers per call shape.

Every layer of a forward is given the same mask, so with many calls sampled the worker would count
the same mask once per layer: a pass of small tensor operations (40-450 µs of the worker's CPU in
place, holding the GIL between them) and the derive that follows. :meth:`MaskMemo.token` names a
host mask by its value: equal to one of the last :data:`ENTRIES` seen (``torch.equal``, about a
microsecond), it gets that one's token, else a new one. Equality of values, not identity: it holds
for inference tensors, which keep no version counter, and a mask written in place since is not
equal. :meth:`MaskMemo.numbers` keeps :func:`reduce.mask_numbers` per token and call shape; the
worker's derive cache keys a masked call by its mask's token.

Each entry keeps a copy of its mask, at most :data:`MAX_BYTES`; a larger mask has no token and is
counted every time. Tokens are never reused. The copies are replaced whole and the numbers only
added to (one dict insertion) or replaced whole, so two workers at once (a retiring and a new
one) can only miss, and there is no lock for a forked child to inherit. Used on the worker, on
host tensors only.
"""

from __future__ import annotations

import itertools
from typing import Any

import torch

from .._record.reduce import MaskPlan, mask_numbers

__all__ = ["ENTRIES", "MAX_BYTES", "MAX_NUMBERS", "MaskMemo"]

ENTRIES = 4  # two kinds of mask interleaved over the layers (sliding and full) both stay
MAX_BYTES = 1 << 20  # per kept copy: at most 4 MiB in all
MAX_NUMBERS = 64  # numbers kept (token x call shape); the oldest is forgotten first


class MaskMemo:
    """The last :data:`ENTRIES` masks seen, newest first, as (token, copy), and their numbers."""

    def __init__(self) -> None:
        self._tokens = itertools.count(1)
        self.reset()

    def reset(self) -> None:
        """Forget every entry (tests; a stopping worker, which frees the copies)."""
        self.copies: list[tuple[int, torch.Tensor]] = []
        self.found: dict[tuple[Any, ...], torch.Tensor] = {}

    def after_fork(self) -> None:
        """Nothing to renew: no lock, and the parent's entries are still true of their masks."""

    def token(self, mask: torch.Tensor) -> int | None:
        """The same int for host masks of equal shape, dtype and values while one of them is
        among the recent ones; None for a mask not kept (on a device, over ``MAX_BYTES``, not a
        plain strided tensor: nested, sparse, a subclass)."""
        try:
            if (type(mask) is not torch.Tensor or mask.layout is not torch.strided
                    or mask.is_nested or mask.is_cuda or mask.is_meta or mask.numel() == 0
                    or mask.numel() * mask.element_size() > MAX_BYTES):
                return None
            return self._token(mask)
        except Exception:  # a tensor torch cannot compare or copy here: read per call
            return None

    def _token(self, mask: torch.Tensor) -> int:
        copies = self.copies
        for token, copy in copies:
            if copy.shape == mask.shape and copy.dtype == mask.dtype and torch.equal(copy, mask):
                return token
        token = next(self._tokens)
        with torch.inference_mode():
            self.copies = [(token, mask.detach().clone()), *copies[:ENTRIES - 1]]
        return token

    def numbers(self, mask: torch.Tensor, ignores: bool, plan: MaskPlan, sq: int,
                skv: int | torch.Tensor | None, attended: bool = False) -> torch.Tensor:
        """:func:`reduce.mask_numbers` of a host ``mask``, kept for an equal one read the same
        way. The result may be shared between calls: read it, never write it."""
        token = None if isinstance(skv, torch.Tensor) else self.token(mask)
        key = (token, ignores, plan, sq, skv, attended)
        if token is not None:
            found = self.found.get(key)
            if found is not None:
                return found
        # inference mode: no autograd or version bookkeeping per operation (a fifth less time)
        with torch.inference_mode():
            out = mask_numbers(mask, ignores, plan, sq, skv, attended)
        if token is not None:
            kept = self.found
            if len(kept) >= MAX_NUMBERS:
                try:  # a new dict: see above
                    kept = dict(itertools.islice(kept.items(), 1, None))
                except RuntimeError:  # the other worker added one meanwhile: start afresh
                    kept = {}
            kept[key] = out
            self.found = kept
        return out
