"""What a model forward's or ``generate()``'s span says (tokens, phase, usage, the step sums),
and the reading of the small values both it and a layer's facts carry (a cache length)."""

from __future__ import annotations

from typing import Any

import torch

from .._attention.masks import counts_of, read_counts
from .._record.capture import HostCopy, HostKind, ModelFacts, TensorMeta
from .._record.reduce import generated_numbers, row_sums
from .._runtime import runtime
from .result import MODEL, Derived

__all__ = ["derive_model", "host_readable", "as_int"]


def host_readable(t: torch.Tensor) -> bool:
    """Whether the worker may read ``t``'s values: only host tensors. A device tensor's values
    reach the worker as counts the call's stream copied to pinned memory (:class:`HostCopy`)."""
    return not t.is_cuda


def as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, HostCopy) and value.kind is HostKind.INT:
        return value.read()[0]
    if isinstance(value, torch.Tensor) and value.numel() == 1 and host_readable(value):
        return int(value.item())
    return None


def derive_model(f: ModelFacts) -> Derived:
    """Span attributes of a traced model forward (tokens, phase) or generate() call (usage)."""
    past = as_int(f.past)
    keys_known = past is not None or f.past is None  # else a device cache length, not readable
    skv = (past or 0) + f.seq_q if f.cached and keys_known else None
    tokens: int | None = None
    if not isinstance(f.mask, TensorMeta):  # else a mask over the keeping budget: padding unknown
        counts = counts_of(f.mask, False, f.batch, None, f.seq_q, skv,
                           count=runtime.masks.numbers)
        tokens = (f.batch * f.seq_q if f.mask is None else None if counts is None
                  else read_counts(counts, f.batch, None, f.seq_q, skv)[1])
    out = Derived(batch_size=f.batch, seq_len_q=f.seq_q, order=MODEL)
    if f.generate:
        out.input_tokens = tokens
        prompt = f.seq_q if f.prompt_len is None else f.prompt_len
        out.output_tokens = _generated_tokens(f.output, prompt, f.eos)
        return out
    out.tokens = tokens
    phase = None
    if f.cached and keys_known:
        if f.packed_q is None:  # as derive_attention's
            out.kv_cache_len = past or 0
        out.seq_len_kv = (past or 0) + f.seq_q
        rows_q = f.seq_q if f.packed_q is None else f.packed_q
        phase = out.phase = "decode" if past and rows_q == 1 else "prefill"
    if phase == "prefill" or not f.cached:
        out.input_tokens = tokens
    if keys_known:
        sums = _row_sums(f, (past or 0) + f.seq_q if f.cached else f.seq_q)
        if sums is not None:
            out.sum_nq2, out.sum_nq_nkv = sums
    return out


def _row_sums(f: ModelFacts, keys: int) -> tuple[int, int] | None:
    """(Σ rows N_Q², Σ rows N_Q · N_KV) of a model forward: from its (rows, keys) padding mask
    (a host tensor, or the pair a CUDA call's stream copied), the rows' real queries being the
    last ``seq_q`` real positions; without a mask every row is whole. None: not readable."""
    if f.mask is None:
        return f.batch * f.seq_q ** 2, f.batch * f.seq_q * keys
    if isinstance(f.mask, HostCopy) and f.mask.kind is HostKind.MASK and isinstance(
            f.row_sums, HostCopy):
        nq2, nq_nkv = f.row_sums.read()
        return nq2, nq_nkv
    if isinstance(f.mask, torch.Tensor):
        sums = row_sums(f.mask, f.batch, f.seq_q, keys)
        if sums is not None:
            nq2, nq_nkv = sums.tolist()
            return int(nq2), int(nq_nkv)
    return None


def _generated_tokens(ids: Any, prompt_len: int, eos: tuple[int, ...]) -> int | None:
    """New tokens per row up to and including the first end-of-sequence token, summed (counted
    here for host ids, on the call's stream for device ids: a :class:`HostCopy`)."""
    if isinstance(ids, HostCopy):
        return ids.read()[0] if ids.kind is HostKind.INT else None
    if not isinstance(ids, torch.Tensor) or ids.ndim != 2 or ids.shape[1] < prompt_len:
        return None
    if not host_readable(ids):
        return None
    return int(generated_numbers(ids, prompt_len, eos)[0])
