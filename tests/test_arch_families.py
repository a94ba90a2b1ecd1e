"""Issue 23's defects, one family each, against what the model itself does (tiny, from config).

Each test names the family and the attribute that was wrong; the reference is the model's own
structure (a decoder's self-attention is causal at every step; an encoder has no cache).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")
from tests.support import arch_sweep as sweep  # noqa: E402


def _calls(model: Any, run: Any) -> list[dict[str, Any]]:
    """The attention calls' attributes, in start order."""
    return [a for a in _spans(model, run) if "attnscope.num_heads" in a]


def _generate(model: Any, new: int = 3) -> None:
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(1))
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=new,
                   min_new_tokens=new, do_sample=False)


def _spans(model: Any, run: Any) -> list[dict[str, Any]]:
    """Every span's attributes (attention or not), in start order."""
    attnscope.instrument(model)
    try:
        with capture_spans() as spans, sweep.quiet(), torch.no_grad():
            run()
    finally:
        attnscope.uninstrument(model)
    return [dict(s.attributes or {}) for s in sorted(spans, key=lambda s: s.start_time)]


@pytest.mark.parametrize(("model_type", "class_name"), [
    ("xglm", "XGLMForCausalLM"), ("mvp", "MvpForConditionalGeneration"),
    ("nllb-moe", "NllbMoeForConditionalGeneration"),
    ("bigbird_pegasus", "BigBirdPegasusForConditionalGeneration"),
])
def test_a_decoders_self_attention_is_causal_at_every_step(model_type: str,
                                                           class_name: str) -> None:
    model = sweep.build(model_type, class_name)
    calls = _calls(model, lambda: _generate(model))
    selfs = [a for a in calls if a["attnscope.module"].endswith("self_attn")
             and "encoder." not in a["attnscope.module"]]
    steps = [a for a in selfs if a.get("attnscope.phase") in ("prefill", "decode")]
    assert any(a["attnscope.phase"] == "decode" for a in steps), calls
    # generate's first step of an encoder-decoder is one query too (the start token)
    wrong = [(a["attnscope.module"], a["attnscope.phase"], a.get("attnscope.kv_cache_len"))
             for a in steps if a.get("attnscope.causal") is not True]
    assert not wrong, f"{model_type}: decoder steps with causal != true: {wrong}"


def test_an_encoder_run_as_a_causal_lm_stays_bidirectional_on_decode_steps() -> None:
    """BERT as a causal LM without is_decoder=True (transformers warns) attends to every key in
    its prefill, as its weights show: its one-query steps are not called causal either."""
    model = sweep.build("bert", "BertLMHeadModel")
    assert model.config.is_decoder is False
    ids = torch.randint(3, 60, (1, 8), generator=torch.Generator().manual_seed(1))

    def run(**kw: Any) -> Any:
        return model.generate(input_ids=ids, max_new_tokens=3, min_new_tokens=3, do_sample=False,
                              **kw)

    with sweep.quiet(), torch.no_grad():
        steps = run(output_attentions=True, return_dict_in_generate=True).attentions
    assert all(sweep.causal_shown(w) is False for w in steps[0])  # the prefill is bidirectional
    calls = _calls(model, run)
    assert len(calls) == sum(len(step) for step in steps)
    decode = [a for a in calls if a["attnscope.phase"] == "decode"]
    assert len(decode) == 2 * len(steps[0])
    assert all(a["attnscope.causal"] is False for a in calls)


# ---- hybrid models: only softmax attention is attention --------------------------------------

_HYBRID_BASE = dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                    intermediate_size=64, vocab_size=96, max_position_embeddings=64,
                    num_hidden_layers=2, attn_implementation="eager", pad_token_id=0)
_MAMBA2 = dict(mamba_n_heads=4, mamba_d_head=32, mamba_n_groups=1, mamba_d_state=4,
               mamba_chunk_size=4)
