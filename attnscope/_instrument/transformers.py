"""Hugging Face ``transformers`` (and look-alike) attention modules, recognised by structure.

A module is an attention layer when it owns query/key/value projections (separate or fused,
under the names used across model families) and says how many heads it has, on itself or its
``config``; the innermost such module wins (``BertSelfAttention``, not ``BertAttention``). Nothing
here imports ``transformers``: a model built with it is just an ``nn.Module`` to us.

The extractor reads, on the calling thread and before the call (the forward appends to the
cache): the hidden-state shape, the KV-cache length, the source length of cross-attention and
a reference to the attention mask. Head counts and head size are read once, when instrumenting.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from .._attention.families import (
    clip,
    config_window,
    fsmt,
    funnel,
    gemma3n,
    hrm,
    modernbert,
    mpt,
    zamba2,
)
from .._attention.families.base import layer_index
from .._attention.families.deepseek_v4 import tokens_seen
from .._attention.families.kept_keys import key_selection
from .._record.facts import NOT_READ, AttentionFacts, Facts, ModelFacts
from . import Extractor
from .facts import head_info, layer_traits
from .packed import unread_keys

__all__ = [
    "generate_facts",
    "head_info",
    "hidden_state_extractor",
    "is_attention_module",
    "model_extractor",
    "recorded_attention_classes",
]

_SEPARATE = (
    ("q_proj", "k_proj", "v_proj"),
    ("query", "key", "value"),
    ("q", "k", "v"),
    ("wq", "wk", "wv"),
    ("to_q", "to_k", "to_v"),
    ("q_lin", "k_lin", "v_lin"),
    ("query_proj", "key_proj", "value_proj"),
    ("q_head", "k_head", "v_head"),  # Funnel
)
_FUSED = ("c_attn", "query_key_value", "qkv_proj", "qkv", "Wqkv", "W_pack", "in_proj")
_CACHE = ("cache", "past_key_values", "past_key_value", "layer_past")
_SOURCE = ("key_value_states", "encoder_hidden_states")
_MASK = ("attention_mask", "mask")
_HIDDEN = ("hidden_states", "hidden", "x", "query")


def _has_projections(module: torch.nn.Module) -> bool:
    children = module._modules
    if any(all(name in children for name in group) for group in _SEPARATE):
        return True
    return any(name in children for name in _FUSED)


def recorded_attention_classes(model: Any) -> tuple[type, ...]:
    """Classes a transformers model declares as its attention layers (``_can_record_outputs``)."""
    found: list[type] = []
    for sub in (model, *getattr(model, "_modules", {}).values()):
        table = getattr(type(sub), "_can_record_outputs", None)
        if not isinstance(table, dict):
            continue
        entries = table.get("attentions")
        for entry in entries if isinstance(entries, (list, tuple)) else (entries,):
            cls = entry if isinstance(entry, type) else getattr(entry, "target_class", None)
            if isinstance(cls, type) and cls not in found:
                found.append(cls)
    return tuple(found)


def is_attention_module(module: torch.nn.Module, declared: tuple[type, ...] = ()) -> bool:
    """Structural test: q/k/v projections (or a class the model declares) plus a head count."""
    if isinstance(module, torch.nn.MultiheadAttention):
        return False
    if not (isinstance(module, declared) if declared else False) and not _has_projections(module):
        return False
    heads, _, head_dim, _ = head_info(module)
    return heads is not None and head_dim is not None


def _lookup(names: tuple[str, ...]) -> Any:
    index = {name: i for i, name in enumerate(names)}

    def get(args: tuple[Any, ...], kwargs: dict[str, Any], candidates: tuple[str, ...]) -> Any:
        for name in candidates:
            value = kwargs.get(name)
            if value is not None:
                return value
            i = index.get(name)
            if i is not None and i < len(args) and args[i] is not None:
                return args[i]
        return None

    return get


def _reader(names: tuple[str, ...], groups: tuple[tuple[str, ...], ...]) -> Any:
    """``_lookup(names)`` for fixed candidate sets, all read in one call (a list, one value per
    set; None for an empty set), their positions found once per module.

    The reader is one straight run of look-ups generated for the module (as ``namedtuple`` and
    ``dataclasses`` generate their methods): the extractor of a traced layer runs on every sampled
    call, between the model's ops, where each bytecode is paid again cold. A loop over the sets
    cost 5 µs a call there (a tiny Llama's ``generate()``), 2.1 µs in a tight loop against 0.75
    for this (in situ, the whole extractor went from 15.6-16.3 to 14.9-15.2 µs). Names go
    into the code only as string literals (``repr``), whatever a signature holds."""
    index = {name: i for i, name in enumerate(names)}
    lines = ["def read(args, kwargs):", "    n = len(args)", "    get = kwargs.get"]
    found = []
    for g, group in enumerate(groups):
        var = f"v{g}"
        found.append(var if group else "None")
        for k, name in enumerate(dict.fromkeys(group)):  # a name twice: read once
            pad = "        " if k else "    "
            if k:  # the next candidate only while none was found
                lines.append(f"    if {var} is None:")
            lines.append(f"{pad}{var} = get({name!r})")
            i = index.get(name)
            if i is not None:
                lines.append(f"{pad}if {var} is None and {i} < n:")
                lines.append(f"{pad}    {var} = args[{i}]")
    lines.append(f"    return [{', '.join(found)}]")
    namespace: dict[str, Any] = {}
    exec("\n".join(lines), namespace)  # noqa: S102  (literals only, see above)
    return namespace["read"]


def _past_length(cache: Any, layer_idx: int | None, cross: bool = False) -> Any:
    """KV-cache length before the call, with no device sync (static caches: a 0-d tensor copy);
    None without a cache, :data:`NOT_READ` for a cache whose length it cannot read.

    ``cross``: the layer attends to an encoder's output; an encoder-decoder cache keeps those
    keys apart (``cross_attention_cache``), filled by the first decoder step.
    """
    if cache is None:
        return None
    if isinstance(cache, (tuple, list)):  # legacy caches: tensors of shape (B, H, S, D)
        if cache and isinstance(cache[0], (tuple, list)):  # the model's: one tuple per layer
            idx = layer_idx if layer_idx is not None else 0
            return _past_length(cache[idx], None, cross) if idx < len(cache) else 0
        # one layer's (key, value), or (key, value, cross key, cross value) in encoder-decoders
        key = cache[2 if cross and len(cache) >= 4 else 0] if cache else None
        if key is None:  # nothing held yet
            return 0
        return key.shape[-2] if isinstance(key, torch.Tensor) and key.ndim >= 2 else NOT_READ
    part = "cross_attention_cache" if cross else "self_attention_cache"
    inner = getattr(cache, part, cache)
    layers = getattr(inner, "layers", None)
    idx = layer_idx if layer_idx is not None else 0
    if isinstance(layers, list):
        if idx >= len(layers):
            return 0
        layer = layers[idx]
        if not getattr(layer, "is_initialized", True):
            return 0
        # _sliding_held's first test, inlined: most layers are not sliding
        if layer_idx is not None and getattr(layer, "is_sliding", False) is True:
            held = _sliding_held(layer)
            if held is not None:
                return held
        getter = getattr(layer, "get_seq_length", None)
    else:
        getter = getattr(inner, "get_seq_length", None)
        if getter is not None and layer_idx is not None:
            length = getter(layer_idx)
            return length.detach().clone() if isinstance(length, torch.Tensor) else length
    if getter is None:
        return NOT_READ
    length = getter()
    if type(length) is int:  # the usual answer, first
        return length
    if isinstance(length, torch.Tensor):
        return int(length) if length.device.type == "cpu" else length.detach().clone()
    return length if isinstance(length, int) else NOT_READ


def _sliding_held(layer: Any) -> int | None:
    """Keys a sliding-window cache layer holds for the next call (window - 1 once full), or None
    for other layers. Its ``get_seq_length()`` is every token seen, not what it keeps: the keys
    this call attends are the held ones plus its own (``get_mask_sizes``). Host ints only."""
    if getattr(layer, "is_sliding", False) is not True:
        return None
    seen = getattr(layer, "cumulative_length_int", None)  # static: the int mirror of its tensor
    if seen is None:
        seen = getattr(layer, "cumulative_length", None)
    window = getattr(layer, "sliding_window", None) or getattr(layer, "max_cache_len", None)
    if not isinstance(seen, int) or not isinstance(window, int) or window < 1:
        return None
    return min(seen, window - 1)


def _kv_shared(module: Any, extract: Extractor) -> Extractor:
    """``extract`` for a KV-shared layer (Gemma 3n: :mod:`.._attention.families.gemma3n`)."""
    kind = gemma3n.shared_kind(module)
    if kind is None:
        return extract

    def shared(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Facts | None:
        out = extract(instance, args, kwargs)
        gemma3n.shared_past(out, kwargs, kind)
        return out

    return shared


def _traits_of(module: Any, bidirectional: bool) -> tuple[Any, bool, bool]:
    """(the layer's traits or None, whether they matter only with a cache, whether it has
    compressed keys: DeepSeek-V4). Chunked (Llama 4),
    blocked local (LongT5), encoder layers: derive reads them with the facts. An encoder layer's
    trait matters only with a cache: without one its facts stay alone (and their derive is kept
    per summary on the worker)."""
    traits = layer_traits(module, bidirectional)
    with_cache_only = (traits is not None and traits.chunk is None and traits.band is None
                       and not traits.config_window and traits.cores == 1
                       and traits.compressed is None)
    return traits, with_cache_only, traits is not None and traits.compressed is not None


def _cache_slot(layer_idx: int | None, call_idx: Any, offset: Any) -> int | None:
    """The cache layer a call reads: the layer's own index, or the one given with the call
    (:mod:`.._attention.families.zamba2`), moved by a per-call offset
    (:mod:`.._attention.families.hrm`)."""
    idx = zamba2.call_slot(call_idx) if call_idx is not None else layer_idx
    return hrm.offset_slot(idx, offset) if offset is not None else idx


def hidden_state_extractor(module: Any, names: tuple[str, ...],
                           bidirectional: bool = False) -> Extractor:
    """Extractor for an attention module whose forward takes hidden states (not q/k/v).

    ``names``: the forward's positional parameter names, ``self`` first.
    """
    if funnel.pooled_query(module):
        return _pooled_query_extractor(module, names)
    dims = head_info(module)
    layer_idx = layer_index(module)
    index_per_call = zamba2.index_per_call(layer_idx, names)
    offset_per_call = hrm.offset_per_call(layer_idx, names)
    time_first = fsmt.time_first(module)
    read = _mask_of_mapping(module, _reader(names, _argument_groups(
        module, names, time_first, index_per_call, offset_per_call)))
    # use_cache=True starts no cache in an encoder layer (transformers hands it to Pegasus',
    # M2M-100's ... encoder layers too); a cache object given is used whatever the flag says
    # (BertGeneration decodes with is_decoder=False layers)
    encoder = getattr(module, "is_decoder", None) is False
    # use_cache alone starts a cache only for a layer whose forward takes one (GPT-2's
    # layer_past); LayoutLM's and ESM's layers get it in **kwargs and keep none
    takes_cache = any(name in names for name in _CACHE)
    (key_cap, key_block), window = key_selection(module), config_window.layer_window(module)
    module_cross = getattr(module, "is_cross_attention", False) is True
    masked_where_true = mpt.masked_where_true(module)
    traits, with_cache_only, compressed = _traits_of(module, bidirectional)

    def extract(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Facts | None:
        # every argument the facts may need, in one pass: reading one that is not needed is free
        hidden, source, cache, use_cache, causal_mask, mask, call_idx, offset = read(args, kwargs)
        if not isinstance(hidden, torch.Tensor) or hidden.ndim < 2:
            return None
        facts = _facts_of(hidden.shape, time_first)
        facts.heads, facts.kv_heads, facts.head_dim, facts.head_dim_v = dims
        facts.dtype, facts.device = hidden.dtype, hidden.device
        idx = layer_idx
        if cache is not None:
            idx = _cache_slot(layer_idx, call_idx if index_per_call else None,
                              offset if offset_per_call else None)
            facts.cached = True
            facts.past = _past_length(cache, idx, module_cross or source is not None)
            if facts.past is NOT_READ:
                unread_keys(facts, mask, kwargs)
        elif use_cache is True and takes_cache and not encoder:  # _starts_cache
            facts.cached, facts.past = True, 0
        if isinstance(source, torch.Tensor) and source.ndim >= 2:
            facts.seq_kv = source.shape[0] if time_first else source.shape[-2]
            facts.keys_masked = mask is not None
        elif module_cross:
            facts.seq_kv = None  # cross-attention with cached source keys: length unknown here
            return None
        else:
            flag = kwargs.get("is_causal")
            causal = flag if isinstance(flag, bool) else getattr(instance, "is_causal", False)
            # a causal mask of its own (:mod:`.._attention.families.clip`, FSMT's attn_mask)
            facts.causal = causal is True or causal_mask is not None
            facts.window = window if facts.causal else None
            facts.mask = mask
            if facts.mask is None:
                facts.mask = causal_mask
            elif causal_mask is not None:
                facts.causal_apart = True
            facts.mask_ignores = masked_where_true or time_first  # FSMT: True = padding
            facts.key_cap, facts.key_block = key_cap, key_block
            if compressed and traits is not None:  # its entries follow the tokens seen
                seen = 0 if cache is None else tokens_seen(cache, idx)
                return Facts(facts, traits._replace(seen=seen))
            if traits is not None and (facts.cached or not with_cache_only):
                return Facts(facts, traits)
        return Facts(facts)

    return _kv_shared(module, extract)


def _pooled_query_extractor(module: Any, names: tuple[str, ...]) -> Extractor:
    """Funnel's attention: ``(query, key, value, attention_inputs)``, bidirectional, no cache
    (:func:`.._attention.families.funnel.pooled_facts`)."""
    dims = head_info(module)
    read = _reader(names, (("query",), ("key",), ("attention_inputs",)))

    def extract(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Facts | None:
        query, key, inputs = read(args, kwargs)
        return funnel.pooled_facts(query, key, inputs, dims)

    return extract


def model_extractor(model: Any, names: tuple[str, ...]) -> Extractor:
    """Extractor for a whole model's forward: batch, prompt tokens (padding excluded), cache."""
    get = _lookup(names)

    def extract(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Facts | None:
        facts = _model_facts(get, args, kwargs)
        return None if facts is None else Facts(model=facts)

    return extract


def _model_facts(get: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelFacts | None:
    # An encoder-decoder model's forward under generate() has no input ids (the encoder ran
    # before): its tokens are the decoder's, and ``attention_mask`` is the encoder's padding
    mask_name = "attention_mask"
    ids = get(args, kwargs, ("input_ids", "inputs"))
    if ids is None and (ids := get(args, kwargs, ("decoder_input_ids",))) is not None:
        mask_name = "decoder_attention_mask"
    if isinstance(ids, torch.Tensor) and ids.ndim == 2 and not ids.is_floating_point():
        facts = ModelFacts(ids.shape[0], ids.shape[1])
    else:
        embeds = get(args, kwargs, ("inputs_embeds",))
        if embeds is None and (embeds := get(args, kwargs,
                                             ("decoder_inputs_embeds",))) is not None:
            mask_name = "decoder_attention_mask"
        if not isinstance(embeds, torch.Tensor) or embeds.ndim != 3:
            return None
        facts = ModelFacts(embeds.shape[0], embeds.shape[1])
    mask = get(args, kwargs, (mask_name,))
    if isinstance(mask, torch.Tensor) and mask.ndim in (2, 4):
        facts.mask = mask
    cache = get(args, kwargs, _CACHE)
    if cache is not None:
        facts.cached = True
        facts.past = _past_length(cache, None)
        if facts.past is NOT_READ:
            unread_keys(facts, mask, kwargs)
    elif _starts_cache(get, args, kwargs):
        facts.cached, facts.past = True, 0
    return facts


def _mask_of_mapping(module: Any, read: Any) -> Any:
    """``read`` for a layer handed its masks as a mapping (Zaya: ``{"causal": ..., "conv": ...}``,
    its forward's ``attention_mask: dict``): the attention's mask is the causal one. Others'
    ``read`` unchanged, at no cost per call."""
    try:
        hint = inspect.signature(type(module).forward).parameters["attention_mask"].annotation
    except (KeyError, TypeError, ValueError):  # no such parameter, or no signature
        return read
    if "dict" not in str(hint):
        return read

    def mapped(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        found: list[Any] = read(args, kwargs)
        if isinstance(found[5], Mapping):  # _argument_groups: the mask is sixth
            found[5] = found[5].get("causal")
        return found

    return mapped


def _argument_groups(module: Any, names: tuple[str, ...], time_first: bool,
                     index_per_call: bool,
                     offset_per_call: bool = False) -> tuple[tuple[str, ...], ...]:
    """What :func:`hidden_state_extractor` reads, in its order: hidden states, source, cache,
    use_cache, causal mask, mask, layer index, cache-slot offset (an empty group: nothing to
    read)."""
    if time_first:  # FSMT: (query, key, key_padding_mask, layer_state, attn_mask), (T, B, C)
        return (("query",), ("key",) if module.encoder_decoder_attention else (),
                ("layer_state",), (), ("attn_mask",), ("key_padding_mask",), (), ())
    return (
        tuple(n for n in (*_HIDDEN, *names[1:2]) if n),
        _SOURCE,
        _CACHE,
        ("use_cache",),  # _starts_cache
        clip.CAUSAL_MASK,
        modernbert.mask_names(module, _MASK),
        zamba2.INDEX if index_per_call else (),
        hrm.OFFSETS if offset_per_call else (),
    )


def _facts_of(shape: Any, time_first: bool) -> AttentionFacts:
    if time_first and len(shape) == 3:
        return AttentionFacts(shape[1], shape[0])
    return AttentionFacts(shape[0], shape[1]) if len(shape) >= 3 else AttentionFacts(1, shape[0])


def _starts_cache(get: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """No cache yet, but ``use_cache=True``: the call starts one (a prefill).

    Tuple-cache models (GPT-2 up to transformers 4.51 at least, GPT-Neo 4.44, a manual decode
    loop's first call) pass ``layer_past=None`` / ``past_key_values=None`` on the first step and
    build the cache from this call's keys; their layers are told so by ``use_cache``.
    """
    return get(args, kwargs, ("use_cache",)) is True


def generate_facts(model: Any, names: tuple[str, ...]) -> Any:
    """(args, kwargs) -> ModelFacts for a ``generate()`` call; the output is added afterwards."""
    get = _lookup(names)

    def facts(args: tuple[Any, ...], kwargs: dict[str, Any]) -> ModelFacts | None:
        found = _model_facts(get, args, kwargs)
        if found is None:
            return None
        found.generate = True
        found.cached = False
        found.eos = _eos_ids(model, kwargs)
        if getattr(getattr(model, "config", None), "is_encoder_decoder", False) is True:
            # the output holds decoder ids: the decoder prompt (default: the start token), then new
            start = kwargs.get("decoder_input_ids")
            found.prompt_len = start.shape[-1] if isinstance(start, torch.Tensor) else 1
        elif get(args, kwargs, ("input_ids", "inputs")) is None:
            # a prompt of embeddings only: the output holds the new tokens alone
            found.prompt_len = 0
        return found

    return facts


def _eos_ids(model: Any, kwargs: dict[str, Any]) -> tuple[int, ...]:
    config = kwargs.get("generation_config") or getattr(model, "generation_config", None)
    eos = kwargs.get("eos_token_id", getattr(config, "eos_token_id", None))
    if isinstance(eos, int) and not isinstance(eos, bool):
        return (eos,)
    if isinstance(eos, (list, tuple)):
        return tuple(e for e in eos if isinstance(e, int) and not isinstance(e, bool))
    return ()
