"""Span names: refused when they are not a non-empty str, capped at 128 characters when built."""

from __future__ import annotations

from typing import Any

import pytest

import attnscope
from attnscope._spans.emit import MAX_NAME, span_name
from attnscope.testing import capture_spans


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
    # with the implementation transformers chose (sdpa by default)
    assert layer == [f"{path} (prefill, sdpa)"] + [f"{path} (decode, sdpa)"] * 2
    forwards = [n for n in names if n.startswith("LlamaForCausalLM (")]
    assert forwards == (["LlamaForCausalLM (prefill, sdpa)"]
                        + ["LlamaForCausalLM (decode, sdpa)"] * 2)
    assert "LlamaForCausalLM.generate" in names and "mine" in names


# ---- names that tell implementations apart, in both trace files (issue 24 §2) -------------------

def _tiny_llama(impl: str) -> Any:
    transformers = pytest.importorskip("transformers")
    import torch

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                   max_position_embeddings=32, attn_implementation=impl)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("fmt", ["jaeger-json", "otlp-json"])
def test_layer_and_forward_names_say_phase_and_implementation_in_the_file(
        fmt: str, tmp_path: Any) -> None:
    import torch

    from tests.support.helpers import traced_to_file

    models = {impl: _tiny_llama(impl) for impl in ("eager", "sdpa")}
    for model in models.values():
        attnscope.instrument(model, trace_model=True)
    ids = torch.randint(1, 64, (1, 5))

    def run() -> None:
        with torch.no_grad():
            for model in models.values():
                model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                               min_new_tokens=2, do_sample=False, pad_token_id=0)

    rows = traced_to_file(tmp_path / "t", fmt, run)
    for model in models.values():
        attnscope.uninstrument(model)
    names = [r.name for r in rows]
    for impl in models:
        layer = [r for r in rows if r.attributes.get("attnscope.implementation") == impl
                 and r.attributes.get("attnscope.module") == "model.layers.0.self_attn"]
        path = "model.layers.0.self_attn"
        assert [r.name for r in layer] == [f"{path} (prefill, {impl})", f"{path} (decode, {impl})"]
        forwards = [r.name for r in rows if r.attributes.get("attnscope.implementation") == impl
                    and r.attributes.get("attnscope.module_class") == "LlamaForCausalLM"
                    and r.attributes.get("attnscope.phase")]
        assert forwards == [f"LlamaForCausalLM (prefill, {impl})",
                            f"LlamaForCausalLM (decode, {impl})"]
    # generate() keeps its name (it has neither phase nor heads): one per model
    assert names.count("LlamaForCausalLM.generate") == 2
    # low-cardinality: the layer has four names in all (2 phases x 2 implementations)
    assert len({n for n in names if n.startswith("model.layers.0.self_attn")}) == 4


def test_a_profiled_layer_without_a_config_is_named_with_its_backend(tmp_path: Any) -> None:
    import torch
    import torch.nn.functional as F

    from tests.support.helpers import traced_to_file

    class Attention(torch.nn.Module):
        """The head counts instrument() reads, no config: no implementation to name."""

        def __init__(self) -> None:
            super().__init__()
            self.num_heads, self.head_dim, self.is_causal = 2, 8, True
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
            b, s, _ = hidden_states.shape
            q, k, v = self.qkv(hidden_states).view(b, s, 3, 2, 8).permute(2, 0, 3, 1, 4)
            out: torch.Tensor = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return out

    class Model(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.attn = Attention()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.attn(x)
            return out

    model = attnscope.instrument(Model())
    x = torch.randn(1, 6, 16)

    def run() -> None:
        with torch.no_grad():
            model(x)  # timed: no backend known
            with attnscope.sampling(force=True, profile=True):
                model(x)

    rows = [r for r in traced_to_file(tmp_path / "t.json", "jaeger-json", run,
                                      profile_max_per_minute=100)
            if r.attributes.get("attnscope.module") == "attn"]
    attnscope.uninstrument(model)
    timed, profiled = sorted(rows, key=lambda r: r.start_ns)
    assert timed.name == "attn" and timed.attributes["attnscope.tier"] == "timing"
    assert profiled.attributes["attnscope.tier"] == "profile"
    backend = profiled.attributes["attnscope.backend"]
    assert backend in ("flash", "efficient", "math", "cudnn")
    assert profiled.name == f"attn ({backend})"
