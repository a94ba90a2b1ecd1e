"""Fallback verdicts on a real GPU: torch's eligibility checks on meta tensors vs the kernel run."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from attnscope._derive.fallback import Inputs, assess
from attnscope._profiles.kernels import detect_backend


def _ran(q: torch.Tensor, **kw: object) -> str:
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        F.scaled_dot_product_attention(q, q, q, **kw)  # type: ignore[arg-type]
        torch.cuda.synchronize()
    return detect_backend(e.name for e in prof.events())


def test_fp16_call_runs_a_fused_kernel_and_is_not_a_fallback() -> None:
    q = torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.float16)
    ran = _ran(q)
    verdict = assess(ran, Inputs("cuda", (q.shape,) * 3, q.dtype))
    assert ran in ("flash", "cudnn", "efficient")
    assert verdict is not None and not verdict.fallback and verdict.expected == ran


def test_float64_runs_math_with_no_fused_kernel_eligible() -> None:
    q = torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.float64)
    ran = _ran(q)
    verdict = assess(ran, Inputs("cuda", (q.shape,) * 3, q.dtype))
    assert ran == "math"
    assert verdict is not None and verdict.fallback and verdict.expected == ""
    assert verdict.reason  # torch's own words
