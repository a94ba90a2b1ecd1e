"""Device values are counted on the call's stream, never read on the worker (issue 15 items 2
and 3; skipped without CUDA): under sync debugging "error" nothing raises and the counts are
there, and the reductions do not raise the allocator peak of the calls."""

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


def _run(fn: object, q: torch.Tensor, mask: torch.Tensor) -> int:
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    for _ in range(5):
        fn(q, q, q, attn_mask=mask)  # type: ignore[operator]
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated()


def test_a_cuda_mask_under_sync_debug_error_is_counted_on_the_stream(sync_error: None) -> None:
    q = torch.randn(2, 4, 128, 64, device="cuda", dtype=torch.float16)
    mask = torch.ones(2, 1, 128, 128, device="cuda", dtype=torch.bool)
    mask[0, :, :, :28] = False  # row 0: 28 padded keys
    untraced = _run(F.scaled_dot_product_attention, q, mask)
    with capture_spans() as spans:
        traced = _run(masked, q, mask)
        assert attnscope.flush(30)  # the worker derives while "error" is still set
    assert len(spans) == 5
    stats = attnscope.stats()
    assert stats["worker_errors"] == 0 and stats["internal_errors"] == 0
    assert [s.attributes["attnscope.tokens"] for s in spans] == [100 + 128] * 5
    assert all(s.attributes["attnscope.device_ns"] > 0 for s in spans)
    assert traced <= untraced, (traced, untraced)


def test_the_reductions_give_the_same_counts_on_the_device() -> None:
    """record.reduce on CUDA (no host read allowed: "error" is set) against the same on CPU.

    The inputs reach the device before "error" is set: a copy from pageable host memory is a
    synchronising call of the test's own (issue 36 §3), not of the reductions."""
    from attnscope._record import reduce

    torch.manual_seed(0)
    sq, skv, buffer = 6, 10, 16
    d = torch.arange(buffer).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - (skv - sq)
    masks = [(d <= 0) & (d > -3), d <= 0, torch.rand(sq, buffer) > 0.3]
    cases = []
    for base in masks:
        for polarity in (base, ~base):
            mask = polarity.expand(2, 1, sq, buffer).contiguous()
            plan = reduce.plan_mask(tuple(mask.shape), 2, 4, sq, None)
            want = reduce.mask_numbers(mask, False, plan, sq, torch.tensor(skv)).tolist()
            cases.append((mask.cuda(), plan, want))
    keys = torch.tensor(skv, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for mask, plan, want in cases:
            got = reduce.mask_numbers(mask, False, plan, sq, keys)
            host = reduce.enqueue_to_host(got)
            landed = torch.cuda.Event()
            landed.record()
            while not landed.query():  # polled as the worker does: no synchronising call
                pass
            assert host.is_pinned() and host.tolist() == want
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
