"""Every transformers architecture that builds tiny on CPU: attnscope's spans against the model.

For each family a tiny model (1-3 layers, width 32) runs three ways uninstrumented for the
reference (see ``tests/support/arch_sweep.py``: eager weights, FLOP counter) and then instrumented:
a plain batch of two, the same batch with the second row's first two tokens padded, and a greedy
``generate()`` of three tokens for causal LMs. Checked per attention call, in call order within
each group of weights (encoder, decoder, cross, vision, text): the number of calls, batch, heads,
Sq, Skv, FLOPs (visible pairs · 2 · (Dqk + Dv)), tokens with padding, and per generate step
the phase and the cache length the step's weights show.
"""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Iterator
from typing import Any, NamedTuple

import pytest
import torch

import attnscope
from attnscope._derive.result import INEXACT_REASONS
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")
from tests.support import arch_sweep as sweep  # noqa: E402


class Case(NamedTuple):
    model_type: str
    class_name: str
    kind: str  # causal | encoder | seq2seq | whisper | vision | pair (text + vision)
    # config keywords over sweep.FEATURES[model_type] (a variant of the family: LongT5's kinds)
    features: tuple[tuple[str, Any], ...] = ()
    variant: str = ""  # the test id's suffix for a variant

    @property
    def name(self) -> str:
        return f"{self.model_type}[{self.variant}]" if self.variant else self.model_type


NAMED = [
    *(Case(t, c, "causal") for t, c in [
        ("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM"),
        ("mixtral", "MixtralForCausalLM"), ("qwen2", "Qwen2ForCausalLM"),
        ("qwen3", "Qwen3ForCausalLM"), ("qwen3_moe", "Qwen3MoeForCausalLM"),
        ("gemma", "GemmaForCausalLM"), ("gemma2", "Gemma2ForCausalLM"),
        ("gemma3_text", "Gemma3ForCausalLM"), ("phi", "PhiForCausalLM"),
        ("phi3", "Phi3ForCausalLM"), ("falcon", "FalconForCausalLM"), ("opt", "OPTForCausalLM"),
        ("gpt2", "GPT2LMHeadModel"), ("gptj", "GPTJForCausalLM"),
        ("gpt_neo", "GPTNeoForCausalLM"), ("gpt_neox", "GPTNeoXForCausalLM"),
        ("gpt_bigcode", "GPTBigCodeForCausalLM"), ("codegen", "CodeGenForCausalLM"),
        ("cohere", "CohereForCausalLM"), ("cohere2", "Cohere2ForCausalLM"),
        ("olmo", "OlmoForCausalLM"), ("olmo2", "Olmo2ForCausalLM"),
        ("starcoder2", "Starcoder2ForCausalLM"), ("smollm3", "SmolLM3ForCausalLM"),
        ("deepseek_v2", "DeepseekV2ForCausalLM"), ("deepseek_v3", "DeepseekV3ForCausalLM"),
        ("gpt_oss", "GptOssForCausalLM"), ("bloom", "BloomForCausalLM"),
        ("mpt", "MptForCausalLM"),
        # a masked LM that generates: bidirectional layers over a cache (config.causal=False)
        ("xlm", "XLMWithLMHeadModel"),
        # config.sliding_window set, never applied: the mask decides (the config's window is not)
        ("moshi", "MoshiForCausalLM"),
        # generate takes its prompt's pad-id token for padding unless given a mask
        ("ministral3", "Ministral3ForCausalLM"),
        ("diffllama", "DiffLlamaForCausalLM"),  # differential: two attention cores per call
        ("minimax", "MiniMaxForCausalLM"),  # lightning (linear attention) layers beside softmax
        # recurrent: each H/L cycle runs the same layers over a cache slot of its own
        ("hrm_text", "HrmTextForCausalLM"),
        # compressed KV entries after the window's keys (sparse: an indexer's top-k of them)
        ("deepseek_v4", "DeepseekV4ForCausalLM"),
        # configs that leave head_dim / the kv heads None for the model, which takes them so
        ("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM"),
        ("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM"), ("ministral", "MinistralForCausalLM"),
        ("nemotron", "NemotronForCausalLM"),
        ("lfm2_moe", "Lfm2MoeForCausalLM"),  # a convolution layer beside attention
        ("xmod", "XmodForCausalLM"),  # a default language for its adapters
        # per-layer sizes (its full-attention layer's heads twice as wide) beside a sliding one
        ("gemma4_text", "Gemma4ForCausalLM"),
        # KV sharing: its last layers attend the keys the earlier ones stored this call
        ("gemma3n_text", "Gemma3nForCausalLM"),
        ("zaya", "ZayaForCausalLM"),  # its masks handed to the layer as a mapping by kind
        # indexed attention: each query keeps the top blocks of its visible keys (a budget)
        ("qwen4_exp_text", "Qwen4ExpForCausalLM"),
    ]),
    *(Case(t, c, "encoder") for t, c in [
        ("bert", "BertModel"), ("roberta", "RobertaModel"), ("distilbert", "DistilBertModel"),
        ("electra", "ElectraModel"), ("albert", "AlbertModel"), ("deberta-v2", "DebertaV2Model"),
        ("modernbert", "ModernBertModel"),
    ]),
    Case("t5", "T5ForConditionalGeneration", "seq2seq"),
    Case("bart", "BartForConditionalGeneration", "seq2seq"),
    Case("mbart", "MBartForConditionalGeneration", "seq2seq"),
    Case("marian", "MarianMTModel", "seq2seq"),
    Case("whisper", "WhisperForConditionalGeneration", "whisper"),
    Case("vit", "ViTModel", "vision"),
    Case("swin", "SwinModel", "vision"),
    Case("clip", "CLIPModel", "pair"),
    Case("siglip", "SiglipModel", "pair"),
]


