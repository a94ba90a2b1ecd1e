"""Silent fallbacks inside instrumented layers: a transformers ``sdpa`` layer's own SDPA call,
recorded on its profiled calls only, judged like ``instrument_sdpa()``'s (issue 25 §3)."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnscope
from attnscope._capture import inner_sdpa
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")
from tests.support import arch_sweep as sweep  # noqa: E402

PROFILED = {"profile_rate": 1.0, "profile_max_per_minute": 1e6}


def _layers(spans: Any) -> list[dict[str, Any]]:
    return [dict(s.attributes or {}) for s in spans
            if "attnscope.num_heads" in (s.attributes or {})]


@pytest.fixture
def llama() -> Any:
    model = attnscope.instrument(sweep.build("llama", "LlamaForCausalLM", impl="sdpa"))
    yield model
    attnscope.uninstrument(model)


def test_a_sdpa_layer_kept_from_flash_is_named_a_fallback_once_per_layer(
        llama: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Forced to the math kernel on inputs CPU flash takes: each layer's span says so, with
    the reason, and each layer is warned about once, by its module path."""
    inputs = sweep.inputs_for("causal", llama, padded=True)
    with caplog.at_level(logging.WARNING, logger="attnscope"), \
            capture_spans(**PROFILED) as spans, torch.no_grad():
        for _ in range(2):
            with sdpa_kernel(SDPBackend.MATH):
                llama(**inputs)
    calls = _layers(spans)
    assert len(calls) == 4 and {a["attnscope.tier"] for a in calls} == {"profile"}
    assert {a["attnscope.backend"] for a in calls} == {"math"}
    assert {a["attnscope.backend.fallback"] for a in calls} == {True}
    assert {a["attnscope.backend.expected"] for a in calls} == {"flash"}
    assert all("sdpa_kernel" in a["attnscope.backend.reason"] for a in calls)
    warned = sorted(r.getMessage() for r in caplog.records
                    if "ran the math kernel" in r.getMessage())
    assert warned == [f"model.layers.{i}.self_attn ran the math kernel: flash was eligible but "
                      "excluded by an sdpa_kernel context" for i in (0, 1)]


def test_a_sdpa_layer_that_ran_flash_is_no_fallback(llama: Any) -> None:
    with capture_spans(**PROFILED) as spans, torch.no_grad():
        llama(**sweep.inputs_for("causal", llama, padded=True))
    calls = _layers(spans)
    assert calls and {a["attnscope.backend"] for a in calls} == {"flash"}
    assert {a["attnscope.backend.fallback"] for a in calls} == {False}


def test_the_recorder_is_in_place_on_profiled_layer_calls_only(llama: Any) -> None:
    """Timing-tier calls never see it; profiled ones do, and it is gone after each, with
    ``instrument_sdpa()``'s wrapper too, and when the layer raises."""
    seen: list[bool] = []
    original = F.scaled_dot_product_attention
    hook = llama.model.layers[0].self_attn.q_proj.register_forward_pre_hook(  # inside forward
        lambda *_: seen.append(F.scaled_dot_product_attention is not original))
    inputs = sweep.inputs_for("causal", llama, padded=False)
    try:
        with capture_spans(sample_rate=1.0, profile_rate=0.0) as _, torch.no_grad():
            llama(**inputs)
        with capture_spans(**PROFILED) as _, torch.no_grad():
            llama(**inputs)
        assert seen == [False, True] and F.scaled_dot_product_attention is original
        attnscope.instrument_sdpa()
        traced = F.scaled_dot_product_attention
        with capture_spans(**PROFILED) as spans, torch.no_grad():
            llama(**inputs)
        assert F.scaled_dot_product_attention is traced
        assert [s for s in spans if s.name == "scaled_dot_product_attention"]  # still traced
    finally:
        attnscope.uninstrument_sdpa()
        hook.remove()
    assert F.scaled_dot_product_attention is original
    with capture_spans(**PROFILED) as _, pytest.raises(RuntimeError), torch.no_grad():
        llama.model.layers[0].self_attn(hidden_states=inputs["input_ids"])  # the user's error
    assert F.scaled_dot_product_attention is original


def test_only_the_profiling_threads_first_call_is_recorded() -> None:
    """Another thread's SDPA call in the window goes through unrecorded; so does a second call
    of the profiling thread; disarming puts the function back."""
    original = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 4, 8)
    call = inner_sdpa.arm((), {})
    holder = call.inner if call is not None else None
    try:
        assert holder is not None and F.scaled_dot_product_attention is not original
        other = threading.Thread(target=lambda: F.scaled_dot_product_attention(q, q, q))
        other.start()
        other.join()
        assert holder == []
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    finally:
        inner_sdpa.disarm()
    assert F.scaled_dot_product_attention is original
    named = dict(holder)
    assert named["is_causal"] is True and "dropout_p" not in named
    assert tuple(named["query"].shape) == (1, 2, 4, 8)
    assert not any(isinstance(v, torch.Tensor) for _, v in holder)  # no tensor kept
