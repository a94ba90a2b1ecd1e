"""Tracing at 100% does not raise the allocator peak by keeping masks alive (issue 10 item 6;
skipped without CUDA). A 4-D mask over the keeping budget is not referenced by the capture, so
it is freed when the caller drops it, as without attnscope."""

from __future__ import annotations

import gc

import torch
import torch.nn.functional as F

import attnscope
from attnscope.testing import capture_spans


@attnscope.trace
def masked(q: torch.Tensor, attn_mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, q, q, attn_mask=attn_mask)


def _peak_over(run_traced: bool) -> int:
    q = torch.randn(2, 4, 2048, 64, device="cuda", dtype=torch.float16)
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    for _ in range(8):
        mask = torch.ones(2, 1, 2048, 2048, device="cuda", dtype=torch.bool)  # 8 MiB each
        mask = mask.expand(2, 4, 2048, 2048).contiguous()  # 32 MiB: over the 16 MiB budget
        out = masked(q, mask) if run_traced else F.scaled_dot_product_attention(q, q, q,
                                                                                attn_mask=mask)
        del mask, out
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def test_allocator_peak_is_unchanged_with_tracing_at_100_percent() -> None:
    untraced = _peak_over(False)
    with capture_spans():
        traced = _peak_over(True)
        assert attnscope.flush(30)
    # captures wait in the queue while the calls go on: had they kept the masks, 8 of 32 MiB
    assert traced <= untraced + (4 << 20), (traced, untraced)
