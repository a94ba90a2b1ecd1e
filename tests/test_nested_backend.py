"""A call timed inside a profiled one says which attention backend ran, from the ops the profile
handed down to it (``attnscope.profiled_by = "enclosing"``).

``attnscope run`` traces the model's forward and decoder layers too: a profile-tier pick lands on a
decoder layer about as often as on its attention layer, and the attention call inside it is timed.
Its backend was then unknown ("—" in the report) although the layer's profile saw its kernels.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import attnscope
from attnscope.testing import capture_spans


@attnscope.trace(name="fused")
def fused(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


@attnscope.trace(name="by_hand")
def by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1) @ v


@attnscope.trace(name="no_attention")
def no_attention(x: torch.Tensor) -> torch.Tensor:
    return torch.relu(x) + 1


def _calls(spans: list[Any]) -> dict[str, dict[str, Any]]:
    return {s.name: dict(s.attributes) for s in spans
            if "attnscope.tier" in s.attributes and "attnscope.kernel.kind" not in s.attributes}


def test_calls_timed_inside_a_profiled_block_name_the_backend_of_their_ops() -> None:
    q = torch.randn(1, 2, 32, 16)
    with capture_spans(profile_max_per_minute=1000) as spans:
        with attnscope.sampling(force=True, profile=True), attnscope.span("layer"):
            fused(q, q, q)
            by_hand(q, q, q)
            no_attention(q)
        assert attnscope.flush(timeout_s=30)
    calls = _calls(spans)
    assert calls["layer"]["attnscope.tier"] == "profile"
    for name, backend in (("fused", "flash"), ("by_hand", "math")):
        a = calls[name]
        assert a["attnscope.tier"] == "timing" and a["attnscope.profiled_by"] == "enclosing"
        # what the profiler saw of this call alone: CPU SDPA runs the flash kernel; a softmax
        # between two matrix products is the math path
        assert a["attnscope.backend"] == backend, name
    assert calls["no_attention"]["attnscope.profiled_by"] == "enclosing"
    assert "attnscope.backend" not in calls["no_attention"]  # its ops name no backend


def test_a_call_timed_on_its_own_has_no_backend() -> None:
    q = torch.randn(1, 2, 32, 16)
    with capture_spans(profile_rate=0.0) as spans:
        with attnscope.sampling(force=True):
            fused(q, q, q)
        assert attnscope.flush(timeout_s=30)
    a = _calls(spans)["fused"]
    assert a["attnscope.tier"] == "timing" and "attnscope.backend" not in a


def test_the_spans_a_call_received_are_read_as_the_profile_would_be() -> None:
    from attnscope._profiles.optree import ChildSpan
    from attnscope._spans.spans import backend_of_spans

    def span(name: str, kind: str, inner: list[str] | None = None) -> ChildSpan:
        attrs: dict[str, Any] = {"attnscope.kernel.kind": kind}
        if inner:
            attrs["attnscope.kernel.inner"] = inner
        return ChildSpan(name, 0, 1, attrs, -1)

    # a module's label is not part of the op's name; a folded op counts by its inner names
    assert backend_of_spans([span("aten::_efficient_attention_forward (self_attn)", "cpu_op")]) \
        == "efficient"
    assert backend_of_spans([span("aten::scaled_dot_product_attention", "cpu_op",
                                  ["aten::_scaled_dot_product_cudnn_attention"])]) == "cudnn"
    assert backend_of_spans([span("aten::softmax (attn)", "cpu_op"),
                             span("aten::matmul", "cpu_op")]) == "math"
    # on a GPU the kernels the call's ops launched went down with them
    assert backend_of_spans([span("aten::linear (q_proj)", "cpu_op"),
                             span("void flash_fwd_kernel<Flash_fwd_params>", "cuda_kernel")]) \
        == "flash"
    # a kernel named like a CPU op is not read as one, nor a copy as a kernel
    assert backend_of_spans([span("aten::_flash_attention_forward", "cuda_kernel"),
                             span("flash_fwd", "memcpy")]) == "unknown"
