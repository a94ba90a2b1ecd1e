"""Span names: refused when they are not a non-empty str, capped at 128 characters when built."""

from __future__ import annotations

from typing import Any

import pytest

import attnscope
from attnscope.testing import capture_spans
from attnscope.worker.emit import MAX_NAME, span_name


@pytest.mark.parametrize("bad", [123, "", b"name", None.__class__])
def test_trace_refuses_a_name_that_is_not_a_non_empty_str(bad: Any) -> None:
    with pytest.raises(TypeError, match="non-empty str name"):
        attnscope.trace(name=bad)
    with pytest.raises(TypeError, match="non-empty str name"):
        attnscope.trace(lambda: None, name=bad)  # type: ignore[call-overload]


@pytest.mark.parametrize("bad", [123, "", None, b"block"])
def test_span_refuses_a_name_that_is_not_a_non_empty_str(bad: Any) -> None:
    with pytest.raises(TypeError, match="non-empty str name"):
        attnscope.span(bad)


def test_a_very_long_name_is_capped_on_the_span() -> None:
    long = "n" * 10_000

    @attnscope.trace(name=long)
    def f(x: int) -> int:
        return x + 1

    with capture_spans(sample_rate=1.0, warmup_calls=0) as spans:
        assert f(1) == 2
        with attnscope.span("b" * 500, sample=True):
            pass
    assert sorted(s.name for s in spans) == sorted(["b" * MAX_NAME, "n" * MAX_NAME])


def test_a_name_that_got_past_validation_reaches_the_exporter_as_a_str() -> None:
    @attnscope.trace
    def f(x: int) -> int:
        return x + 1

    f.__attnscope_site__.name = 123  # type: ignore[attr-defined]  # e.g. an internal call site
    with capture_spans(sample_rate=1.0, warmup_calls=0) as spans:
        assert f(1) == 2
    assert [s.name for s in spans] == ["123"]


def test_span_name_helper() -> None:
    assert span_name("ok") == "ok"
    assert span_name(7) == "7"
    assert span_name("x" * 1000) == "x" * MAX_NAME
    assert span_name("") == "attnscope.span"


def test_a_layers_span_name_says_its_phase_and_a_blocks_name_is_its_own() -> None:
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                   max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model, trace_model=True)
    ids = torch.randint(1, 64, (1, 5))
    with capture_spans(sample_rate=1.0, warmup_calls=0, profile_rate=0.0) as spans, \
            torch.no_grad():
        model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=3,
                       min_new_tokens=3, do_sample=False, pad_token_id=0)
        with attnscope.span("mine", sample=True, attributes={"attnscope.phase": "decode"}):
            pass
    attnscope.uninstrument(model)
    names = [s.name for s in sorted(spans, key=lambda s: s.start_time)]
    layer = [n for n in names if n.startswith("model.layers.0.self_attn")]
    path = "model.layers.0.self_attn"
    assert layer == [f"{path} (prefill)"] + [f"{path} (decode)"] * 2
    forwards = [n for n in names if n.startswith("LlamaForCausalLM (")]
    assert forwards == ["LlamaForCausalLM (prefill)"] + ["LlamaForCausalLM (decode)"] * 2
    assert "LlamaForCausalLM.generate" in names and "mine" in names
