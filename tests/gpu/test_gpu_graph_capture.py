"""The worker never breaks the application's CUDA graph capture (issue 15 item 1; needs CUDA).

A sampled call leaves its timer pending (the GPU is still sleeping inside it) while another
stream captures a graph in the default global mode: the worker polls the timer's event every
2 ms during the capture. In global mode that query would invalidate the capture.
"""

from __future__ import annotations

import time

import torch

import attnscope
from attnscope.testing import capture_spans


@attnscope.trace
def slow(x: torch.Tensor) -> torch.Tensor:
    torch.cuda._sleep(2_000_000_000)  # about a second of GPU time: the timer stays pending
    return x * 2


def test_a_pending_timer_does_not_break_a_global_mode_capture() -> None:
    x = torch.ones(1024, device="cuda")
    static = torch.ones(1024, device="cuda")
    side = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph()
    with capture_spans() as spans:
        with torch.cuda.stream(side):
            (static * 2).sum()  # warm-up on the capture stream
        side.synchronize()
        slow(x)  # on the default stream, still running
        with torch.cuda.stream(side):
            graph.capture_begin()  # capture_error_mode="global"
            out = static * 3
            time.sleep(0.3)  # the worker polls the pending timer meanwhile
            graph.capture_end()
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, static * 3)
    assert len(spans) == 1 and spans[0].attributes["attnscope.device_ns"] > 0