# Families whose feature needs a config of its own, beyond the causal LMs (opt-in with them):
# LongT5's encoder attention in blocks of local_radius + 1 (local, and with transient global
# tokens of each block of global_block_size).
FEATURED = [
    Case("longt5", "LongT5ForConditionalGeneration", "seq2seq",
         (("encoder_attention_type", "local"), ("local_radius", 2)), "local"),
    Case("longt5", "LongT5ForConditionalGeneration", "seq2seq",
         (("encoder_attention_type", "transient-global"), ("local_radius", 2),
          ("global_block_size", 2)), "transient-global"),
]


def _attrs(span: Any) -> dict[str, Any]:
    return {k.removeprefix("attnscope."): v for k, v in (span.attributes or {}).items()}


_SEEN: list[dict[str, Any]] = []  # the attention spans of the check running (see result())


def _instrumented_run(model: Any, call: Any) -> list[dict[str, Any]]:
    with capture_spans() as spans, sweep.quiet(), torch.no_grad():
        call()
    calls = [s for s in spans if "attnscope.seq_len_q" in (s.attributes or {})]
    got = [_attrs(s) for s in sorted(calls, key=lambda s: s.start_time)]
    _SEEN.extend(got)
    return got


def _masked_groups(kind: str) -> tuple[str, ...]:
    """Weight groups whose queries are the padded input's tokens."""
    return {"causal": ("attentions",), "encoder": ("attentions",),
            "seq2seq": ("encoder_attentions",), "pair": ("text",)}.get(kind, ())


def _compare(a: dict[str, Any], ref: sweep.Reference, c: sweep.Weights, where: str,
             causal: bool | None = None) -> list[str]:
    """One span against its weights. ``causal``: what the module's weights showed on a call with
    several queries (a decode step's one query cannot show it). A span marked ``exact=false``
    says its FLOPs are an upper bound: checked as one, with a reason of the vocabulary."""
    dims = ref.dims.get(c.module)
    if c.w.ndim == 5:  # (B, blocks, H, block, keys): LongT5's blocked local attention
        b, nb, h, block, keys = c.w.shape
        want: dict[str, Any] = {"module": c.module, "batch_size": b, "num_heads": h,
                                "seq_len_q": ref.seq}
        # the real queries' rows (the last block is padded to its size)
        c = c._replace(w=c.w.permute(0, 2, 1, 3, 4).reshape(b, h, nb * block, keys)[
            :, :, :ref.seq])
    else:
        b, h, sq, skv = c.w.shape
        want = {"module": c.module, "batch_size": b, "num_heads": h, "seq_len_q": sq,
                "seq_len_kv": skv}
    shown = sweep.causal_shown(c.w) if "seq_len_kv" in want else None
    if shown is not None or causal is not None:
        want["causal"] = shown if shown is not None else causal
    if dims is None:
        return [f"{where}: no whole Dqk + Dv from the matmul FLOPs of {c.module}"]
    flops = int((c.w != 0).sum()) * 2 * dims
    problems = []
    if a.get("exact") is False:
        if a.get("inexact_reason") not in INEXACT_REASONS:
            problems.append(f"{where}: exact=false with reason {a.get('inexact_reason')!r}")
        if not isinstance(a.get("flops"), int) or a["flops"] < flops:
            problems.append(f"{where}: marked FLOPs {a.get('flops')} below the weights' {flops}")
    else:
        want["flops"] = flops
    return problems + [f"{where} {a['module']}: {key} {a.get(key)} != {value}"
                       for key, value in want.items() if a.get(key) != value]


