"""Tiny models of transformers architectures, and what each model itself says its attention did.

Not a test module: ``tests/test_arch_sweep.py`` uses it. A config is shrunk by overriding the
attribute names that configs share (width, layers, heads, vocabulary, feed-forward sizes...);
the reference is the model run with eager attention and ``output_attentions=True``: the softmax
weights' shapes give batch, heads, Sq and Skv, a (query, key) pair is visible when its weight is
not zero, and torch's FLOP counter gives each attention module's QKᵀ and PV matmul FLOPs over
the full (B, H, Sq, Skv) block, hence its Dqk + Dv. Nothing here is read from attnscope.
"""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NamedTuple

import torch
import transformers
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["FEATURES", "Reference", "Weights", "build", "causal_shown", "inputs_for", "padded",
           "quiet", "reference", "tiny_overrides"]

WIDTH, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB, POSITIONS = 32, 4, 2, 8, 64, 96, 64
_SET: dict[tuple[str, ...], int] = {
    ("hidden_size", "d_model", "n_embd", "embed_dim", "n_embed", "model_dim",
     "projection_size"): WIDTH,
    ("num_attention_heads", "n_head", "n_heads", "num_heads", "encoder_attention_heads",
     "decoder_attention_heads", "num_decoder_attention_heads"): HEADS,
    ("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"): KV_HEADS,
    ("head_dim", "attention_head_size", "kv_channels", "d_kv", "head_size"): HEAD_DIM,
    ("intermediate_size", "ffn_dim", "encoder_ffn_dim", "decoder_ffn_dim", "n_inner", "d_ff",
     "ffn_hidden_size", "moe_intermediate_size", "shared_expert_intermediate_size",
     "expert_intermediate_size", "dense_intermediate_size"): FFN,
    ("vocab_size",): VOCAB,
    ("max_position_embeddings", "n_positions", "n_ctx", "max_seq_len", "seq_length",
     "max_target_positions", "max_sequence_length"): POSITIONS,
    ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"): 4,
    ("num_experts_per_tok", "moe_topk"): 2,
    ("kv_lora_rank", "q_lora_rank"): 16,
    ("qk_nope_head_dim", "v_head_dim"): 8,  # MLA: Dqk = nope + rope = 12, Dv = 8
    ("qk_rope_head_dim", "rotary_dim"): 4,
    ("sliding_window", "window_size", "attention_window_size", "local_attention"): 4,
    ("n_group", "topk_group", "first_k_dense_replace"): 1,
    ("image_size",): 32,
    ("patch_size",): 8,
    ("num_mel_bins",): 16,
    ("vocab_size_per_layer_input",): VOCAB,  # Gemma 4's per-layer token embeddings
    ("hidden_size_per_layer_input",): 8,
    ("max_source_positions",): 16,
}
_LAYERS = ("num_hidden_layers", "num_layers", "n_layer", "n_layers", "encoder_layers",
           "decoder_layers", "num_decoder_layers")
_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
              "sep_token_id", "cls_token_id")


_MAMBA2 = {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_n_groups": 1, "mamba_d_state": 4,
           "mamba_chunk_size": 4}
