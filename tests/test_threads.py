"""Many threads through one traced function: one span per sampled call, no more, no less."""

from __future__ import annotations

import threading

import torch

import attnscope
from attnscope.testing import capture_spans

CALLS = 200


@attnscope.trace
def attn(q: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ q.transpose(-1, -2), dim=-1) @ q


def _hammer(n_threads: int) -> None:
    q = torch.randn(1, 1, 4, 4)
    barrier = threading.Barrier(n_threads)

    def run() -> None:
        barrier.wait()
        for _ in range(CALLS):
            attn(q)

    threads = [threading.Thread(target=run) for _ in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def test_eight_threads_every_call_sampled() -> None:
    with capture_spans() as spans:
        _hammer(8)
    assert len(spans) == 8 * CALLS
    assert len({s.context.span_id for s in spans}) == 8 * CALLS
    assert all(s.parent is None for s in spans)


def test_eight_threads_partial_sampling_counts_match() -> None:
    with capture_spans(sample_rate=0.3) as spans:
        _hammer(8)
        attnscope.flush(timeout_s=10)
        stats = attnscope.stats()
    assert 0 < len(spans) < 8 * CALLS
    assert (stats["emitted"] + stats["dropped_queue_full"] + stats["dropped_trace_cap"]
            == stats["captured"])
    assert len(spans) == stats["emitted"]