def _in_order(got: list[dict[str, Any]], calls: list[sweep.Weights]) -> list[dict[str, Any]]:
    """The spans in the order of ``calls``: by module, each module's calls in time order."""
    queues: dict[str, list[dict[str, Any]]] = {}
    for a in got:
        queues.setdefault(a["module"], []).append(a)
    return [queues[c.module].pop(0) for c in calls]


def _check(got: list[dict[str, Any]], ref: sweep.Reference, tokens: dict[str, int | None],
           label: str, model: Any = None, mask: torch.Tensor | None = None) -> list[str]:
    pooling = [a for a in got if a["module_class"] == "MultiheadAttention"]
    if len(pooling) != ref.pooling_calls:
        return [f"{label}: {len(pooling)} nn.MultiheadAttention spans != {ref.pooling_calls}"]
    got = [a for a in got if a not in pooling]
    counts = sorted(a["module"] for a in got)
    want = sorted(c.module for c in ref.calls)
    if counts != want:
        return [f"{label}: attention calls by module {counts} != {want}"]
    problems: list[str] = []
    for i, (a, c) in enumerate(zip(_in_order(got, ref.calls), ref.calls, strict=True)):
        where = f"{label} {c.group}[{i}]"
        problems += _compare(a, ref, c if mask is None else sweep.padded(model, c, mask), where)
        real = tokens.get(c.group)
        queries = ref.seq if c.w.ndim == 5 else c.w.shape[2]  # blocked: (B, blocks, H, ...)
        expected = c.w.shape[0] * queries if real is None else real
        if a.get("tokens") != expected:
            problems.append(f"{where}: tokens {a.get('tokens')} != {expected}")
    return problems


def _forward_problems(case: Case, model: Any, ref: sweep.Reference) -> list[str]:
    problems: list[str] = []
    for padded in (False, True) if _masked_groups(case.kind) else (False,):
        inputs = sweep.inputs_for(case.kind, model, padded)
        real = int(inputs["attention_mask"].sum()) if padded else None
        tokens = dict.fromkeys(_masked_groups(case.kind), real)
        got = _instrumented_run(model, lambda inputs=inputs: model(**inputs))
        problems += _check(got, ref, tokens, "padded" if padded else "plain", model,
                           inputs["attention_mask"] if padded else None)
    return problems


GEN = {"max_new_tokens": 3, "min_new_tokens": 3, "do_sample": False}


def _generate(model: Any, prompt: torch.Tensor, **kwargs: Any) -> Any:
    """``generate`` on an unpadded prompt: told so, since generate takes a prompt token equal to
    the config's pad id for padding (Ministral 3's tiny pad id 11 is in the drawn prompt)."""
    return model.generate(prompt, attention_mask=torch.ones_like(prompt), **GEN, **kwargs)


def _generate_reference(model: Any, prompt: torch.Tensor) -> list[list[torch.Tensor]]:
    with sweep.quiet(), torch.no_grad():
        out = _generate(model, prompt, output_attentions=True, return_dict_in_generate=True)
    return [[w for w in step if sweep.softmax_map(w)] for step in out.attentions]


def _step_expectations(steps: list[list[torch.Tensor]]) -> list[list[dict[str, Any]]]:
    """Cache length and phase each call's weights show: Skv - Sq keys were cached. A model whose
    later steps recompute the whole sequence (Sq = Skv) kept no cache between steps: no phase
    and no length, or, where each step's layers fill a cache of their own that the next step
    does not get (XLM in transformers 5.20.2), a prefill of an empty one. Each call: the
    readings it may give."""
    cached = any(w.shape[-2] != w.shape[-1] for step in steps[1:] for w in step)
    out = []
    for i, step in enumerate(steps):
        for w in step:
            past = w.shape[-1] - w.shape[-2]
            out.append([{"kv_cache_len": past, "phase": "decode" if i else "prefill"}] if cached
                       else [{"kv_cache_len": None, "phase": None},
                             {"kv_cache_len": 0, "phase": "prefill"}])
    return out


