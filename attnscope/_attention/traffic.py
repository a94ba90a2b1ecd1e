"""The least memory traffic an attention core must move for one call, and its arithmetic intensity.

Run by the worker, from what ``_derive.call.derive`` established of a call: integer arithmetic
on a few numbers (no tensor, no torch import). What "minimum" means, consistently with the FLOPs of
:func:`.flops.attention_flops` (which count the pairs a mask leaves visible):

- every element of Q, K, V (and of the mask) that some real output depends on is read once, and
  every element of O is written once (the output tensor is the call's result, padded rows too);
- K and V are read once per **KV head**: grouped- and multi-query attention share them across the
  query heads of a group, and a kernel that handles a group's query heads together (FlashInfer's
  decode kernels, FlashAttention 3's packed GQA) reads them once; one that reads them per query
  head moves more than this minimum (its re-reads may hit the L2 cache);
- a key is read when some real query sees it: with a causal mask the last query sees every key up
  to itself, so all of them are read; a sliding window or a chunk can leave older keys unread
  (``Sq + W - 1`` keys at most for a causal window of ``W``);
- a query row is read when the query is real and sees at least one key (rows of a causal call with
  ``Sq > Skv`` that see nothing, and padded queries, are not read);
- padding is excluded as ``attnscope.tokens`` excludes it: left padding of ``p`` positions in a
  batch row makes keys ``0..p-1`` of that row unread and the queries at those positions not real;
- the mask, when one is passed, is read once as stored (broadcast dimensions are not repeated), cut
  to the call's keys (a static cache's mask is as long as its buffer): every entry decides a pair.

Queries are aligned bottom-right as for FLOPs: query ``i`` of ``Sq`` sits at key position
``Skv - Sq + i``. Softmax statistics (LSE), dropout state, workspace and the re-reads of a tiled
kernel are not part of the minimum. A figure attnscope cannot establish is None, never a guess:
an unknown dtype, a mask whose dtype, shape or padding is unknown, a two-sided window (only its
width is known), or a chunk combined with a window.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

__all__ = ["Traffic", "attention_traffic", "element_size", "UNKNOWN"]

# Bytes per element by dtype name as attnscope writes it (``str(dtype)`` without ``torch.``).
_SIZES = {
    "float64": 8, "double": 8, "float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2,
    "float8_e4m3fn": 1, "float8_e4m3fnuz": 1, "float8_e5m2": 1, "float8_e5m2fnuz": 1,
    "float8_e8m0fnu": 1, "bool": 1, "uint8": 1, "int8": 1, "int16": 2, "int32": 4, "int64": 8,
}


class Traffic(NamedTuple):
    """Minimum bytes of one call (None: not established)."""

    bytes: int | None
    kv_bytes_read: int | None  # decode only: the K and V bytes the call reads (the whole cache)
    arithmetic_intensity: float | None  # FLOPs / bytes


UNKNOWN = Traffic(None, None, None)


def element_size(dtype: str | None) -> int | None:
    """Bytes of one element of ``dtype`` (a name such as ``"bfloat16"``); None when unknown."""
    if dtype is None:
        return None
    return _SIZES.get(dtype.removeprefix("torch."))


def _rows_and_keys(sq: int, skv: int, pads: Sequence[int], causal: bool, window: int | None,
                   chunk: int | None) -> tuple[int, int]:
    """(query rows read per query head, keys read per KV head), summed over batch rows whose
    first ``pads[b]`` key positions are padding. One pass of builtins per case: this runs per
    span, and a batch of 64 padded rows must stay within a few µs."""
    if sq <= 0 or skv <= 0 or not pads:
        return 0, 0
    first = skv - sq  # the first query's key position (the last one's is skv - 1)
    n, lo, hi = len(pads), min(pads), max(pads)
    if 0 <= lo and hi <= first and hi < skv and chunk is None:
        # every row's padding ends before its first query (decode, or prefill over a padded
        # cache): every query is real and reads; builtins only, whatever the batch
        if causal and window is not None and hi > first - window + 1:
            keys = sum(skv - max(p, first - window + 1) for p in pads)
        elif causal and window is not None:  # hi <= first - window + 1: no key of a window
            keys = n * (sq + window - 1)  # is padding, each row reads sq + window - 1 keys
        else:
            keys = n * skv - sum(pads)
        return n * sq, keys
    if 0 <= lo and hi <= skv and first <= lo:
        # every row's padding reaches its first query (a left-padded prefill): a row's real
        # queries start at its first real key, and see every real key (causal: the last query;
        # windows and chunks: each real key is its own query's); builtins only
        real = n * skv - sum(pads)
        if causal:
            return real, real
        low, empty = max(0, first), pads.count(skv)  # rows of padding only read nothing
        return (n - empty) * (sq + low) - (sum(pads) - empty * skv), real
    clipped = [min(max(p, 0), skv) for p in pads]
    if not causal:
        # every real query sees every real key; padded queries sit at positions 0..pad-1, and a
        # row of padding only (pad == skv) reads nothing
        low = max(0, first)
        rows = sum(sq - max(0, p - low) for p in clipped if p < skv)
        return rows, skv * len(clipped) - sum(clipped)
    # real queries that may see a key: from max(first, pad) (causal: position >= 0) to skv - 1
    starts = [max(first, p) for p in clipped]
    rows = skv * len(starts) - sum(starts)
    if chunk is not None:
        # a query sees its own chunk up to itself; chunks start at the row's first real position
        keys = sum(skv - p - (s - p) // chunk * chunk for p, s in zip(clipped, starts, strict=True))
    elif window is not None:
        # the first real query sees keys from its position - window + 1, clipped to the real ones
        keys = sum(skv - max(p, s - window + 1) for p, s in zip(clipped, starts, strict=True))
    else:
        keys = skv * len(clipped) - sum(clipped)  # the last query sees every real key
    return rows, keys


def attention_traffic(
    batch: int | None, heads: int | None, kv_heads: int | None, seq_q: int | None,
    seq_kv: int | None, head_dim: int | None, head_dim_v: int | None, dtype: str | None, *,
    kv_dtype: str | None = None, out_dtype: str | None = None, causal: bool = False,
    window: int | None = None, chunk: int | None = None,
    left_padding: Sequence[int] | None = None, counted: tuple[int, int] | None = None,
    mask_shape: Sequence[int] | None = None, mask_dtype: str | None = None, mask: bool = False,
    decode: bool = False, flops: int | None = None,
) -> Traffic:
    """Minimum bytes the attention core moves for one call, the decode KV read, and FLOPs/bytes.

    ``dtype``: Q's (and, unless given, K/V's and O's); ``head_dim_v`` None: ``head_dim``.
    ``window``: a causal sliding window's width in keys. ``chunk``: chunked causal attention
    (Llama 4). ``left_padding``: per batch row, the padding positions before its first real key
    (as :func:`.masks.left_padding` reads them); None: no padding, unless ``mask`` says a mask was
    passed, whose padding is then unknown. ``counted``: (query rows read, keys read per KV head),
    each summed over the batch, when the caller counted them from the mask (then ``causal``,
    ``window``, ``chunk`` and ``left_padding`` are not used). ``mask_shape``/``mask_dtype``: the
    mask as stored (``mask`` with neither: a mask whose layout was not recorded, so the bytes are
    unknown). ``decode``: the call is a decode step (``kv_bytes_read`` is then set). ``flops``:
    the call's FLOPs, for the intensity.
    """
    if (batch is None or heads is None or seq_q is None or seq_kv is None or head_dim is None
            or not heads or batch < 0 or seq_q < 0 or seq_kv < 0):
        return UNKNOWN
    hkv = heads if kv_heads is None else kv_heads
    dv = head_dim if head_dim_v is None else head_dim_v
    eq = element_size(dtype)
    ekv = eq if kv_dtype is None else element_size(kv_dtype)
    eo = eq if out_dtype is None else element_size(out_dtype)
    if eq is None or ekv is None or eo is None or hkv <= 0 or heads % hkv:
        return UNKNOWN
    if counted is None and (
            (window is not None and (not causal or window <= 0 or chunk is not None))
            or (chunk is not None and (not causal or chunk <= 0))):
        return UNKNOWN  # a two-sided band of known width only, or a layout not modelled
    mask_bytes = 0
    if mask or mask_shape is not None or mask_dtype is not None:
        em = element_size(mask_dtype)
        if em is None or mask_shape is None or not mask_shape or (
                left_padding is None and counted is None):
            return UNKNOWN  # what the mask hides, or its size, is not known
        elements = min(mask_shape[-1], seq_kv)
        for size in mask_shape[:-1]:
            elements *= size
        mask_bytes = elements * em
    if left_padding is not None and len(left_padding) != batch:
        return UNKNOWN
    if counted is not None:
        rows, keys = counted
    elif left_padding is None or not any(left_padding):  # no padding: one row, times the batch
        rows, keys = _rows_and_keys(seq_q, seq_kv, (0,), causal, window, chunk)
        rows, keys = rows * batch, keys * batch
    else:
        rows, keys = _rows_and_keys(seq_q, seq_kv, left_padding, causal, window, chunk)
    kv = keys * hkv * (head_dim * ekv + dv * ekv)
    total = rows * heads * head_dim * eq + kv + batch * heads * seq_q * dv * eo + mask_bytes
    intensity = flops / total if flops is not None and total > 0 else None
    return Traffic(total, kv if decode else None, intensity)