# (model type, class, config: at least one layer of each kind, the attention class)
HYBRIDS = [
    ("jamba", "JambaForCausalLM", dict(attn_layer_period=2, attn_layer_offset=1,
                                       expert_layer_period=2, expert_layer_offset=1,
                                       mamba_d_state=4, mamba_dt_rank=4,
                                       use_mamba_kernels=False), "JambaAttention"),
    ("bamba", "BambaForCausalLM", dict(attn_layer_indices=[1], **_MAMBA2), "BambaAttention"),
    ("zamba2", "Zamba2ForCausalLM", dict(layers_block_type=["mamba", "hybrid"], mamba_d_state=4,
                                         n_mamba_heads=4, mamba_ngroups=1,
                                         use_mamba_kernels=False, num_mem_blocks=1),
     "Zamba2Attention"),
    ("lfm2", "Lfm2ForCausalLM", dict(layer_types=["conv", "full_attention"]), "Lfm2Attention"),
    ("falcon_h1", "FalconH1ForCausalLM", dict(mamba_d_ssm=128, head_dim=16, **_MAMBA2),
     "FalconH1Attention"),
    ("granitemoehybrid", "GraniteMoeHybridForCausalLM",
     dict(layer_types=["mamba", "attention"], **_MAMBA2), "GraniteMoeHybridAttention"),
]


def _hybrid(model_type: str, class_name: str, extra: dict[str, Any]) -> Any:
    with sweep.quiet():
        cfg = transformers.CONFIG_MAPPING[model_type](**_HYBRID_BASE, **extra)
        torch.manual_seed(0)
        return getattr(transformers, class_name)(cfg).eval()


@pytest.mark.parametrize(("model_type", "class_name", "extra", "attention"), HYBRIDS,
                         ids=[h[0] for h in HYBRIDS])
def test_hybrid_models_get_attention_spans_on_attention_layers_only(
        model_type: str, class_name: str, extra: dict[str, Any], attention: str) -> None:
    model = _hybrid(model_type, class_name, extra)
    present = {type(m).__name__ for m in model.modules()}
    assert attention in present
    calls = [s for s in _spans(model, lambda: _generate(model, new=2))
             if "attnscope.module_class" in s and "attnscope.seq_len_q" in s]
    classes = {a["attnscope.module_class"] for a in calls}
    assert classes == {attention}, f"{model_type}: spans on {sorted(classes)}"


def test_zamba2_shared_attention_reads_its_own_layer_of_the_cache() -> None:
    """Zamba2's shared attention has layer_idx -1 and gets the real one as a call keyword."""
    model = _hybrid(*HYBRIDS[2][:3])
    calls = [a for a in _spans(model, lambda: _generate(model, new=3))
             if a.get("attnscope.module_class") == "Zamba2Attention"]
    steps = [(a["attnscope.phase"], a["attnscope.kv_cache_len"], a["attnscope.seq_len_kv"],
              a["attnscope.flops"]) for a in calls]
    attn = next(m for m in model.modules() if type(m).__name__ == "Zamba2Attention")
    assert [s[:3] for s in steps] == [("prefill", 0, 8), ("decode", 8, 9), ("decode", 9, 10)]
    for (_, _, skv, flops) in steps[1:]:  # one query, every key visible, batch 2
        assert flops == 2 * 2 * attn.config.num_attention_heads * skv * 2 * attn.head_dim
@pytest.mark.parametrize(("model_type", "class_name"), [
    ("pegasus", "PegasusForConditionalGeneration"), ("m2m_100", "M2M100ForConditionalGeneration"),
    ("blenderbot", "BlenderbotForConditionalGeneration"),
    ("blenderbot-small", "BlenderbotSmallForConditionalGeneration"),
    ("plbart", "PLBartForConditionalGeneration"),
    ("esm", "EsmModel"), ("layoutlm", "LayoutLMModel"),
])
def test_an_encoder_layer_has_no_phase_and_no_cache(model_type: str, class_name: str) -> None:
    # ESM's default config has no vocabulary (a protein model's is 33 tokens)
    model = sweep.build(model_type, class_name, **({"vocab_size": 64, "pad_token_id": 1,
                                                     "mask_token_id": 2} if model_type == "esm"
                                                    else {}))
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(1))
    if model.config.is_encoder_decoder:
        calls = _calls(model, lambda: _generate(model))
    else:
        calls = _calls(model, lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids)))
    encoder = [a for a in calls
               if model.config.is_encoder_decoder is False
               or str(a.get("attnscope.module", "")).startswith(("model.encoder.", "encoder."))]
    assert encoder, calls
    wrong = [(a["attnscope.module"], a.get("attnscope.phase"), a.get("attnscope.kv_cache_len"))
             for a in encoder if "attnscope.phase" in a or "attnscope.kv_cache_len" in a]
    assert not wrong, f"{model_type}: encoder layers with a phase or a cache: {wrong}"