def _generate_problems(model: Any, ref: sweep.Reference, steps: list[list[torch.Tensor]],
                       prompt: torch.Tensor) -> list[str]:
    got = _instrumented_run(model, lambda: _generate(model, prompt))
    weights = [w for step in steps for w in step]
    if len(got) != len(weights):
        return [f"generate: {len(got)} attention spans != {len(weights)} weights"]
    per_step = len(steps[0])  # the modules of one forward, in the order the model returns them
    # each module's causality as its prefill weights show it (a decode step's cannot)
    causal = [sweep.causal_shown(w) for w in steps[0]]
    problems: list[str] = []
    for n, (a, w, wants) in enumerate(zip(got, weights, _step_expectations(steps), strict=True)):
        where = f"generate call {n}"
        problems += _compare(a, ref, ref.calls[n % per_step]._replace(w=w), where,
                             causal[n % per_step])
        if not any(all(a.get(k) == v for k, v in want.items()) for want in wants):
            problems += [f"{where} {a['module']}: {k} {a.get(k)} != {v}"
                         for k, v in wants[0].items() if a.get(k) != v]
    return problems


class Prepared(NamedTuple):
    model: Any
    ref: sweep.Reference
    plain: dict[str, Any]
    steps: list[list[torch.Tensor]] | None


@functools.lru_cache(maxsize=1)  # the forward and generate tests of one family share it
def _prepare(case: Case) -> Prepared | str:
    """The tiny model and its own account, or why it cannot be had."""
    try:
        model = sweep.build(case.model_type, case.class_name, **dict(case.features))
        plain = sweep.inputs_for(case.kind, model, padded=False)
        ref, _ = sweep.reference(model, plain)
        steps = None
        if case.kind == "causal":
            steps = _generate_reference(model, plain["input_ids"][:1])
    except Exception as err:  # the architecture, not attnscope: it cannot build or run tiny
        return (f"{case.name}: does not build/run from a tiny config: "
                f"{type(err).__name__}: {str(err)[:160]}")
    if not ref.calls:
        return f"{case.name}: eager attention weights are not returned"
    return Prepared(model, ref, plain, steps)


def _instrumented(case: Case) -> Prepared:
    prepared = _prepare(case)
    if isinstance(prepared, str):
        pytest.skip(prepared)
    return prepared


def forward_problems(case: Case) -> list[str]:
    p = _instrumented(case)
    attnscope.instrument(p.model)
    try:
        return _forward_problems(case, p.model, p.ref)
    finally:
        attnscope.uninstrument(p.model)


def generate_problems(case: Case) -> list[str]:
    p = _instrumented(case)
    if p.steps is None:
        pytest.skip(f"{case.name}: not a causal LM")
    attnscope.instrument(p.model)
    try:
        return _generate_problems(p.model, p.ref, p.steps, p.plain["input_ids"][:1])
    finally:
        attnscope.uninstrument(p.model)


# What may differ between two implementations of one call: its times, the implementation's name,
# and the bytes of the mask each is handed (sdpa gets none, or a bool one, where eager gets floats)
_PER_RUN = frozenset(("wall_ns", "tflops", "tokens_per_s", "summary", "memory.host_rss_bytes",
                      "implementation", "bytes", "arithmetic_intensity",
                      "model", "model.instance"))  # the twin is the process's second model


def _mask_bytes(mask: Any, skv: Any) -> int:
    """What reading ``mask`` costs, as stored, cut to the call's keys (0: none)."""
    if not isinstance(mask, torch.Tensor):
        return 0
    keys = min(mask.shape[-1], skv) if isinstance(skv, int) else mask.shape[-1]
    return keys * mask[..., 0].numel() * mask.element_size()


def _mask_of(module: Any, args: Any, kwargs: Any) -> Any:
    """The mask argument of a call (``attention_mask``; T5's ``mask``), by the signature."""
    try:
        named = inspect.signature(module.forward).bind_partial(*args, **kwargs).arguments
    except TypeError:
        named = kwargs
    mask = next((named[k] for k in ("attention_mask", "mask") if named.get(k) is not None), None)
    return mask.get("causal") if isinstance(mask, dict) else mask  # Zaya: its masks by kind


