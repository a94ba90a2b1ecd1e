"""Shapes, heads, tokens and exact FLOPs of one call, from what the calling thread recorded.

Runs on the worker. The inputs are a call's argument summary (:class:`TensorMeta`, scalars, mask
references) or the facts an instrument() extractor gathered. Token counts read masks here, after
the call; no tensor value is ever recorded, only counts.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

import torch

from .._attention.families import diffllama, llama4, longt5
from .._attention.families.config_window import builds_masks as _builds_masks
from .._attention.families.config_window import window_unapplied
from .._attention.flops import attention_flops, causal_pairs, window_pairs
from .._attention.masks import (
    MaskCounts,
    MaskReading,
    counts_of,
    left_padding,
    positions_tokens,
    read_counts,
    shown_pairs,
)
from .._attention.traffic import attention_traffic
from .._instrument.facts import head_info
from .._record.capture import (
    MASK_NAMES,
    NO_FACTS,
    AttentionFacts,
    Facts,
    HostCopy,
    HostKind,
    LayerTraits,
    ModelFacts,
    TensorMeta,
    find_qkv,
)
from .._record.reduce import query_key_shape
from .._runtime import runtime
from . import beyond_mask
from .model import as_int as _as_int
from .model import derive_model, host_readable
from .result import ARGUMENTS, HIDDEN, LAYER, Derived

__all__ = ["derive", "causal_pairs", "window_pairs", "attention_flops", "count_tokens",
           "host_rss_bytes", "host_readable"]

_Q_NAMES = ("query", "q", "query_states")
_HIDDEN_NAMES = ("hidden_states", "hidden", "x", "inputs_embeds")
_CAUSAL_NAMES = ("is_causal", "causal")


# ---- exact counts -------------------------------------------------------------------------------


def count_tokens(mask: torch.Tensor, batch: int, sq: int, ignores: bool = False) -> int | None:
    """Real (unpadded) query tokens given an attention or padding mask, or None if unknown.

    A key position is real when some query may attend to it; the queries are the last ``sq`` key
    positions (KV-cache layout). Bool masks: True = attend (a mask with a query axis whose diagonal
    says otherwise is read the other way round). Float masks: additive, very negative = masked.
    2-D masks are ``(batch, keys)`` padding masks (1 = real).
    """
    counts = counts_of(mask, ignores, batch, None, sq, None)
    return None if counts is None else read_counts(counts, batch, None, sq, None)[1]


# ---- derive on the worker ----------------------------------------------------------------------


def _find(summary: Mapping[str, Any], names: Sequence[str]) -> Any:
    for name in names:
        if name in summary:
            return summary[name]
    return None


def derive(summary_list: Sequence[tuple[str, Any]], instance: Any = None,
           device_reads: bool = True, facts: Facts = NO_FACTS) -> Derived:
    """The attention facts of a call (:class:`.derived.Derived`), from an ``instrument()``
    extractor's ``facts`` when it has them, else from its argument summary.

    No device tensor is read here (that would be a host sync on the worker): the calling thread
    left counts in pinned memory instead (:class:`HostCopy`), read unless ``device_reads=False``
    (the call's events timed out: the copies may not have landed).
    """
    if facts.attention is not None:
        traits = facts.traits
        return derive_attention(_unread_facts(facts.attention, device_reads), traits,
                                traits is not None and traits.config_window
                                and _builds_masks(instance))
    if facts.model is not None:
        return derive_model(_unread_facts(facts.model, device_reads))
    summary_list = [(k, _unread(v, device_reads)) for k, v in summary_list]
    return _derive_arguments(dict(summary_list), summary_list, instance)


def _derive_arguments(summary: dict[str, Any], summary_list: Sequence[tuple[str, Any]],
                      instance: Any) -> Derived:
    """Attributes of a traced function or forward, from its argument summary."""
    out = Derived(order=ARGUMENTS)
    causal = _find(summary, _CAUSAL_NAMES)
    if not isinstance(causal, bool):
        inst_causal = getattr(instance, "is_causal", None) if instance is not None else None
        causal = inst_causal if isinstance(inst_causal, bool) else None
    mask = _find(summary, tuple(MASK_NAMES))
    # nn.MultiheadAttention's key_padding_mask marks padding with True: the opposite of the rest.
    ignores = "key_padding_mask" in summary and mask is summary["key_padding_mask"]
    qkv = find_qkv(list(summary_list))
    if qkv is not None:
        causal = _qkv_attributes(out, qkv, mask, ignores, causal)
    else:
        hidden = _find(summary, _HIDDEN_NAMES)
        if _meta(hidden) and len(hidden[0]) == 3:
            b, s, width = hidden[0]
            out.order = HIDDEN
            out.batch_size, out.seq_len_q = b, s
            out.dtype, out.device = _dtype_name(hidden[1]), str(hidden[2])
            heads, kv_heads, head_dim, _ = head_info(instance) if instance is not None else (
                None, None, None, None)
            if heads and not head_dim and width % heads == 0:
                head_dim = width // heads
            if heads and head_dim:
                out.num_heads, out.num_kv_heads, out.head_dim = heads, kv_heads, head_dim
            _tokens(out, mask, b, s, ignores)
        else:
            for meta in (_find(summary, _Q_NAMES), hidden):
                if _meta(meta):
                    out.order = HIDDEN
                    out.dtype, out.device = _dtype_name(meta[1]), str(meta[2])
                    break
    if causal is not None and out.seq_len_q is not None:
        out.causal = bool(causal)
    return out


def _qkv_attributes(out: Derived, qkv: tuple[TensorMeta, TensorMeta, TensorMeta],
                    mask: Any, ignores: bool, causal: bool | None) -> bool | None:
    """Shapes, FLOPs and tokens of a (q, k, v) call; returns the causality that holds.

    A mask with a query axis decides causality, the window and the visible pairs, as for
    instrumented layers (an SDPA call given a model's 4-D mask has ``is_causal=False``)."""
    q, k, v = qkv
    b, hq, sq, d = q.shape
    hkv, skv, dv = k.shape[1], k.shape[2], v.shape[3]
    out.batch_size, out.num_heads, out.num_kv_heads, out.head_dim = b, hq, hkv, d
    out.seq_len_q, out.seq_len_kv = sq, skv
    out.dtype, out.device = _dtype_name(q.dtype), str(q.device)
    if not ignores:  # key_padding_mask is (B, Skv) by its own definition
        mask = _query_key(mask, b, sq)
    counts = counts_of(mask, ignores, b, hq, sq, skv, count=runtime.masks.numbers)
    reading, real = (None, None) if counts is None else read_counts(counts, b, hq, sq, skv)
    if reading is not None and reading.causal is not None:
        causal = reading.causal
    window = reading.window if reading is not None else None
    if window:
        out.sliding_window = window
    if reading is not None and reading.pairs is not None:
        out.flops = 2 * reading.pairs * (d + dv)
    else:
        out.flops = attention_flops(b, hq, sq, skv, d, dv, bool(causal), window)
    if isinstance(mask, (torch.Tensor, TensorMeta, HostCopy)):
        _mark_mask(out, mask, counts, reading, hq)
    if out.exact is None:
        _traffic(out, (b, hq, hkv, sq, skv, d, dv), _dtype_name(k.dtype), bool(causal), mask,
                 ignores, counts, real, reading, None)
    if counts is not None:
        if real is not None:
            out.tokens = real
    else:
        _tokens(out, mask, b, sq, ignores)
    return causal


def _query_key(mask: Any, batch: int, sq: int) -> Any:
    """``mask`` viewed as ``(1, 1, Sq, Skv)`` when it can only be SDPA's 2-D ``(Sq, Skv)`` mask
    (:func:`.._record.reduce.query_key_shape`), else as it is: then it is read like a 4-D mask
    (causality, window, exact pairs) and its bytes stay the same."""
    if isinstance(mask, (torch.Tensor, TensorMeta)):
        shape = query_key_shape(tuple(mask.shape), batch, sq)
        if shape is not None:
            return mask.view(shape) if isinstance(mask, torch.Tensor) \
                else mask._replace(shape=shape)
    return mask


def _traffic(out: Derived, dims: tuple[int, int, int, int, int, int, int], kv_dtype: str | None,
             causal: bool, mask: Any, ignores: bool, counts: MaskCounts | None, real: int | None,
             reading: MaskReading | None, chunk: int | None) -> None:
    """Least bytes, the decode KV read and FLOPs/bytes (:mod:`.traffic`), for a call whose FLOPs
    are exact. ``dims``: (B, Hq, Hkv, Sq, Skv, Dk, Dv). A mask's rows and keys come from its
    counts where they decide them (decode: the one query reads the keys it sees; Sq = Skv: each
    real query sees itself), else from a host mask's left padding over a causal band; a mask of
    another kind, or whose layout capture did not record (a CUDA mask today), leaves them out."""
    b, hq, hkv, sq, skv, d, dv = dims
    counted = pads = shape = mask_dtype = None
    if mask is not None:
        meta = mask if isinstance(mask, (torch.Tensor, TensorMeta)) else None
        if meta is None or len(meta.shape) < 2:
            return
        shape, mask_dtype = tuple(meta.shape), _dtype_name(meta.dtype)
        shown = shown_pairs(counts) if counts is not None else None
        if real is not None and sq == skv:
            counted = (real, real)
        elif real is not None and shown is not None and sq == 1 and (
                len(shape) < 4 or shape[1] == 1):
            counted = (real, shown // hq)
        elif isinstance(mask, torch.Tensor) and reading is not None and reading.causal:
            pads = left_padding(mask, ignores, b)
        if counted is None and pads is None:
            return
    t = attention_traffic(b, hq, hkv, sq, skv, d, dv, out.dtype, kv_dtype=kv_dtype,
                          causal=causal, window=out.sliding_window,
                          chunk=chunk if counted is None else None, left_padding=pads,
                          counted=counted, mask_shape=shape, mask_dtype=mask_dtype,
                          mask=mask is not None, decode=out.phase == "decode", flops=out.flops)
    out.bytes_moved, out.kv_bytes_read, out.arithmetic_intensity = t


def _tokens(out: Derived, mask: Any, batch: int, sq: int, ignores: bool = False) -> None:
    if isinstance(mask, TensorMeta):  # a mask over the keeping budget: padding unknown
        return
    if isinstance(mask, HostCopy):
        tokens = positions_tokens(mask, batch, sq) if mask.kind is HostKind.POSITIONS else None
    elif not isinstance(mask, torch.Tensor):
        out.tokens = batch * sq
        return
    else:
        tokens = count_tokens(mask, batch, sq, ignores)
    if tokens is not None:  # a mask we could not read: padding unknown, so no token count at all
        out.tokens = tokens


def _meta(value: Any) -> bool:
    return isinstance(value, TensorMeta)


def _dtype_name(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


_UNREAD = TensorMeta((), None, None)  # a value not read: counts that need it are left out


def _unread(value: Any, device_reads: bool) -> Any:
    """``value`` with what the worker must not read (device tensors; pinned copies when the
    events timed out) replaced by metadata."""
    if isinstance(value, torch.Tensor):
        return TensorMeta.of(value) if value.is_cuda else value
    if isinstance(value, HostCopy):
        return value if device_reads else _UNREAD
    return value


_Facts = TypeVar("_Facts", AttentionFacts, ModelFacts)


def _unread_facts(value: _Facts, device_reads: bool) -> _Facts:
    """The facts with their values as :func:`_unread` leaves them: a copy when any changed (the
    capture's own facts are never written)."""
    fields = [(name, getattr(value, name, None)) for name in ("mask", "past", "output")]
    changed = [(name, _unread(v, device_reads)) for name, v in fields
               if isinstance(v, (torch.Tensor, HostCopy))]
    if any(new is not getattr(value, name) for name, new in changed):
        value = copy.copy(value)
        for name, new in changed:
            setattr(value, name, new)
    return value


def derive_attention(f: AttentionFacts, traits: LayerTraits | None = None,
                     builds_masks: bool = False) -> Derived:
    """Span attributes of one attention layer call (QK^T and PV only; projections excluded).

    Causality, the window and the visible pairs come from the mask the layer received when it
    has a query axis (see :mod:`.masks`); the module's attributes only when there is none.
    ``traits``: what the layer's structure adds (chunked attention: :func:`_chunked`; blocks
    of its own: :func:`_banded`; an encoder layer: not causal on a one-query step).
    ``builds_masks``: :func:`_builds_masks` of the layer.
    """
    chunk, band = (traits.chunk, traits.band) if traits is not None else (None, None)
    b, sq = f.batch, f.seq_q
    past = _as_int(f.past)
    # a cache length on the device whose copy was not read (timed out): the keys are unknown
    keys_known = f.seq_kv is not None or past is not None or f.past is None
    skv = f.seq_kv if f.seq_kv is not None else (past or 0) + sq
    self_mask = f.seq_kv is None and not isinstance(f.mask, TensorMeta) and f.mask is not None
    counts, reading, real = _read_mask(f, traits, skv if keys_known else None, self_mask)
    causal, window, mask_pairs = _structure(f, reading, traits, skv, builds_masks)
    out = Derived(batch_size=b, seq_len_q=sq, causal=causal, order=LAYER)
    if keys_known:
        out.seq_len_kv = skv
    if f.dtype is not None:
        out.dtype = _dtype_name(f.dtype)
    if f.device is not None:
        out.device = str(f.device)
    if f.cached and keys_known:
        if f.packed_q is None:  # packed sequences: the keys held are no one row's cache
            out.kv_cache_len = past or 0
        out.phase = "decode" if past and (sq if f.packed_q is None else f.packed_q) == 1 \
            else "prefill"
    if f.heads and f.head_dim:
        kv_heads = f.kv_heads or f.heads
        dv = f.head_dim_v or f.head_dim
        out.num_heads, out.num_kv_heads, out.head_dim = f.heads, kv_heads, f.head_dim
        if window:
            out.sliding_window = window
        if reading is not None and reading.pairs is not None and mask_pairs:
            out.flops = 2 * reading.pairs * (f.head_dim + dv)
        elif keys_known:
            out.flops = attention_flops(b, f.heads, sq, skv, f.head_dim, dv, causal, window)
        if keys_known and beyond_mask.narrows(f, skv):
            beyond_mask.cap_keys(out, f, reading, real, causal, window, skv, dv)
    if band is not None and keys_known and _banded(out, f, band, skv):
        return out
    cores = traits.cores if traits is not None else 1
    if cores != 1 and out.flops is not None:  # DiffLlama: one map per core
        out.flops = diffllama.cores_flops(out.flops, cores)
    entries = (beyond_mask.add_compressed(out, f, traits.compressed, traits.seen, real)
               if traits is not None and traits.compressed is not None and keys_known else 0)
    if not keys_known:
        out.inexact("cache_unread")
    elif chunk is not None and self_mask and _chunked(out, f, counts, real, chunk, skv, past):
        pass  # the chunk layout counted (or marked) from the mask
    elif self_mask or isinstance(f.mask, TensorMeta):
        _mark_mask(out, f.mask, counts, reading, f.heads)
    # several cores' least traffic is no one kernel's: not established, left out
    if (keys_known and f.heads and f.head_dim and out.exact is None and out.flops is not None
            and cores == 1 and not entries and not beyond_mask.narrows(f, skv)
            and (f.mask is None or f.seq_kv is None) and not f.keys_masked):
        _traffic(out, (b, f.heads, f.kv_heads or f.heads, sq, skv, f.head_dim,
                       f.head_dim_v or f.head_dim), None, causal, f.mask, f.mask_ignores, counts,
                 real, reading, chunk)
    if isinstance(f.mask, TensorMeta):  # a mask over the keeping budget: padding unknown
        return out
    if f.mask is None or f.seq_kv is not None:
        out.tokens = b * sq
    else:  # a mask that could not be read (timed out, a layout not understood): no count
        out.tokens = real
    return out


def _banded(out: Derived, f: AttentionFacts, band: tuple[int, int], skv: int) -> bool:
    """FLOPs and window of a blocked layer (LongT5: :func:`.._attention.families.longt5.banded`).
    True: the tokens were counted too, from a blocked host mask (a local layer's); False: the
    mask, if any, is left to the usual reading (a transient-global layer's padding mask), or to
    its mark (a blocked mask on a device: no token count)."""
    if not f.heads or not f.head_dim or f.seq_kv is not None:
        return False
    found = longt5.banded(f.batch, f.heads, f.seq_q, skv, f.head_dim, f.head_dim_v or f.head_dim,
                          band, f.mask, f.mask_ignores)
    out.flops, out.sliding_window = found.flops, found.window
    if found.tokens is None:
        return False
    out.tokens = found.tokens
    return True


def _chunked(out: Derived, f: AttentionFacts, counts: MaskCounts | None, real: int | None,
             chunk: int, skv: int, past: int | None) -> bool:
    """FLOPs of a chunked layer (Llama 4: :func:`.._attention.families.llama4.chunked_flops`)
    from the mask it received, marked ``mask_unread`` where they are an upper bound; False: not
    counted here (no pairs shown, no head count)."""
    shown = shown_pairs(counts) if counts is not None else None
    if shown is None or not f.heads or not f.head_dim:
        return False
    out.flops, exact = llama4.chunked_flops(
        f.batch, f.heads, f.seq_q, skv, f.head_dim, f.head_dim_v or f.head_dim, chunk, shown,
        real, f.mask, f.mask_ignores, past)
    if not exact:
        out.inexact("mask_unread")
    return True


def _mark_mask(out: Derived, mask: Any, counts: MaskCounts | None,
               reading: MaskReading | None, heads: int | None) -> None:
    """Mark ``out`` inexact when a self-attention mask was given but not read: its FLOPs then
    come from the layer's own causality and window (an upper bound: a mask only hides pairs)."""
    if isinstance(mask, TensorMeta):
        out.inexact("mask_not_kept")
    elif counts is None or (not counts.plan.structure and counts.plan.token_scale is None):
        out.inexact("mask_unread")  # nothing read of it (a layout with no plan)
    elif counts.plan.structure and heads and (reading is None or reading.pairs is None):
        out.inexact("mask_unread")


def _read_mask(f: AttentionFacts, traits: LayerTraits | None, skv: int | None, self_mask: bool
               ) -> tuple[MaskCounts | None, MaskReading | None, int | None]:
    """A self-attention mask's counts, what they say, and its real query tokens (``skv``: None
    when the keys are not known)."""
    counts = counts_of(f.mask, f.mask_ignores, f.batch, f.heads, f.seq_q, skv,
                       count=runtime.masks.numbers) if self_mask else None
    if counts is None:
        return None, None, None
    reading, real = read_counts(counts, f.batch, f.heads, f.seq_q, skv)
    if reading is not None and skv is not None:
        reading = _one_query(reading, f, traits is not None and traits.config_window, skv)
    return counts, reading, real


def _one_query(reading: MaskReading, f: AttentionFacts, config_window: bool,
               skv: int) -> MaskReading:
    """One query over a cache whose mask hides some keys: no later key exists, so the mask
    cannot show causality, and the hidden keys are padding (no query sees them) unless a window
    hides them, which this layer declares none of: the padded shape's pairs hold (every
    left-padded decode step of a batched ``generate()``)."""
    if (reading.causal is None and reading.pairs is None and f.seq_q == 1 and f.heads
            and f.window is None and not config_window):
        return reading._replace(pairs=f.batch * f.heads * skv)
    return reading


def _structure(f: AttentionFacts, reading: MaskReading | None, traits: LayerTraits | None,
               skv: int, builds_masks: bool) -> tuple[bool, int | None, bool]:
    """(causal, window, the mask's pairs hold): what the mask shows, else the module's attributes.

    A causal layer that declares a narrower window than its mask shows applies it itself (GPT-Neo's
    local layers: a plain causal mask, the window in the module's own buffer): the window is the
    module's then, and the mask's pair count does not hold. A window from the config only
    (``config_window``) is applied by the mask the model builds: a causal mask over more keys
    than the window that shows none says the layer does not apply it; so does no mask at all
    from a model that builds them (``builds_masks``: Moshi's config window under sdpa)."""
    if f.causal_apart:  # the mask holds padding only: the layer applies causality on its own
        return f.causal, f.window if f.causal else None, False
    bidirectional = traits is not None and traits.bidirectional
    config_window = traits is not None and traits.config_window
    causal = f.causal if reading is None or reading.causal is None else reading.causal
    if not causal and not bidirectional and (reading is None or reading.causal is None) \
            and f.cached and f.seq_kv is None and f.seq_q == 1:
        # One query over the keys a cache holds: a mask cannot show causality there (the query
        # sees every key either way), and a self-attention keeps a cache to decode token by
        # token, which is causal (XGLM, MVP, NLLB-MoE: no is_causal attribute, the mask is it);
        # not an encoder's layer given a cache (BERT-style models run as causal LMs without
        # is_decoder=True), bidirectional on its multi-token calls too.
        causal = True
    own = f.window if causal and f.window else None
    if config_window and window_unapplied(own, skv, reading, builds_masks, f.mask):
        return causal, None, True
    if reading is not None and reading.window is not None:
        if own is not None and own < reading.window:
            return causal, own, False
        return causal, reading.window, True
    return causal, own, own is None


def host_rss_bytes() -> int | None:
    """Resident set size of this process (:meth:`attnscope._runtime.host.HostMemory.rss`)."""
    return runtime.host.rss()
