"""Exact FLOPs and the backend named, per kind of call and per SDPA backend, on each device.

Issue 36 §5: causal, grouped-query and sliding-window calls, each forced onto one backend with
``sdpa_kernel`` and profiled. The span's ``attnscope.flops`` must equal a count made here from the
explicit (query, key) pairs the call attends — the bottom-right causal triangle, or the band of the
mask the call is given — and ``attnscope.backend`` must name the forced backend. On CPU (every run
of the suite) the backends are math and CPU flash; on CUDA (``scripts/gpu_check.sh``) math,
efficient, flash and cuDNN, and the window's mask is counted on the device. A backend that cannot
run a kind of call on this machine is skipped, and the acceptance run records it as unsupported.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnscope
from attnscope.testing import capture_spans

from .support.figures import record
from .support.helpers import attrs, traced_spans

CUDA = torch.cuda.is_available()
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not CUDA, reason="needs CUDA"))]
BACKENDS = {
    "math": SDPBackend.MATH,
    "flash": SDPBackend.FLASH_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
}
ON_CPU = ("math", "flash")  # torch's CPU backends; efficient and cuDNN are CUDA's
KINDS = ("causal", "gqa", "gqa-causal", "window")
B, H, KV_HEADS, S, D, WINDOW = 2, 8, 2, 256, 64, 32
PROFILE = {"profile_rate": 1.0, "profile_max_per_minute": 1000.0}


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal,
                                          enable_gqa=k.shape[1] != q.shape[1])


def allowed(sq: int, skv: int, causal: bool, window: int | None) -> torch.Tensor:
    """The (query, key) pairs a call attends, written out: key ``j`` is seen by query ``i`` when
    ``j <= i + skv - sq`` (causal, bottom-right) and ``j > i + skv - sq - window`` (a window)."""
    d = torch.arange(skv).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - (skv - sq)
    keep = torch.ones(sq, skv, dtype=torch.bool)
    if causal or window is not None:
        keep &= d <= 0
    if window is not None:
        keep &= d > -window
    return keep


def expected_flops(kind: str) -> int:
    """QKᵀ and PV at 2 FLOPs a multiply-add over the pairs attended, every query head counted."""
    keep = allowed(S, S, kind != "gqa", WINDOW if kind == "window" else None)
    return 2 * B * H * int(keep.sum()) * (D + D)


def inputs(kind: str, device: str) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(0)

    def t(heads: int) -> torch.Tensor:
        return torch.randn(B, heads, S, D, generator=gen).to(device=device, dtype=dtype)

    q = t(H)
    if kind.startswith("gqa"):
        k, v = t(KV_HEADS), t(KV_HEADS)
    else:
        k, v = q, q
    if kind == "window":  # a 4-D boolean band: True = attend
        mask = allowed(S, S, True, WINDOW).to(device)[None, None]
        return (q, k, v), {"attn_mask": mask}
    return (q, k, v), {"is_causal": kind != "gqa"}


@contextlib.contextmanager
def _only(backend: str) -> Iterator[None]:
    """Only ``backend``; torch's UserWarnings on why another backend was not used (raised as
    errors by the suite's warning filter: they are attributed to this module) are not the
    test's business."""
    with sdpa_kernel(BACKENDS[backend]), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        yield


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("device", DEVICES)
def test_flops_exact_and_backend_named(device: str, kind: str, backend: str) -> None:
    if device == "cpu" and backend not in ON_CPU:
        pytest.skip(f"{backend} is a CUDA backend")
    args, kwargs = inputs(kind, device)
    try:  # untraced, to learn whether this backend runs this call here
        with _only(backend):
            attention.__wrapped__(*args, **kwargs)  # type: ignore[attr-defined]
    except RuntimeError as exc:
        record("flops", device=device, kind=kind, backend=backend, supported=False,
               reason=str(exc).splitlines()[0][:200])
        pytest.skip(f"{backend} cannot run a {kind} call here: {str(exc).splitlines()[0]}")
    if device == "cuda":
        torch.cuda.synchronize()
    with capture_spans(**PROFILE) as spans, _only(backend):
        attention(*args, **kwargs)
    (span,) = traced_spans(spans)
    a = attrs(span)
    want = expected_flops(kind)
    record("flops", device=device, kind=kind, backend=backend, supported=True,
           flops=a.get("attnscope.flops"), expected=want, backend_named=a.get("attnscope.backend"),
           tier=a.get("attnscope.tier"), exact=a.get("attnscope.exact", True))
    assert a["attnscope.tier"] == "profile"
    assert a.get("attnscope.exact", True) is True
    assert a["attnscope.flops"] == want
    assert a["attnscope.num_heads"] == H
    assert a["attnscope.num_kv_heads"] == (KV_HEADS if kind.startswith("gqa") else H)
    if kind == "window":
        assert a["attnscope.sliding_window"] == WINDOW
    assert a["attnscope.backend"] == backend


def test_the_reference_counts_pairs_by_hand() -> None:
    """The count the test compares with, on a 4 × 6 call checked pair by pair."""
    # causal, bottom-right: query 0 sees keys 0-2, query 3 sees all six
    assert allowed(4, 6, True, None).sum(dim=1).tolist() == [3, 4, 5, 6]
    # a causal window of 2: each query sees its own key and the one before
    assert allowed(4, 6, True, 2).sum(dim=1).tolist() == [2, 2, 2, 2]
    assert allowed(4, 6, False, None).sum().item() == 24