# ---- a layer that narrows its mask: Doge's dynamic top-k keys --------------------------------


def test_doge_counts_the_keys_its_dynamic_mask_keeps_and_marks_what_it_cannot() -> None:
    model = sweep.build("doge", "DogeForCausalLM", keep_window_size=4)
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(1))
    dims = 2 * model.config.head_dim if getattr(model.config, "head_dim", None) else None

    def weights(**kw: Any) -> list[torch.Tensor]:
        with sweep.quiet(), torch.no_grad():
            return list(model(input_ids=ids, output_attentions=True, **kw).attentions)

    plain = weights(attention_mask=torch.ones_like(ids))
    calls = _calls(model, lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids)))
    assert len(calls) == len(plain) == 2
    for a, w in zip(calls, plain, strict=True):
        d = dims or 2 * a["attnscope.head_dim"]
        assert a["attnscope.flops"] == 2 * int((w != 0).sum()) * d  # 208 pairs of 288
        assert "attnscope.exact" not in a
    # generate: every decode step against the step's own weights
    with sweep.quiet(), torch.no_grad():
        ref = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                             min_new_tokens=3, do_sample=False, output_attentions=True,
                             return_dict_in_generate=True)
    steps = [w for step in ref.attentions for w in step]
    calls = _calls(model, lambda: _generate(model))
    assert len(calls) == len(steps)
    for a, w in zip(calls, steps, strict=True):
        assert a["attnscope.flops"] == 2 * int((w != 0).sum()) * 2 * a["attnscope.head_dim"]
        assert a["attnscope.causal"] is True
    # left padding: which keys the top-k keeps depends on values attnscope never reads
    padded = torch.ones_like(ids)
    padded[1, :2] = 0
    calls = _calls(model, lambda: model(input_ids=ids, attention_mask=padded))
    assert all(a["attnscope.exact"] is False and a["attnscope.inexact_reason"] == "layer_narrows"
               for a in calls)


def test_timesformer_attention_is_traced_with_its_head_size_from_the_fused_projection() -> None:
    """TimesformerSelfAttention has a head count and a fused qkv, no head-size attribute."""
    model = sweep.build("timesformer", "TimesformerModel")
    c = model.config
    pixels = torch.randn(2, c.num_frames, c.num_channels, c.image_size, c.image_size,
                         generator=torch.Generator().manual_seed(0))
    seen: list[tuple[int, ...]] = []
    hooks = [m.register_forward_hook(lambda mod, args, out: seen.append(tuple(args[0].shape)))
             for m in model.modules() if type(m).__name__ == "TimesformerSelfAttention"]
    with torch.no_grad():
        model(pixel_values=pixels)
    for h in hooks:
        h.remove()
    calls = _calls(model, lambda: model(pixel_values=pixels))
    assert len(calls) == len(seen) == 2 * c.num_hidden_layers  # temporal and spatial per layer
    head = c.hidden_size // c.num_attention_heads
    for a, (b, s, _width) in zip(calls, seen, strict=True):
        assert (a["attnscope.batch_size"], a["attnscope.seq_len_q"]) == (b, s)
        assert a["attnscope.head_dim"] == head and a["attnscope.num_heads"] == c.num_attention_heads
        assert a["attnscope.flops"] == 2 * b * c.num_attention_heads * s * s * 2 * head


