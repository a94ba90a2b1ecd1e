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
    attnscope.instrument(model)
    try:
        with capture_spans() as spans, sweep.quiet(), torch.no_grad():
            run()
    finally:
        attnscope.uninstrument(model)
    calls = [s for s in spans if "attnscope.num_heads" in (s.attributes or {})]
    return [dict(s.attributes or {}) for s in sorted(calls, key=lambda s: s.start_time)]


def _generate(model: Any) -> None:
    ids = torch.randint(3, 60, (2, 8), generator=torch.Generator().manual_seed(1))
    model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                   min_new_tokens=3, do_sample=False)


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


def test_llama4_chunked_layers_count_only_the_keys_of_their_chunk() -> None:
    """Llama 4's chunked layers keep a chunk-sized cache and mask the previous chunk's keys: the
    FLOPs of every step are the pairs the softmax weights leave non-zero (2 · pairs · (Dqk + Dv))."""
    model = sweep.build("llama4_text", "Llama4ForCausalLM", attention_chunk_size=4,
                        no_rope_layers=[1, 0], num_hidden_layers=2)
    assert model.config.layer_types == ["chunked_attention", "full_attention"]
    ids = torch.randint(3, 60, (1, 6), generator=torch.Generator().manual_seed(1))

    def run() -> Any:
        return model.generate(input_ids=ids, attention_mask=torch.ones_like(ids),
                              max_new_tokens=4, min_new_tokens=4, do_sample=False,
                              output_attentions=True, return_dict_in_generate=True)

    with sweep.quiet(), torch.no_grad():
        reference = run()
    weights = [w for step in reference.attentions for w in step]  # step by step, layer by layer
    calls = _calls(model, run)
    assert len(calls) == len(weights) == 8
    dims = model.config.head_dim * 2
    for a, w in zip(calls, weights, strict=True):
        assert (a["attnscope.seq_len_q"], a["attnscope.seq_len_kv"]) == tuple(w.shape[-2:])
        assert a["attnscope.flops"] == 2 * int((w != 0).sum()) * dims, a["attnscope.module"]
        assert "attnscope.exact" not in a