# What makes a family's attention different, switched on at the sweep's sizes (8 tokens, a
# generate of 3 more): config keywords over the tiny overrides. The window (4) and layer kinds of
# the other families come from tiny_overrides already.
FEATURES: dict[str, dict[str, Any]] = {
    # chunked layers: a chunk of 4 (the previous chunk's keys hidden) beside a full layer
    "llama4_text": {"attention_chunk_size": 4, "no_rope_layers": [1, 0]},
    "doge": {"keep_window_size": 4},  # the dynamic top-k mask keeps 4 of the 8 keys
    # hybrids: one attention layer and one state-space (or convolution) mixer
    "jamba": {"attn_layer_period": 2, "attn_layer_offset": 1, "expert_layer_period": 2,
              "expert_layer_offset": 1, "mamba_d_state": 4, "mamba_dt_rank": 4,
              "use_mamba_kernels": False},
    # (layer_types None: the kinds follow from the other keywords, not from a list)
    "bamba": {"attn_layer_indices": [1], "num_hidden_layers": 2, "layer_types": None, **_MAMBA2},
    "falcon_h1": {"mamba_d_ssm": 64, "layer_types": None, **_MAMBA2},
    "granitemoehybrid": {"layer_types": ["mamba", "attention"], **_MAMBA2},
    "zamba2": {"layers_block_type": ["mamba", "hybrid"], "mamba_d_state": 4, "n_mamba_heads": 4,
               "mamba_ngroups": 1, "use_mamba_kernels": False, "num_mem_blocks": 1},
    "lfm2": {"layer_types": ["conv", "full_attention"]},
    "xmod": {"default_language": "en_XX"},  # its adapters need a language to run
    # KV sharing: the last two layers (one of each kind) read the cache of the first two
    "gemma3n_text": {"layer_types": ["sliding_attention", "full_attention"] * 2,
                     "num_kv_shared_layers": 2, "intermediate_size": [FFN] * 4,
                     "activation_sparsity_pattern": [0.0] * 4, "laurel_rank": 4,
                     "altup_num_inputs": 2},
    # its default config names no rotary parameters for its layer kind
    "cohere_compass_text": {"rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 10000.0}}},
    # Griffin: a recurrent (RG-LRU) block beside local attention; its kinds come from block_types
    "recurrent_gemma": {"layer_types": None, "block_types": ["recurrent", "attention"],
                        "lru_width": 32},
    "zaya": {"num_experts_per_tok": 1},  # its router takes one expert only
    # MLA beside a sliding layer whose heads are as wide as MLA's query heads (nope + rope)
    **dict.fromkeys(("dots3_note", "dots3_note_text"), {"head_dim": 12}),
    # indexed attention: per query, the top 2 of its visible keys' blocks of 2 (a budget of 4
    # tokens) and the keys past its last whole block
    "qwen4_exp_text": {"indexer_n_heads": 2, "indexer_kv_heads": 1, "indexer_head_dim": 8,
                       "indexer_budget": 4, "indexer_compress_ratio": 2},
    "lfm2_moe": {"layer_types": ["conv", "full_attention"], "num_dense_layers": 1},
    # compressed KV beside the window: a plain sliding layer, a compressed-sparse one (an entry
    # per 2 tokens, its indexer keeping the top 2) and a heavily compressed one (an entry per 4)
    "deepseek_v4": {"layer_types": ["sliding_attention", "compressed_sparse_attention",
                                    "heavily_compressed_attention"],
                    "compress_rates": {"compressed_sparse_attention": 2,
                                       "heavily_compressed_attention": 4},
                    "index_topk": 2, "index_n_heads": 2, "index_head_dim": 8},
}


def causal_shown(w: torch.Tensor) -> bool | None:
    """Whether eager weights ``(B, H, Sq, Skv)`` are causal (bottom-right aligned): no query
    weighs a later key; None for one query, where weights cannot show it."""
    sq, skv = w.shape[-2:]
    if sq < 2:
        return None
    later = torch.ones(sq, skv, dtype=torch.bool).triu(skv - sq + 1)
    return not bool((w[..., later] != 0).any())


def padded(model: Any, c: Weights, mask: torch.Tensor) -> Weights:
    """The reference of call ``c`` (plain input) for the same batch padded by ``mask``. Padding
    does not reduce FLOPs (kernels compute padded positions): ``c`` itself, unless the layer's
    structure moves with the padding — a chunked layer's chunks start at each row's first real
    token (transformers' ``chunked_overlay``): then the pairs of transformers' own chunked mask
    function over the padded batch, padding not hidden, as the weights."""
    from transformers.masking_utils import chunked_causal_mask_function

    cfg = model.config
    chunk, kinds = getattr(cfg, "attention_chunk_size", None), getattr(cfg, "layer_types", None)
    digits = re.search(r"\.(\d+)\.", c.module)
    if not chunk or not kinds or digits is None or kinds[int(digits[1])] != "chunked_attention":
        return c
    b, h, sq, skv = c.w.shape
    left = (mask.cumsum(-1) == 0).sum(-1)  # as create_chunked_causal_mask counts it
    allowed = chunked_causal_mask_function(chunk, left)(
        torch.arange(b)[:, None, None], 0, torch.arange(sq)[None, :, None] + skv - sq,
        torch.arange(skv)[None, None, :])
    return c._replace(w=allowed[:, None].expand(b, h, sq, skv).float())


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _layers(cfg: Any, out: dict[str, Any]) -> None:
    """Two layers, or one of each kind where the config lists per-layer kinds."""
    kinds = getattr(cfg, "layer_types", None)
    n = 2
    if isinstance(kinds, (list, tuple)) and kinds and not isinstance(
            getattr(type(cfg), "layer_types", None), property):
        picked = [k for i, k in enumerate(kinds) if k not in kinds[:i]][:3]
        n = len(picked)
        out["layer_types"] = picked
    for name in _LAYERS:
        if _int(getattr(cfg, name, None)) and not isinstance(getattr(type(cfg), name, None),
                                                             property):  # Funnel: block sizes
            out[name] = n


def tiny_overrides(cfg: Any) -> dict[str, Any]:
    """Constructor keywords that shrink ``cfg`` (sub-configs as dicts, shrunk the same way)."""
    out: dict[str, Any] = {}
    per_layer = cfg.to_dict().get("per_layer_config")
    if per_layer is not None:  # Gemma 4: reading a per-layer size globally raises
        cfg.allow_global_per_layer_attribute_access = True
        # the second layer's heads twice as wide (the first's 8), as its full-attention layers
        out["per_layer_config"] = {"01": {"head_dim": 2 * HEAD_DIM}} if any(
            "head_dim" in v for v in per_layer.values()) else {}
    for names, value in _SET.items():
        for name in names:
            if _int(getattr(cfg, name, None)) and not isinstance(
                    getattr(type(cfg), name, None), property):  # Falcon: derived head_dim
                out[name] = value
    _layers(cfg, out)
    for name, value in (("head_dim", HEAD_DIM), ("num_key_value_heads", KV_HEADS)):
        # declared but left None for the model to derive, which some do not (HunYuan v1 and
        # Ministral take head_dim as it is, Nemotron the kv heads)
        if name in vars(cfg) and getattr(cfg, name) is None and name not in out:
            out[name] = value
    if "qk_rope_head_dim" in out:  # MLA (DeepSeek): head_dim is the rotary part; no GQA
        out.update(head_dim=4, num_key_value_heads=HEADS, num_experts_per_tok=2, n_group=1,
                   topk_group=1)
    if getattr(cfg, "attention_types", None):  # GPT-Neo: one global and one local layer
        out["attention_types"] = [[["global", "local"], 1]]
    if getattr(cfg, "depths", None):  # Swin-like stages
        out.update(depths=[1, 1], num_heads=[2, 4], embed_dim=16, window_size=2)
    for name in _TOKEN_IDS:
        if _int(getattr(cfg, name, None)) and getattr(cfg, name) >= VOCAB:
            out[name] = 2
    for key in getattr(type(cfg), "sub_configs", {}):
        sub = getattr(cfg, key, None)
        if isinstance(sub, transformers.PretrainedConfig):
            features = FEATURES.get(getattr(sub, "model_type", ""), {})
            out[key] = {**sub.to_dict(), **tiny_overrides(sub), **features}
            if isinstance(features.get("layer_types"), list):  # a feature's own layer kinds
                out[key]["num_hidden_layers"] = len(features["layer_types"])
    return out


@contextmanager
def quiet() -> Iterator[None]:
    """The models' own warnings (deprecations, generation defaults) are not what is tested."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def build(model_type: str, class_name: str, impl: str = "eager", **extra: Any) -> Any:
    """A tiny model of ``class_name`` for ``model_type``, in eval mode, seeded; eager attention
    unless ``impl`` says otherwise."""
    cls = getattr(transformers, class_name)
    config_cls = transformers.CONFIG_MAPPING[model_type]
    own = getattr(cls, "config_class", None)
    if isinstance(own, type) and issubclass(own, transformers.PretrainedConfig):
        config_cls = own  # a multimodal type mapped to its text model (Qwen 3.5, Llama 4)
    features = FEATURES.get(model_type, FEATURES.get(getattr(config_cls, "model_type", ""), {}))
    with quiet():
        keywords = {**tiny_overrides(config_cls()), "attn_implementation": impl,
                    **features, **extra}
        kinds = keywords.get("layer_types")
        if kinds is None:
            keywords.pop("layer_types", None)
        elif isinstance(kinds, list) and "num_hidden_layers" in keywords:
            keywords["num_hidden_layers"] = len(kinds)  # a feature's own layer kinds
        cfg = config_cls(**keywords)
        torch.manual_seed(0)
        model = cls(cfg).eval()
        model.set_attn_implementation(impl)
    # No parameter asks for a gradient: the reference's FLOP counter (its module tracker) hooks
    # every module input that does, and a parameter handed to a module as an argument under
    # no_grad has no gradient function to hook (transformers 5.25's hub-kernel layers: their
    # causal conv takes the conv's weight), which failed ~20 families before attnscope ran.
    return model.requires_grad_(False)


def _config_of(model: Any, key: str) -> Any:
    cfg = model.config
    return getattr(cfg, key, None) or cfg


def inputs_for(kind: str, model: Any, padded: bool) -> dict[str, Any]:
    """Inputs of a batch of two; ``padded``: the second row's first two tokens are padding."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(3, 60, (2, 8), generator=gen)
    mask = torch.ones_like(ids)
    if padded:
        mask[1, :2] = 0
    text = {"input_ids": ids, "attention_mask": mask}
    if kind in ("causal", "encoder"):
        return text
    if kind == "seq2seq":
        return {**text, "decoder_input_ids": torch.randint(3, 60, (2, 5), generator=gen)}
    if kind == "whisper":
        cfg = model.config
        feats = torch.randn(2, cfg.num_mel_bins, 2 * cfg.max_source_positions, generator=gen)
        return {"input_features": feats, "decoder_input_ids": ids[:, :5]}
    vision = _config_of(model, "vision_config")
    size = vision.image_size
    pixels = torch.randn(2, getattr(vision, "num_channels", 3), size, size, generator=gen)
    if kind == "vision":
        return {"pixel_values": pixels}
    return {**text, "pixel_values": pixels}  # text + vision (CLIP, SigLIP)


class Weights(NamedTuple):
    """One attention call as the model reports it."""

    group: str  # the output field it came in: attentions, encoder_attentions, cross_attentions...
    module: str  # path of the innermost module that returned this tensor
    w: torch.Tensor  # (B, H, Sq, Skv) softmax weights


class Reference(NamedTuple):
    calls: list[Weights]  # in the order the model returned them
    dims: dict[str, int | None]  # module path -> Dqk + Dv (None: not a whole number)
    pooling_calls: int  # nn.MultiheadAttention calls (SigLIP's pooling head): weights not returned
    seq: int | None = None  # the input's length (blocked weights pad it to whole blocks)


def _groups(out: Any) -> list[tuple[str, torch.Tensor]]:
    found: list[tuple[str, torch.Tensor]] = []
    for name in ("attentions", "encoder_attentions", "decoder_attentions", "cross_attentions"):
        found += [(name, w) for w in getattr(out, name, None) or () if isinstance(w, torch.Tensor)]
    for side in ("vision", "text"):
        sub = getattr(out, f"{side}_model_output", None)
        found += [(side, w) for w in getattr(sub, "attentions", None) or ()]
    return found


def _producers(model: Any) -> tuple[list[tuple[str, Any]], Callable[[], None]]:
    """(module path, output) of every module call, innermost first; and the hooks' remover."""
    paths = {id(m): path for path, m in model.named_modules()}
    seen: list[tuple[str, Any]] = []

    def record(module: torch.nn.Module, args: Any, output: Any) -> None:
        if id(module) in paths:
            seen.append((paths[id(module)], output))

    hook = torch.nn.modules.module.register_module_forward_hook(record)
    return seen, hook.remove


def _produced_by(seen: list[tuple[str, Any]], w: torch.Tensor) -> str:
    """The innermost module that returned ``w`` beside its output (a tuple: a bare tensor is a
    dropout's identity in eval mode)."""
    for path, output in seen:  # a forward hook runs as its module returns: inner ones first
        if isinstance(output, (tuple, list)) and any(o is w for o in output):
            return path
    return "?"


def softmax_map(w: torch.Tensor) -> bool:
    """Weights a softmax gave (never negative): what a linear-attention layer returns as its
    "attentions" (MiniMax's lightning layers: decayed QKᵀ products) is not attention's map."""
    return not isinstance(w, torch.Tensor) or not bool((w < 0).any())


def reference(model: Any, inputs: dict[str, Any]) -> tuple[Reference, Any]:
    """The model's own account of one forward: each returned weights tensor with the module
    that returned it, and each such module's Dqk + Dv = its matmul FLOPs / (2 · B·H·Sq·Skv
    summed over its calls) (ALBERT runs one shared layer several times)."""
    seen, remove = _producers(model)
    try:
        with quiet(), torch.no_grad(), FlopCounterMode(display=False) as counter:
            out = model(**inputs, output_attentions=True)
    finally:
        remove()
    calls = [Weights(group, _produced_by(seen, w), w) for group, w in _groups(out)
             if softmax_map(w)]
    root = type(model).__name__ + "."
    bmm = {key.removeprefix(root): sum(n for op, n in ops.items() if "bmm" in str(op))
           for key, ops in counter.get_flop_counts().items()}
    dims: dict[str, int | None] = {}
    for path in {c.module for c in calls}:
        block = 2 * sum(c.w.numel() for c in calls if c.module == path)
        children = [] if path == "?" else [n for n, _ in model.get_submodule(path).named_children()]
        # the module's own matmuls: a sparse-attention indexer below it scores keys apart
        flops = bmm.get(path, 0) - sum(bmm.get(f"{path}.{name}", 0) for name in children)
        dims[path] = flops // block if flops and flops % block == 0 else None
        blocked = any(c.w.ndim == 5 for c in calls if c.module == path)
        if blocked and dims[path] is None:  # LongT5's transient-global layer: its matmuls
            # include the global aggregation; the layer's own head size (q, k and v alike)
            dims[path] = 2 * model.get_submodule(path).key_value_proj_dim
    pools = {p for p, m in model.named_modules() if isinstance(m, torch.nn.MultiheadAttention)}
    pooling = sum(1 for path, _ in seen if path in pools)
    ids = inputs.get("input_ids")
    seq = ids.shape[-1] if isinstance(ids, torch.Tensor) else None
    return Reference(calls, dims, pooling, seq), out