@pytest.mark.parametrize("kind", ["local", "transient-global"])
def test_longt5_blocked_local_attention_counts_its_band_and_global_keys(kind: str) -> None:
    """LongT5's encoder attention splits the sequence into blocks of local_radius + 1: each query
    sees the keys within local_radius of it (the local layer gets a 5-D blocked mask), and the
    transient-global layer adds one summary key per global_block_size tokens. FLOPs against the
    weights of the real queries (the rows that pad the last block are not queries)."""
    model = sweep.build("longt5", "LongT5Model", encoder_attention_type=kind, local_radius=2,
                        global_block_size=2)
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(1))
    padded = torch.ones_like(ids)
    padded[1, :2] = 0

    def run(mask: torch.Tensor, **kw: Any) -> Any:
        return model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :3], **kw)

    with sweep.quiet(), torch.no_grad():
        ref = run(torch.ones_like(ids), output_attentions=True)
    blocked = [w for w in ref.encoder_attentions]
    assert all(w.ndim == 5 and w.shape[1] > 1 for w in blocked)  # more than one block
    dims = 2 * model.config.d_kv
    for mask in (torch.ones_like(ids), padded):
        calls = _calls(model, lambda mask=mask: run(mask))
        local = [a for a in calls if a["attnscope.module"].startswith("encoder.")]
        assert len(local) == len(blocked) == 2
        for a, w in zip(local, blocked, strict=True):
            b, nb, h, block, keys = w.shape
            rows = w.permute(0, 2, 1, 3, 4).reshape(b, h, nb * block, keys)[:, :, :8]
            assert a["attnscope.flops"] == 2 * int((rows != 0).sum()) * dims  # padding: as plain
            assert a["attnscope.tokens"] == int(mask.sum())
            assert (a["attnscope.causal"], a["attnscope.sliding_window"]) == (False, 2 * 2 + 1)
        assert all("attnscope.exact" not in a for a in calls)


def test_fsmt_time_first_layout_and_layer_state_cache() -> None:
    """FSMT's attention takes (seq, batch, width) tensors and its cache as layer_state."""
    model = sweep.build("fsmt", "FSMTForConditionalGeneration")
    ids = torch.randint(3, 60, (2, 10), generator=torch.Generator().manual_seed(1))
    padded = torch.ones_like(ids)
    padded[1, :3] = 0

    def run(mask: torch.Tensor) -> Any:
        return model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :4],
                     output_attentions=True)

    with sweep.quiet(), torch.no_grad():
        ref = run(torch.ones_like(ids))
    pairs = zip(ref.decoder_attentions, ref.cross_attentions, strict=True)
    weights = [*ref.encoder_attentions, *(w for pair in pairs for w in pair)]
    calls = _calls(model, lambda: run(torch.ones_like(ids)))
    assert len(calls) == len(weights) == 6
    dims = 2 * model.config.d_model // model.config.encoder_attention_heads
    for a, w in zip(calls, weights, strict=True):
        b, h, sq, skv = w.shape
        assert (a["attnscope.batch_size"], a["attnscope.num_heads"], a["attnscope.seq_len_q"],
                a["attnscope.seq_len_kv"]) == (b, h, sq, skv), a["attnscope.module"]
        assert a["attnscope.flops"] == 2 * int((w != 0).sum()) * dims
    encoder = [a for a in _calls(model, lambda: run(padded))
               if a["attnscope.module"].startswith("model.encoder.")]
    assert [a["attnscope.tokens"] for a in encoder] == [10 + 7] * 2  # the padding excluded
    assert all("attnscope.phase" not in a for a in encoder)
    generated = _calls(model, lambda: model.generate(
        input_ids=ids[:1], attention_mask=padded[:1], max_new_tokens=3, min_new_tokens=3,
        do_sample=False, num_beams=1))
    steps = [a for a in generated if a["attnscope.module"].endswith("decoder.layers.0.self_attn")]
    assert [(a["attnscope.phase"], a["attnscope.kv_cache_len"], a["attnscope.seq_len_kv"],
             a["attnscope.causal"]) for a in steps] == [
        ("prefill", 0, 1, True), ("decode", 1, 2, True), ("decode", 2, 3, True)]


# ---- chunked attention: Llama 4's attention_chunk_size ----------------------------------------


