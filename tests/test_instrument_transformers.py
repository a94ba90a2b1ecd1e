"""attnscope.instrument on transformers models built from tiny configs (no downloads)."""

from __future__ import annotations

import inspect
from typing import Any

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import attnscope
from attnscope import instrumented_modules
from attnscope.testing import capture_spans
from tests.support.helpers import base_name

transformers = pytest.importorskip("transformers")

aten = torch.ops.aten


def _llama(impl: str, layers: int = 2) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=impl,
        pad_token_id=0,
        eos_token_id=None,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _brute_flops(batch: int, heads: int, sq: int, skv: int, d: int, causal: bool) -> int:
    pairs = sum(1 for i in range(sq) for j in range(skv) if not causal or j <= i + skv - sq)
    return batch * heads * pairs * 2 * (d + d)


def _layer_bmm_flops(counter: FlopCounterMode, suffix: str) -> dict[str, int]:
    """QKᵀ and PV FLOPs per attention module, as torch's flop counter measures them."""
    out = {}
    for key, ops in counter.get_flop_counts().items():
        if key.endswith(suffix):
            out[key] = sum(n for op, n in ops.items() if op in (aten.bmm, aten.bmm.default))
    return out


def _cache_kw(model: Any) -> str:
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


def _cache_of(output: Any) -> Any:
    return getattr(output, "cache", None) or output.past_key_values


IDS = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 7, 8, 9]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])


@pytest.mark.parametrize("impl", ["sdpa", "eager"])
def test_llama_padded_prefill_spans_tokens_flops_and_restore(impl: str) -> None:
    model = _llama(impl)
    with torch.no_grad():
        ref = model(IDS, attention_mask=MASK).logits
    attnscope.instrument(model)
    assert instrumented_modules(model) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    with capture_spans() as spans, torch.no_grad():
        during = model(IDS, attention_mask=MASK).logits
    assert [base_name(s) for s in sorted(spans, key=lambda s: base_name(s))] == [
        "model.layers.0.self_attn",
        "model.layers.1.self_attn",
    ]
    for s in spans:
        a = s.attributes
        assert a["attnscope.layer_index"] == int(base_name(s).split(".")[2])
        # LlamaAttention; LlamaSdpaAttention before transformers 4.48
        assert a["attnscope.module_class"] == type(model.get_submodule(base_name(s))).__name__
        assert a["attnscope.module_class"].startswith("Llama")
        assert (a["attnscope.num_heads"], a["attnscope.num_kv_heads"], a["attnscope.head_dim"]) == (
            4,
            2,
            8,
        )
        assert a["attnscope.tokens"] == 8  # 5 + 3 real tokens, padding excluded
        assert a["attnscope.phase"] == "prefill" and a["attnscope.kv_cache_len"] == 0
        assert (a["attnscope.seq_len_q"], a["attnscope.seq_len_kv"]) == (5, 5)
        assert a["attnscope.flops"] == _brute_flops(2, 4, 5, 5, 8, causal=True)
    attnscope.uninstrument(model)
    assert instrumented_modules(model) == []
    assert all("forward" not in m.__dict__ for m in model.modules())
    with torch.no_grad():
        after = model(IDS, attention_mask=MASK).logits
    assert torch.equal(ref, during) and torch.equal(ref, after)


def test_llama_decode_step_matches_torch_flop_counter() -> None:
    model = _llama("eager")
    attnscope.instrument(model)
    kw = _cache_kw(model)
    with capture_spans() as spans, torch.no_grad():
        first = model(IDS, attention_mask=MASK, use_cache=True)
        counter = FlopCounterMode(display=False)
        with counter:
            model(
                torch.tensor([[3], [4]]),
                attention_mask=torch.cat([MASK, torch.ones(2, 1, dtype=torch.long)], 1),
                use_cache=True,
                **{kw: _cache_of(first)},
            )
    decode = {
        s.attributes["attnscope.module"]: s.attributes
        for s in spans
        if s.attributes.get("attnscope.phase") == "decode"
    }
    assert len(decode) == 2
    measured = _layer_bmm_flops(counter, "self_attn")
    assert len(measured) == 2
    for path, a in decode.items():
        assert (
            a["attnscope.seq_len_q"],
            a["attnscope.seq_len_kv"],
            a["attnscope.kv_cache_len"],
        ) == (1, 6, 5)
        assert a["attnscope.tokens"] == 2
        # one query sees the whole cache: the dense matmuls torch counts are exactly the attention
        (key,) = [k for k in measured if k.endswith(path)]
        assert a["attnscope.flops"] == measured[key] == _brute_flops(2, 4, 1, 6, 8, causal=True)
    attnscope.uninstrument(model)


