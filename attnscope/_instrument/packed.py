"""Calls on a cache whose length attnscope cannot read, as transformers' continuous batching
makes them (``generate_batch()``, ``transformers serve``): the requests of a step packed into
one row of ragged sequences (``cu_seq_lens_q``), their keys gathered from a paged cache.

The call's 4-D mask is shaped to the scores, so its key axis is the keys the call attends, and
counting it (on the worker, as any mask) gives the exact pairs and tokens; ``max_length_q``, the
longest sequence's new tokens, says whether the step only decodes. Without a 4-D mask (a paged
flash kernel) the keys stay unknown (``cache_unread``).
"""

from __future__ import annotations

from typing import Any

import torch

from .._record.facts import AttentionFacts, ModelFacts

__all__ = ["unread_keys"]


def unread_keys(facts: AttentionFacts | ModelFacts, mask: Any, kwargs: dict[str, Any]) -> None:
    """``facts.past`` and ``facts.packed_q`` from the call's 4-D mask and its packing, for a call
    whose cache length was not read; left as they are otherwise."""
    if not (isinstance(mask, torch.Tensor) and mask.ndim == 4 and mask.shape[-2] == facts.seq_q
            and mask.shape[-1] >= facts.seq_q):
        return
    facts.past = mask.shape[-1] - facts.seq_q  # the keys before this call's, over all its rows
    longest = kwargs.get("max_length_q")
    if kwargs.get("cu_seq_lens_q") is not None and type(longest) is int:
        facts.packed_q = longest