def _llama4(chunk: int = 4) -> Any:
    model = sweep.build("llama4_text", "Llama4ForCausalLM", attention_chunk_size=chunk,
                        no_rope_layers=[1, 0], num_hidden_layers=2)
    assert model.config.layer_types == ["chunked_attention", "full_attention"]
    return model


def _padded_chunk_layout(chunk: int, mask: torch.Tensor) -> torch.Tensor:
    """(batch, query, key) pairs of transformers' own chunked causal mask function over the
    padded batch, padding not hidden (kernels compute padded positions): the chunks start at
    each row's first real token, the positions before it form chunks of their own."""
    from transformers.masking_utils import chunked_causal_mask_function

    left = (mask.cumsum(-1) == 0).sum(-1)  # as create_chunked_causal_mask counts it
    b, s = mask.shape
    allowed = chunked_causal_mask_function(chunk, left)(
        torch.arange(b)[:, None, None], 0, torch.arange(s)[None, :, None],
        torch.arange(s)[None, None, :])
    return allowed.expand(b, s, s)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_llama4_chunked_layers_count_the_chunk_layout(impl: str) -> None:
    """Llama 4's chunked layers hide the previous chunk's keys: decode FLOPs are the keys of the
    query's own chunk (not the whole cache) and a left-padded prefill follows the padded chunk
    layout transformers builds; the full-attention layer keeps the padded-shape convention."""
    chunk = 4
    model = _llama4(chunk)
    dims = 2 * model.config.head_dim
    heads = model.config.num_attention_heads
    ids = torch.randint(3, 60, (2, 10), generator=torch.Generator().manual_seed(1))
    padded = torch.ones_like(ids)
    padded[1, :3] = 0

    def forward(mask: torch.Tensor, **kw: Any) -> Any:
        return model(input_ids=ids, attention_mask=mask, **kw)

    def generate(**kw: Any) -> Any:
        return model.generate(input_ids=ids, attention_mask=padded, max_new_tokens=6,
                              min_new_tokens=6, do_sample=False, **kw)

    with sweep.quiet(), torch.no_grad():  # the eager model's own weights
        plain = forward(torch.ones_like(ids), output_attentions=True).attentions
        masked = forward(padded, output_attentions=True).attentions
        steps = generate(output_attentions=True, return_dict_in_generate=True).attentions
    model.set_attn_implementation(impl)
    got = _calls(model, lambda: forward(torch.ones_like(ids)))
    assert [a["attnscope.flops"] for a in got] == [2 * int((w != 0).sum()) * dims for w in plain]
    chunked, full = _calls(model, lambda: forward(padded))
    layout = _padded_chunk_layout(chunk, padded)
    # the layout is the one the model applied: between real positions, the weights' non-zero
    # pairs (a padded query row's weights are uniform over every key: not a layout)
    real = padded.bool()[:, :, None] & padded.bool()[:, None, :]
    assert torch.equal((masked[0] != 0) & real[:, None], layout[:, None].expand_as(masked[0])
                       & real[:, None])
    assert int(layout[1].sum()) < int(layout[0].sum())  # padding moved row 1's chunk boundaries
    assert chunked["attnscope.flops"] == 2 * heads * int(layout.sum()) * dims
    assert full["attnscope.flops"] == 2 * int((plain[1] != 0).sum()) * dims  # as unpadded
    assert "attnscope.exact" not in chunked and chunked["attnscope.tokens"] == 17
    calls = _calls(model, generate)
    weights = [w for step in steps for w in step]
    assert len(calls) == len(weights) == 12
    decode = [(a, w) for a, w in zip(calls, weights, strict=True)
              if a["attnscope.phase"] == "decode" and a["attnscope.module"].endswith("0.self_attn")]
    assert len(decode) == 5
    for a, w in decode:  # every new token is real: the keys of its chunk, as the weights show
        assert (a["attnscope.seq_len_kv"], a["attnscope.kv_cache_len"]) == (chunk, chunk - 1)
        assert a["attnscope.flops"] == 2 * int((w != 0).sum()) * dims
        assert "attnscope.exact" not in a and a["attnscope.causal"] is True
    every_key = 2 * 2 * heads * chunk * dims  # batch 2, the whole cache: what was counted before
    assert sum(a["attnscope.flops"] < every_key for a, _ in decode) >= 3