def _masks_seen(model: Any, names: set[str]) -> tuple[dict[str, list[Any]], Any]:
    """The ``attention_mask`` each named module is called with, per module in call order."""
    seen: dict[str, list[Any]] = {n: [] for n in names}
    modules = dict(model.named_modules())
    hooks = [modules[n].register_forward_pre_hook(
        lambda m, args, kwargs, n=n: seen[n].append(_mask_of(m, args, kwargs)),
        with_kwargs=True) for n in names if n in modules]
    return seen, lambda: [h.remove() for h in hooks]


def _runs(case: Case, p: Prepared, model: Any) -> list[tuple[str, Any]]:
    """The calls of the forward and generate checks on ``model``, by label."""
    out = [(f"padded={padded}", functools.partial(
        lambda inputs: model(**inputs), sweep.inputs_for(case.kind, model, padded)))
        for padded in ((False, True) if _masked_groups(case.kind) else (False,))]
    if p.steps is not None:
        out.append(("generate", lambda: _generate(model, p.plain["input_ids"][:1])))
    return out


def _run(model: Any, call: Any, names: set[str]) -> tuple[list[dict[str, Any]],
                                                          dict[str, Iterator[Any]]]:
    """The call's attention spans, and each module's masks in call order."""
    seen, remove = _masks_seen(model, names)
    try:
        return _instrumented_run(model, call), {n: iter(v) for n, v in seen.items()}
    finally:
        remove()


def _same_call(a: dict[str, Any], b: dict[str, Any], mask_a: Any, mask_b: Any,
               where: str) -> list[str]:
    """One call's spans under eager (``a``) and sdpa (``b``): the same figures, and bytes that
    differ by the masks they were handed only."""
    problems = [f"{where} {a['module']}: {k} eager {a.get(k)} != sdpa {b.get(k)}"
                for k in sorted((set(a) | set(b)) - _PER_RUN) if a.get(k) != b.get(k)]
    if ("bytes" in a) != ("bytes" in b):
        problems.append(f"{where}: bytes eager {a.get('bytes')} / sdpa {b.get('bytes')}")
    elif "bytes" in a:
        skv = a.get("seq_len_kv")
        if a["bytes"] - _mask_bytes(mask_a, skv) != b["bytes"] - _mask_bytes(mask_b, skv):
            problems.append(f"{where}: bytes eager {a['bytes']} / sdpa {b['bytes']} differ by "
                            f"more than their masks")
    return problems


def _sdpa_twin(case: Case, p: Prepared) -> Any:
    """The family's model with the same weights under sdpa: a fresh build where a built model
    cannot switch (Falcon, BLOOM: attention of their own, not transformers' interface)."""
    try:
        twin = sweep.build(case.model_type, case.class_name, impl="sdpa", **dict(case.features))
    except (ValueError, ImportError) as err:  # the family has no sdpa
        pytest.skip(f"{case.name}: no sdpa: {str(err)[:120]}")
    if twin.config._attn_implementation != "sdpa":
        pytest.skip(f"{case.name}: no sdpa: built as {twin.config._attn_implementation}")
    twin.load_state_dict(p.model.state_dict())
    return twin


def sdpa_problems(case: Case) -> list[str]:
    """The forward and generate checks' calls run again under sdpa, weights and inputs alike:
    every figure as eager's (which the other checks hold to the weights), span for span."""
    p = _instrumented(case)
    twin = _sdpa_twin(case, p)
    names = {c.module for c in p.ref.calls}
    for model in (p.model, twin):
        attnscope.instrument(model)
    problems: list[str] = []
    try:
        for (label, call), (_, twin_call) in zip(_runs(case, p, p.model), _runs(case, p, twin),
                                                 strict=True):
            eager, masks_e = _run(p.model, call, names)
            sdpa, masks_s = _run(twin, twin_call, names)
            if [a["module"] for a in eager] != [a["module"] for a in sdpa]:
                problems.append(f"sdpa {label}: calls {len(sdpa)} != eager's {len(eager)}")
                continue
            if {a.get("implementation") for a in sdpa} - {"sdpa", None}:
                problems.append(f"sdpa {label}: implementation not sdpa")
            for i, (a, b) in enumerate(zip(eager, sdpa, strict=True)):
                problems += _same_call(a, b, next(masks_e.get(a["module"], iter(())), None),
                                       next(masks_s.get(b["module"], iter(())), None),
                                       f"sdpa {label}[{i}]")
    finally:
        for model in (p.model, twin):
            attnscope.uninstrument(model)
    return problems


