"""The worker reads no device tensor under sync debugging (issue 15 item 3; skipped without CUDA)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope.testing import capture_spans


@pytest.fixture
def sync_error() -> Iterator[None]:
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()


@attnscope.trace
def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           attn_mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def test_a_cuda_mask_under_sync_debug_error_is_not_read(sync_error: None) -> None:
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16)
    mask = torch.ones(2, 1, 128, 128, device="cuda", dtype=torch.bool)
    with capture_spans() as spans:
        for _ in range(5):
            masked(q, q, q, attn_mask=mask)
        assert attnscope.flush(30)  # the worker derives while "error" is still set
    assert len(spans) == 5
    stats = attnscope.stats()
    assert stats["worker_errors"] == 0 and stats["internal_errors"] == 0
    assert all("attnscope.tokens" not in s.attributes for s in spans)
    assert all(s.attributes["attnscope.device_ns"] > 0 for s in spans)