def test_generate_eight_tokens_phases_growing_kv_and_usage() -> None:
    model = _llama("sdpa")
    attnscope.instrument(model, trace_model=True)
    with capture_spans() as spans, torch.no_grad():
        out = model.generate(
            IDS,
            attention_mask=MASK,
            max_new_tokens=8,
            min_new_tokens=8,
            do_sample=False,
            pad_token_id=0,
        )
    assert out.shape == (2, 13)
    (gen,) = [s for s in spans if base_name(s) == "LlamaForCausalLM.generate"]
    assert gen.attributes["gen_ai.usage.input_tokens"] == 8
    assert gen.attributes["gen_ai.usage.output_tokens"] == 16
    forwards = sorted(
        (s for s in spans if base_name(s) == "LlamaForCausalLM"), key=lambda s: s.start_time
    )
    assert len(forwards) == 8 and all(f.parent.span_id == gen.context.span_id for f in forwards)
    assert [f.attributes["attnscope.phase"] for f in forwards] == ["prefill"] + ["decode"] * 7
    assert forwards[0].attributes["gen_ai.usage.input_tokens"] == 8
    assert all("gen_ai.usage.input_tokens" not in f.attributes for f in forwards[1:])
    layers = [s for s in spans if base_name(s).endswith(".self_attn")]
    assert len(layers) == 16  # one span per attention layer per forward
    # each under its decoder layer's span (trace_model=True), that under the forward
    blocks = {s.context.span_id: s for s in spans if base_name(s) in ("model.layers.0",
                                                                     "model.layers.1")}
    assert len(blocks) == 16
    for i, fwd in enumerate(forwards):
        children = [s for s in layers if blocks[s.parent.span_id].parent.span_id
                    == fwd.context.span_id]
        assert sorted(c.attributes["attnscope.layer_index"] for c in children) == [0, 1]
        for c in children:
            a = c.attributes
            if i == 0:
                assert (a["attnscope.seq_len_q"], a["attnscope.seq_len_kv"]) == (5, 5)
                assert a["attnscope.tokens"] == 8
            else:
                assert a["attnscope.phase"] == "decode"
                assert (a["attnscope.seq_len_q"], a["attnscope.seq_len_kv"]) == (1, 5 + i)
                assert a["attnscope.tokens"] == 2
                assert a["attnscope.flops"] == _brute_flops(2, 4, 1, 5 + i, 8, causal=True)
    attnscope.uninstrument(model)
    assert "generate" not in model.__dict__ and "forward" not in model.__dict__


def test_generate_from_embeddings_counts_the_new_tokens() -> None:
    # a prompt given as embeddings only (a multimodal front end, soft prompts): generate()
    # returns the new tokens alone, without the prompt's positions
    model = _llama("sdpa")
    attnscope.instrument(model, trace_model=True)
    with capture_spans() as spans, torch.no_grad():
        embeds = model.get_input_embeddings()(IDS)
        out = model.generate(inputs_embeds=embeds, attention_mask=MASK, max_new_tokens=4,
                             min_new_tokens=4, do_sample=False, pad_token_id=0)
    assert out.shape == (2, 4)
    (gen,) = [s for s in spans if base_name(s) == "LlamaForCausalLM.generate"]
    assert gen.attributes["gen_ai.usage.input_tokens"] == 8
    assert gen.attributes["gen_ai.usage.output_tokens"] == 8
    attnscope.uninstrument(model)