def _funnel() -> Any:
    with sweep.quiet():
        cfg = transformers.FunnelConfig(vocab_size=96, d_model=32, n_head=4, d_head=8, d_inner=64,
                                        block_sizes=[1, 1], block_repeats=[1, 1],
                                        num_decoder_layers=1)  # block 1's layer: pooled query
        torch.manual_seed(0)
        return transformers.FunnelModel(cfg).eval()


def test_funnel_attention_is_traced_with_its_pooled_query() -> None:
    """Funnel's attention (``q_head``/``k_head``/``v_head``, the head size ``d_head`` apart from
    ``d_model``) takes (query, key, value, attention_inputs): a block's first layer pools its
    query below its keys and attends to every key."""
    model = _funnel()
    c = model.config
    ids = torch.randint(3, 60, (2, 10), generator=torch.Generator().manual_seed(1))
    padded = torch.ones_like(ids)
    padded[1, :3] = 0
    with sweep.quiet(), torch.no_grad():
        plain = model(input_ids=ids, attention_mask=torch.ones_like(ids),
                      output_attentions=True).attentions
    calls = _calls(model, lambda: model(input_ids=ids, attention_mask=torch.ones_like(ids)))
    masked = _calls(model, lambda: model(input_ids=ids, attention_mask=padded))
    assert len(calls) == len(masked) == len(plain) == 3
    assert any(w.shape[-2] < w.shape[-1] for w in plain)  # the pooled query is exercised
    for a, p, w in zip(calls, masked, plain, strict=True):
        b, h, sq, skv = w.shape
        assert (a["attnscope.batch_size"], a["attnscope.num_heads"], a["attnscope.seq_len_q"],
                a["attnscope.seq_len_kv"], a["attnscope.head_dim"]) == (b, h, sq, skv, c.d_head)
        assert a["attnscope.flops"] == 2 * int((w != 0).sum()) * 2 * c.d_head
        assert p["attnscope.flops"] == a["attnscope.flops"]  # padding does not reduce FLOPs
        assert a["attnscope.causal"] is False and "attnscope.phase" not in a
        assert "attnscope.exact" not in a and "attnscope.exact" not in p
        # queries that are the keys: the padding excluded; a pooled query: every one
        assert p["attnscope.tokens"] == (int(padded.sum()) if sq == skv else b * sq)


# ---- a window the config names: the implementation decides whether a missing mask hides it ---


def _moshi(impl: str) -> Any:
    return sweep.build("moshi", "MoshiForCausalLM", impl=impl)


