"""A transformers layer configured for one attention implementation that ran another, named."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

import attnscope
from attnscope._profiles.kernels import ran_implementation
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")


def _model(impl: str) -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation=impl, pad_token_id=0, eos_token_id=None, bos_token_id=None)
    model = transformers.LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model)
    return model


def _layer_spans(model: Any) -> list[Any]:
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000) as spans, torch.no_grad():
        model(input_ids=torch.tensor([[5, 6, 7, 8]]))
    return [s for s in spans if s.attributes.get("attnscope.module", "").endswith("self_attn")]


@pytest.mark.parametrize("impl, ran", [("sdpa", "sdpa"), ("eager", "eager")])
def test_a_profiled_layer_says_which_implementation_its_ops_show(impl: str, ran: str) -> None:
    (span,) = _layer_spans(_model(impl))
    a = span.attributes
    assert a["attnscope.tier"] == "profile"
    assert a["attnscope.implementation"] == impl and a["attnscope.implementation.ran"] == ran
    assert "attnscope.backend.expected" not in a


def test_sdpa_configured_but_eager_ran_is_a_named_fallback_warned_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """What transformers before 5 did under output_attentions=True, done here by sending the
    sdpa name to the eager function."""
    from transformers.models.llama import modeling_llama

    real = modeling_llama.ALL_ATTENTION_FUNCTIONS.get_interface

    def eager_for_sdpa(name: str, default: Any) -> Any:
        return default if name == "sdpa" else real(name, default)

    monkeypatch.setattr(modeling_llama.ALL_ATTENTION_FUNCTIONS, "get_interface", eager_for_sdpa)
    model = _model("sdpa")
    with caplog.at_level(logging.WARNING):
        spans = _layer_spans(model) + _layer_spans(model)
    for span in spans:
        a = span.attributes
        assert a["attnscope.implementation"] == "sdpa"
        assert a["attnscope.implementation.ran"] == "eager"
        assert a["attnscope.backend.fallback"] is True
        assert a["attnscope.backend.expected"] == "sdpa"
        assert "eager attention ran" in a["attnscope.backend.reason"]
    warned = [r for r in caplog.records if "eager attention ran" in r.getMessage()]
    assert len(warned) == 1


@pytest.mark.parametrize("ops, ran", [
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu"],
     "sdpa"),
    (["aten::scaled_dot_product_attention", "aten::_scaled_dot_product_attention_math",
      "aten::softmax", "aten::bmm"], "sdpa"),  # sdpa's own math backend is still sdpa
    (["aten::matmul", "aten::softmax", "aten::matmul"], "eager"),
    (["flash_attn::_flash_attn_forward"], "flash_attn"),
    (["FlexAttentionAutogradOp"], "flex"),
    (["aten::linear", "aten::add"], None),
])
def test_ran_implementation_reads_the_ops(ops: list[str], ran: str | None) -> None:
    assert ran_implementation(ops) == ran