class _Adapter(torch.nn.Module):
    """PEFT's shape (``PeftModel`` → ``base_model`` → ``model``): a plain module around a
    transformers model whose ``generate()`` runs the inner model's own, never its ``forward``."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.base_model = torch.nn.Module()
        self.base_model.model = model

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.base_model.model(*args, **kwargs)

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        return self.base_model.model.generate(*args, **kwargs)


def test_a_wrapper_of_a_transformers_model_gets_the_inner_models_forwards() -> None:
    wrapper = _Adapter(_llama("sdpa"))
    attnscope.instrument(wrapper, trace_model=True)
    assert {"", "base_model.model"} <= set(instrumented_modules(wrapper))
    with capture_spans() as spans, torch.no_grad():
        wrapper.generate(IDS, attention_mask=MASK, max_new_tokens=3, min_new_tokens=3,
                         do_sample=False, pad_token_id=0)
    (gen,) = [s for s in spans if base_name(s) == "_Adapter.generate"]
    forwards = sorted((s for s in spans if base_name(s) == "LlamaForCausalLM"),
                      key=lambda s: s.start_time)
    # the inner model's forwards, under the wrapper's generate(), the layers under them
    assert [f.attributes["attnscope.phase"] for f in forwards] == ["prefill", "decode", "decode"]
    assert all(f.parent.span_id == gen.context.span_id for f in forwards)
    assert forwards[0].attributes["gen_ai.usage.input_tokens"] == 8
    assert forwards[0].attributes["attnscope.module"] == "LlamaForCausalLM"
    by_id = {s.context.span_id: s for s in spans}
    for layer in (s for s in spans if base_name(s).endswith(".self_attn")):
        block = by_id[layer.parent.span_id]
        assert by_id[block.parent.span_id] in forwards
    # a direct call: the wrapper's forward, the inner model's inside it
    with capture_spans() as spans, torch.no_grad():
        wrapper(IDS, attention_mask=MASK)
    (outer,) = [s for s in spans if base_name(s) == "_Adapter"]
    (inner,) = [s for s in spans if base_name(s) == "LlamaForCausalLM"]
    assert inner.parent.span_id == outer.context.span_id
    attnscope.uninstrument(wrapper)
    assert instrumented_modules(wrapper) == []
    # a transformers model as the root: no model inside it is wrapped but itself
    model = _llama("sdpa")
    attnscope.instrument(model, trace_model=True)
    assert [p for p in instrumented_modules(model) if "layers" not in p] == [""]
    attnscope.uninstrument(model)


def test_a_second_model_of_the_process_says_which_it_is() -> None:
    """Two models with the same module paths (a model and its assistant, two encoders): the
    second and later ones instrumented in the process carry their name and number; the first
    carries neither, and a model keeps its number when instrumented again."""
    first, second, third = _llama("sdpa"), _llama("sdpa"), _llama("sdpa")
    attnscope.instrument(first, trace_model=True)
    attnscope.instrument(second, trace_model=True)
    attnscope.instrument(third, name_prefix="draft")
    attnscope.uninstrument(second)
    attnscope.instrument(second, trace_model=True)  # again: still the second
    with capture_spans() as spans, torch.no_grad():
        for model in (first, second, third):
            model(IDS, attention_mask=MASK)
    by_model: dict[Any, set[str]] = {}
    for span in spans:
        a = span.attributes
        key = (a.get("attnscope.model"), a.get("attnscope.model.instance"))
        by_model.setdefault(key, set()).add(base_name(span))
    layers = {f"model.layers.{i}.self_attn" for i in (0, 1)}
    assert by_model[(None, None)] == layers | {"LlamaForCausalLM", "model.layers.0",
                                               "model.layers.1"}
    assert by_model[("LlamaForCausalLM", 2)] == by_model[(None, None)]
    assert by_model[("draft", 3)] == {f"draft.{p}" for p in layers}
    assert len(by_model) == 3


def test_gpt2_layers_heads_and_cache() -> None:
    cfg = transformers.GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=4)
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(cfg).eval()
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        ref = model(ids).logits
    attnscope.instrument(model)
    assert instrumented_modules(model) == ["transformer.h.0.attn", "transformer.h.1.attn"]
    kw = _cache_kw(model)
    with capture_spans() as spans, torch.no_grad():
        first = model(ids, use_cache=True)
        model(torch.tensor([[5]]), use_cache=True, **{kw: _cache_of(first)})
    assert len(spans) == 4
    prefill = [s.attributes for s in spans if s.attributes["attnscope.seq_len_q"] == 4]
    decode = [s.attributes for s in spans if s.attributes["attnscope.seq_len_q"] == 1]
    assert {a["attnscope.layer_index"] for a in prefill} == {0, 1}
    for a in prefill:
        assert a["attnscope.num_heads"] == 4 and a["attnscope.head_dim"] == 8
        # before transformers 4.52 the first call has no cache, only use_cache=True
        assert a["attnscope.phase"] == "prefill" and a["attnscope.kv_cache_len"] == 0
        assert a["attnscope.flops"] == _brute_flops(1, 4, 4, 4, 8, causal=True)
    for a in decode:
        assert a["attnscope.phase"] == "decode" and a["attnscope.seq_len_kv"] == 5
    attnscope.uninstrument(model)
    with torch.no_grad():
        assert torch.equal(model(ids).logits, ref)


def test_bert_padded_batch_tokens_and_dense_flops_match_flop_counter() -> None:
    cfg = transformers.BertConfig(
        vocab_size=64,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=32,
        attn_implementation="eager",
    )
    torch.manual_seed(0)
    model = transformers.BertModel(cfg).eval()
    ids = torch.tensor([[2, 3, 4, 5, 6, 7], [2, 3, 4, 0, 0, 0], [2, 3, 0, 0, 0, 0]])
    mask = (ids != 0).long()
    with torch.no_grad():
        ref = model(ids, attention_mask=mask).last_hidden_state
    attnscope.instrument(model)
    paths = [f"encoder.layer.{i}.attention.self" for i in range(2)]
    assert instrumented_modules(model) == paths
    counter = FlopCounterMode(display=False)
    with capture_spans() as spans, torch.no_grad(), counter:
        model(ids, attention_mask=mask)
    assert sorted(base_name(s) for s in spans) == paths
    measured = _layer_bmm_flops(counter, "attention.self")
    for s in spans:
        a = s.attributes
        assert a["attnscope.tokens"] == 11 and a["attnscope.causal"] is False
        assert "attnscope.phase" not in a
        (key,) = [k for k in measured if k.endswith(base_name(s))]
        assert a["attnscope.flops"] == measured[key] == _brute_flops(3, 4, 6, 6, 8, causal=False)
    attnscope.uninstrument(model)
    with torch.no_grad():
        assert torch.equal(model(ids, attention_mask=mask).last_hidden_state, ref)


@pytest.mark.slow
def test_llama_torch_compile_after_instrument() -> None:
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    model = _llama("sdpa")
    ids = torch.tensor([[5, 6, 7, 8]])
    with torch.no_grad():
        ref = model(ids, use_cache=False).logits
    attnscope.instrument(model, trace_model=True)
    compiled = torch.compile(model, backend="eager")
    with capture_spans(sample_rate=0.5) as spans, torch.no_grad():
        outs = [compiled(ids, use_cache=False).logits for _ in range(6)]
    assert all(torch.allclose(o, ref) for o in outs)
    assert counters["stats"]["unique_graphs"] <= 2 and not counters["recompiles"]
    assert spans == []
    attnscope.uninstrument(model)
    torch._dynamo.reset()


def _arch_cases() -> dict[str, Any]:
    small = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        vocab_size=64,
        max_position_embeddings=32,
    )
    t = transformers
    return {
        "gpt_neox": (
            lambda: t.GPTNeoXForCausalLM(t.GPTNeoXConfig(**small)),
            lambda m: m(torch.tensor([[2, 3, 4, 5]])),
            2,
        ),
        "mistral-sliding": (
            lambda: t.MistralForCausalLM(
                t.MistralConfig(**small, num_key_value_heads=1, sliding_window=3)
            ),
            lambda m: m(torch.tensor([[2, 3, 4, 5, 6]])),
            2,
        ),
        "roberta": (
            lambda: t.RobertaModel(t.RobertaConfig(**{**small, "max_position_embeddings": 40})),
            lambda m: m(torch.tensor([[2, 3, 4, 5]])),
            2,
        ),
        "t5": (
            lambda: t.T5ForConditionalGeneration(
                t.T5Config(
                    vocab_size=64,
                    d_model=32,
                    d_kv=8,
                    d_ff=64,
                    num_layers=1,
                    num_heads=4,
                    decoder_start_token_id=0,
                )
            ),
            lambda m: m(
                input_ids=torch.tensor([[2, 3, 4, 5, 6]]),
                decoder_input_ids=torch.tensor([[0, 3, 4]]),
            ),
            3,
        ),
        "vit": (
            lambda: t.ViTModel(
                t.ViTConfig(
                    hidden_size=32,
                    num_hidden_layers=1,
                    num_attention_heads=4,
                    intermediate_size=64,
                    image_size=16,
                    patch_size=8,
                )
            ),
            lambda m: m(torch.randn(1, 3, 16, 16)),
            1,
        ),
        "whisper": (
            lambda: t.WhisperForConditionalGeneration(
                t.WhisperConfig(
                    vocab_size=64,
                    d_model=32,
                    encoder_layers=1,
                    decoder_layers=1,
                    encoder_attention_heads=4,
                    decoder_attention_heads=4,
                    encoder_ffn_dim=64,
                    decoder_ffn_dim=64,
                    num_mel_bins=8,
                    max_source_positions=8,
                    max_target_positions=16,
                    pad_token_id=0,
                    bos_token_id=1,
                    eos_token_id=2,
                    decoder_start_token_id=1,
                )
            ),
            lambda m: m(
                input_features=torch.randn(1, 8, 16), decoder_input_ids=torch.tensor([[1, 2, 3]])
            ),
            3,
        ),
    }


@pytest.mark.parametrize("arch", sorted(_arch_cases()))
def test_structural_detection_across_architectures(arch: str) -> None:
    build, run, expected = _arch_cases()[arch]
    torch.manual_seed(0)
    model = build().eval()
    attnscope.instrument(model)
    assert len(instrumented_modules(model)) == expected
    with capture_spans() as spans, torch.no_grad():
        run(model)
    assert len(spans) == expected
    for s in spans:
        a = s.attributes
        b, h, d = a["attnscope.batch_size"], a["attnscope.num_heads"], a["attnscope.head_dim"]
        sq, skv = a["attnscope.seq_len_q"], a["attnscope.seq_len_kv"]
        w = a.get("attnscope.sliding_window") or skv
        pairs = sum(
            1
            for i in range(sq)
            for j in range(skv)
            if not a["attnscope.causal"] or 0 <= i + skv - sq - j < w
        )
        assert a["attnscope.flops"] == 2 * b * h * pairs * (d + d), base_name(s)
        if "encoder_attn" in base_name(s) or "EncDecAttention" in base_name(s):
            assert a["attnscope.causal"] is False and skv != sq  # cross-attention: source length
    if arch == "mistral-sliding":
        assert {s.attributes["attnscope.num_kv_heads"] for s in spans} == {1}
        assert {s.attributes["attnscope.sliding_window"] for s in spans} == {3}
    attnscope.uninstrument(model)
    assert instrumented_modules(model) == []


def test_static_cache_generate_counts_against_the_filled_part_of_the_buffer() -> None:
    model = _llama("sdpa", layers=1)
    attnscope.instrument(model, trace_model=True)
    with capture_spans() as spans, torch.no_grad():
        model.generate(
            IDS,
            attention_mask=MASK,
            max_new_tokens=3,
            min_new_tokens=3,
            do_sample=False,
            pad_token_id=0,
            cache_implementation="static",
        )
    layers = sorted(
        (s for s in spans if base_name(s) == "model.layers.0.self_attn"), key=lambda s: s.start_time
    )
    got = [
        (a["attnscope.phase"], a["attnscope.seq_len_kv"], a["attnscope.tokens"])
        for a in (s.attributes for s in layers)
    ]
    assert got == [("prefill", 5, 8), ("decode", 6, 2), ("decode", 7, 2)]
    forwards = [s for s in spans if base_name(s) == "LlamaForCausalLM"]
    assert sorted(s.attributes["attnscope.tokens"] for s in forwards) == [2, 2, 8]
    attnscope.uninstrument(model)


def test_output_tokens_stop_at_each_rows_first_eos() -> None:
    from attnscope._derive.call import derive
    from attnscope._record.capture import Facts, ModelFacts

    facts = ModelFacts(2, 3)
    facts.generate = True
    facts.eos = (2,)
    facts.mask = torch.tensor([[1, 1, 1], [0, 1, 1]])
    facts.output = torch.tensor([[7, 7, 7, 4, 2, 0, 0], [0, 7, 7, 4, 5, 6, 2]])
    out = derive([], facts=Facts(model=facts))
    assert out["gen_ai.usage.input_tokens"] == 5
    assert out["gen_ai.usage.output_tokens"] == 2 + 4


def test_t5_generate_usage_counts_decoder_tokens() -> None:
    cfg = transformers.T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=64,
        num_layers=1,
        num_heads=4,
        decoder_start_token_id=0,
        eos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(cfg).eval()
    attnscope.instrument(model, trace_model=True)
    ids = torch.tensor([[2, 3, 4, 5, 6], [2, 3, 4, 0, 0]])
    with capture_spans() as spans, torch.no_grad():
        model.generate(
            ids,
            attention_mask=(ids != 0).long(),
            max_new_tokens=4,
            min_new_tokens=4,
            do_sample=False,
        )
    (gen,) = [s for s in spans if base_name(s).endswith(".generate")]
    assert gen.attributes["gen_ai.usage.input_tokens"] == 8
    assert gen.attributes["gen_ai.usage.output_tokens"] == 8
    cross = [s.attributes for s in spans if base_name(s).endswith("EncDecAttention")]
    assert cross and all(a["attnscope.seq_len_kv"] == 5 for a in cross)
    # the model's forwards under generate() are the decoder's: one start token, then one new
    # token a step, per row (the encoder's padding mask says nothing of them)
    forwards = sorted((s for s in spans if s.attributes.get("code.function.name")
                       == "T5ForConditionalGeneration.forward"), key=lambda s: s.start_time)
    assert [f.attributes["attnscope.phase"] for f in forwards] == ["prefill"] + ["decode"] * 3
    assert all(f.attributes["attnscope.tokens"] == 2 for f in forwards)
    assert forwards[0].attributes["gen_ai.usage.input_tokens"] == 2
    attnscope.uninstrument(model)