CHECKS = {"forward": forward_problems, "generate": generate_problems, "sdpa": sdpa_problems}


class Result(NamedTuple):
    """One check of one family: its problems (None: it could not run, ``why`` says why) and
    whether its spans were marked ``exact=false``, or absent."""

    problems: list[str] | None
    why: str
    spans: int
    marked: frozenset[str]  # the inexact reasons its spans carry


_RESULTS: dict[tuple[Case, str], Result] = {}  # the count test reads what the checks found


def result(case: Case, check: str) -> Result:
    """The check's result, run once per session (the count test reuses the family tests')."""
    key = (case, check)
    if key not in _RESULTS:
        _SEEN.clear()
        try:
            problems: list[str] | None = CHECKS[check](case)
            why = ""
        except pytest.skip.Exception as skipped:
            problems, why = None, str(skipped.msg)
        _RESULTS[key] = Result(problems, why, len(_SEEN), frozenset(
            str(a.get("inexact_reason")) for a in _SEEN if a.get("exact") is False))
        _SEEN.clear()
    return _RESULTS[key]


def _checked(case: Case, check: str) -> list[str]:
    found = result(case, check)
    if found.problems is None:
        pytest.skip(found.why)
    return found.problems


def _checks_of(case: Case) -> tuple[str, ...]:
    return ("forward", "generate", "sdpa") if case.kind == "causal" else ("forward", "sdpa")


def params(cases: list[Case], known: dict[tuple[str, str], str]) -> list[Any]:
    """(case, check) pairs, a family's checks side by side (they share one built model)."""
    out = []
    for c in cases:
        for check in _checks_of(c):
            reason = known.get((c.name, check))
            marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
            out.append(pytest.param(c, check, id=f"{c.name}-{check}", marks=marks))
    return out


KNOWN: dict[tuple[str, str], str] = {}  # every named family is exact


@pytest.mark.parametrize(("case", "check"), params(NAMED, KNOWN))
def test_named_family(case: Case, check: str) -> None:
    assert _checked(case, check) == []


def _auto_causal_lms() -> list[Case]:
    """Every ``*ForCausalLM`` transformers maps, beyond the named families."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES as names

    named = {c.model_type for c in NAMED}
    return [Case(t, c, "causal") for t, c in sorted(names.items())
            if t not in named and isinstance(c, str)]


NOT_TRACED = "not recognised as attention (no span); projections named otherwise or a list output"
AUTO_KNOWN = {
    **{(t, check): NOT_TRACED for t in ("cpmant", "openai-gpt", "xlnet")
       for check in ("forward", "generate")},
    **{("prophetnet", check): "ProphetNet's n-gram self-attention (its decoder) is not traced"
       for check in ("forward", "generate")},
}
EVERYTHING = "ATTNSCOPE_ARCH_SWEEP"
# read when the module is collected: the suite's fixtures clear ATTNSCOPE_* variables per test
FULL = os.environ.get(EVERYTHING) == "all"


@pytest.mark.slow
@pytest.mark.skipif(not FULL,
                    reason=f"every other causal LM (about 3 min); set {EVERYTHING}=all")
@pytest.mark.parametrize(("case", "check"), params(_auto_causal_lms(), AUTO_KNOWN))
def test_every_other_causal_lm(case: Case, check: str) -> None:
    assert _checked(case, check) == []


class _Mixer(torch.nn.Module):
    """A token mixer with attention-like projections and a head count (linear attention)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.head_dim = 2, 4
        self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(8, 8) for _ in range(3))


class _Softmax(_Mixer):
    pass


def _hybrid(declares: bool) -> torch.nn.Module:
    layers = torch.nn.ModuleList(torch.nn.Module() for _ in range(3))
    for layer, cls in zip(layers, (_Mixer, _Softmax, _Mixer), strict=True):
        layer.self_attn = cls()
    layers[2].cross_attn = _Mixer()  # another slot: not a layer the declared class sits in
    model = torch.nn.Module()
    model.layers = layers
    if declares:  # what transformers models say through _can_record_outputs (a fresh class)
        model.__class__ = type("Hybrid", (torch.nn.Module,),
                               {"_can_record_outputs": {"attentions": _Softmax}})
    return model