@pytest.mark.parametrize("impl", ["eager", "sdpa"])
def test_moshi_config_window_is_not_applied_under_either_implementation(impl: str) -> None:
    """Moshi's config names a window (4 here, 8 tokens) its attention never applies: eager
    masks it in full causal, and sdpa gets no mask at all (transformers skips a causal mask only
    where no window can bind), which read as the config's window: FLOPs 6,656 for 9,216."""
    model = _moshi(impl)
    assert model.config.sliding_window == 4 and model.config._attn_implementation == impl
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(1))
    with sweep.quiet(), torch.no_grad():
        weights = model(input_ids=ids, output_attentions=True).attentions if impl == "eager" \
            else None
    calls = _calls(model, lambda: model(input_ids=ids))
    assert calls
    b, s, h = 2, 8, model.config.num_attention_heads
    dims = 2 * model.config.head_dim  # Dqk + Dv
    full = 2 * b * h * (s * (s + 1) // 2) * dims  # every key at or before each query
    if weights is not None:  # the model's own: a full causal band, no window
        assert int((weights[0] != 0).sum()) * 2 * dims == full
    for a in calls:
        assert "attnscope.sliding_window" not in a
        assert a["attnscope.flops"] == full
        assert a["attnscope.causal"] is True


# ---- cross-attention handed a padding mask ---------------------------------------------------


def test_cross_attention_bytes_are_left_out_where_a_mask_hides_source_keys() -> None:
    """BART's cross-attention reads the encoder keys its padding mask leaves visible, and the
    mask itself; attnscope keeps no cross-attention mask, so it counted every key and no mask
    (6,656 bytes where eager reads a float mask of 320 more and hides 2 keys' K and V)."""
    model = sweep.build("bart", "BartForConditionalGeneration")
    plain = sweep.inputs_for("seq2seq", model, padded=False)
    padded = sweep.inputs_for("seq2seq", model, padded=True)
    unmasked = {k: v for k, v in plain.items() if k != "attention_mask"}

    def cross(inputs: dict[str, Any]) -> list[dict[str, Any]]:
        return [a for a in _calls(model, lambda: model(**inputs))
                if "encoder_attn" in a["attnscope.module"]]

    (q_len, k_len) = plain["decoder_input_ids"].shape[1], plain["input_ids"].shape[1]
    h, d = model.config.decoder_attention_heads, model.config.d_model // \
        model.config.decoder_attention_heads
    # Q and O of every query, K and V of every key, fp32: no mask, nothing hidden
    least = 4 * 2 * h * d * (2 * q_len + 2 * k_len)
    assert [a["attnscope.bytes"] for a in cross(unmasked)] == [least] * 2
    for a in cross(padded):
        assert "attnscope.bytes" not in a and "attnscope.arithmetic_intensity" not in a
        assert a["attnscope.tokens"] == 2 * q_len  # the queries are the decoder's


# ---- KV sharing: Gemma 3n's last layers attend keys other layers stored ---------------------


def test_gemma3n_kv_shared_layers_read_the_stored_keys_or_say_they_could_not() -> None:
    """A KV-shared layer never writes its own cache slot: read there, every decode step was a
    prefill of one key (seq_len_kv 1 for 4, phase prefill). It attends the keys the last layer of
    its kind stored this call; where a call does not pass them, its cache length is unknown."""
    import inspect

    from attnscope._derive.call import derive
    from attnscope._instrument.transformers import hidden_state_extractor

    model = sweep.build("gemma3n_text", "Gemma3nForCausalLM")
    shared = [layer.self_attn for layer in model.model.layers
              if layer.self_attn.is_kv_shared_layer]
    assert len(shared) == 2  # one sliding, one full: the sweep's config
    calls = _calls(model, lambda: _generate(model))
    steps = [a for a in calls if a["attnscope.module"] == "model.layers.3.self_attn"]
    # the full layer: 8 prompt keys, then one more per step (its store layer's cache)
    assert [(a["attnscope.seq_len_kv"], a["attnscope.kv_cache_len"], a["attnscope.phase"])
            for a in steps] == [(8, 0, "prefill"), (9, 8, "decode"), (10, 9, "decode")]
    layer = shared[1]
    extract = hidden_state_extractor(layer, tuple(inspect.signature(type(layer).forward)
                                                  .parameters))
    cache = transformers.DynamicCache(config=model.config)
    facts = extract(layer, (), {"hidden_states": torch.zeros(2, 1, 32), "cache": cache,
                                "attention_mask": None})
    out = derive([], layer, facts=facts)
    assert out.exact is False and out.inexact_reason == "cache_unread"


def test_gemma3n_shared_keys_are_found_under_the_layer_type_or_the_storing_layers_index() -> None:
    """transformers keys ``shared_kv_states`` by layer type; 5.20.2 by the storing layer's index
    (``kv_shared_layer_index``). Either way the keys are read; under neither, "not read"."""
    from attnscope._attention.families import gemma3n
    from attnscope._record.facts import AttentionFacts, Facts

    class Shared(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.is_kv_shared_layer = True
            self.layer_type = "full_attention"
            self.kv_shared_layer_index = 1

    kind = gemma3n.shared_kind(Shared())
    assert kind == ("full_attention", 1)
    keys = torch.zeros(2, 4, 9, 8)
    for states in ({"full_attention": (keys, keys)}, {1: (keys, keys)}, {0: (keys, keys)}):
        facts = AttentionFacts(2, 1)
        facts.cached = True
        gemma3n.shared_past(Facts(facts), {"shared_kv_states": states}, kind)
        assert facts.past == (8 if 0 not in states else "not read")