def test_hybrid_model_traces_its_declared_attention_not_the_other_mixers() -> None:
    model = attnscope.instrument(_hybrid(declares=True))
    assert attnscope.instrumented_modules(model) == [
        "layers.1.self_attn", "layers.2.cross_attn"]
    plain = attnscope.instrument(_hybrid(declares=False))  # nothing declared: structure decides
    assert attnscope.instrumented_modules(plain) == [
        "layers.0.self_attn", "layers.1.self_attn", "layers.2.self_attn", "layers.2.cross_attn"]


FEATURED_KNOWN: dict[tuple[str, str], str] = {}


@pytest.mark.slow
@pytest.mark.skipif(not FULL,
                    reason=f"families configured for their feature; set {EVERYTHING}=all")
@pytest.mark.parametrize(("case", "check"), params(FEATURED, FEATURED_KNOWN))
def test_featured_family(case: Case, check: str) -> None:
    assert _checked(case, check) == []


# ---- how many families end up exact, marked, not instrumented -------------------------------

# Every family of the sweep that is not exact, and how: "marked" (some span says exact=false,
# with its reasons), "not instrumented" (the model returns attention weights, attnscope emits no
# attention span), "wrong" (spans that disagree with the weights: the known xfails above),
# "unbuildable" (no tiny model: the reason is printed). A family that turns inexact, loses its
# spans or stops building fails the count test below; so does one that becomes exact (update it).
NOT_EXACT: dict[str, str] = {
    "cpmant": "not instrumented", "openai-gpt": "not instrumented", "xlnet": "not instrumented",
    "doge": "marked: layer_narrows",  # padded rows: the top-k keys depend on values
    # padded rows: the compressed entries a row sees follow the positions it is given
    "deepseek_v4": "marked: layer_narrows",
    # padded rows: which blocks of its real keys a row's indexer keeps depends on values
    "qwen4_exp_text": "marked: layer_narrows", "qwen4_exp": "marked: layer_narrows",
    "prophetnet": "not instrumented",
}


def _outcome(case: Case) -> str:
    checks = [result(case, c) for c in _checks_of(case)]
    sdpa = checks.pop()  # None: the family has no sdpa
    if any(r.problems is None for r in checks):
        return "unbuildable"
    if not sum(r.spans for r in checks):
        return "not instrumented"
    if any(r.problems for r in checks) or sdpa.problems:
        return "wrong"
    reasons = sorted(set().union(*(r.marked for r in checks)))
    return f"marked: {', '.join(reasons)}" if reasons else "exact"


def _slice() -> list[Case]:
    """The families this run sweeps: the named ones; with the full sweep, every one."""
    if not FULL:
        return NAMED
    return [*NAMED, *FEATURED, *_auto_causal_lms()]


def test_exact_marked_and_not_instrumented_families_are_counted() -> None:
    cases = _slice()
    found = {c.name: _outcome(c) for c in cases}
    kinds = [k.split(":")[0] for k in found.values()]
    totals = {k: kinds.count(k) for k in ("exact", "marked", "not instrumented", "wrong",
                                          "unbuildable")}
    assert sum(totals.values()) == len(cases)
    print(f"\narch sweep, transformers {transformers.__version__}: {len(cases)} families: "
          + ", ".join(f"{n} {k}" for k, n in totals.items()))
    for c in cases:
        if found[c.name] != "exact":
            why = result(c, "forward").why if found[c.name] == "unbuildable" else ""
            print(f"  {c.name}: {found[c.name]}{' (' + why + ')' if why else ''}")
    names = {c.name for c in cases}
    unbuildable = {n for n, k in found.items() if k == "unbuildable"}
    expected = {n: k for n, k in NOT_EXACT.items() if n in names and n not in UNBUILDABLE}
    assert {n: k for n, k in found.items() if k not in ("exact", "unbuildable")} == expected
    assert unbuildable == UNBUILDABLE & names


# Families the sweep cannot build tiny (each one's reason is printed by the count test).
UNBUILDABLE = {
    "big_bird", "blt", "dbrx", "dory",
    "falcon_mamba", "gemma3n", "gemma4_assistant", "gemma4_unified_assistant",
    "inkling2_loop_text", "inkling2_text", "kolibri1_1", "mamba", "mamba2", "musicgen",
    "musicgen_melody", "reformer",
    "rwkv",  # its time-mixing "attentions" are no softmax map (signed): nothing to compare
    "xlstm", "zamba",
}
