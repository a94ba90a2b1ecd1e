"""The kernels of calls timed inside a profiled call, from its events (``_profiles/windows.py``):
made-up events, every figure counted here by hand."""

from __future__ import annotations

from attnscope._profiles.kernels import RawEvent
from attnscope._profiles.windows import nested_kernels

# The span's clock is 10 s ahead of the profiler's (the marker starts at 0): more than the 1 s
# within which analyze takes them for one clock, so the marker's start is the span's start.
OFFSET = 10_000_000_000


def _events() -> list[RawEvent]:
    """A profiled call from 0 to 10,000 (profiler clock), a nested call inside it from 2,000 to
    6,000: in it an SDPA op (2,100-5,000) with a flash op in it (2,200-4,800), and a linear op
    (5,100-5,900); outside it an mm op before (500-1,500) and after (7,000-8,000). Each op
    launches one kernel (op_id), the flash op's the longest."""
    ops = [("aten::mm", 500, 1_500, 1), ("aten::scaled_dot_product_attention", 2_100, 5_000, 2),
           ("aten::_flash_attention", 2_200, 4_800, 3), ("aten::linear", 5_100, 5_900, 4),
           ("aten::mm", 7_000, 8_000, 5)]
    out = [RawEvent("attnscope", "marker", "cpu", 0, 10_000)]
    out += [RawEvent(name, "cpu_op", "cpu", start, end, op_id=op_id)
            for name, start, end, op_id in ops]
    kernels = {1: ("gemm", 300), 3: ("flash_fwd", 2_000), 4: ("gemm", 400), 5: ("gemm", 500)}
    out += [RawEvent(name, "cuda_kernel", "cuda:0", 20_000 + 10 * op_id, 20_000 + 10 * op_id + ns,
                     op_id=op_id) for op_id, (name, ns) in kernels.items()]
    return out


WINDOW = (OFFSET + 2_000, OFFSET + 6_000)  # on the span's clock


def test_on_cpu_the_ops_that_start_in_the_call_by_their_own_time() -> None:
    (got,) = nested_kernels(_events(), [WINDOW], span_start_ns=OFFSET,
                            span_end_ns=OFFSET + 10_000, on_device=False)
    # SDPA's own time: 2,900 - 2,600 of the flash op in it; flash 2,600; linear 800
    assert got["kernel.count"] == 3 and got["kernel.total_ns"] == 300 + 2_600 + 800
    assert got["kernel.top_names"] == ["aten::_flash_attention", "aten::linear",
                                       "aten::scaled_dot_product_attention"]
    assert got["kernel.top_ns"] == [2_600, 800, 300]
    assert got["kernel.top"][0] == "aten::_flash_attention: 2.6 µs"


def test_on_a_gpu_the_kernels_its_ops_launched() -> None:
    (got,) = nested_kernels(_events(), [WINDOW], span_start_ns=OFFSET,
                            span_end_ns=OFFSET + 10_000, on_device=True)
    assert got["kernel.count"] == 2 and got["kernel.total_ns"] == 2_000 + 400
    assert got["kernel.top_names"] == ["flash_fwd", "gemm"]  # not the mm kernels outside it


def test_a_window_nothing_ran_in_and_no_windows() -> None:
    empty = (OFFSET + 9_000, OFFSET + 9_500)
    assert nested_kernels(_events(), [empty, WINDOW], span_start_ns=OFFSET,
                          span_end_ns=OFFSET + 10_000, on_device=False)[0] == {}
    assert nested_kernels(_events(), [], span_start_ns=OFFSET, span_end_ns=OFFSET + 10_000,
                          on_device=True) == []


def test_a_real_call_timed_inside_a_profiled_block_has_its_own_ops_not_the_blocks() -> None:
    import torch
    import torch.nn.functional as F

    import attnscope
    from attnscope._capture import profiler_session
    from attnscope.testing import capture_spans

    from .support.helpers import attrs, traced_spans

    @attnscope.trace
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    q = torch.randn(2, 4, 128, 32)
    assert profiler_session.warm_up()
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
        with attnscope.sampling(force=True, profile=True), attnscope.span("block"):
            attention(q, q, q)
            q.mul(2).sum()  # the block's own ops, after the call
    (block_span,) = [s for s in traced_spans(spans) if s.name == "block"]
    (call_span,) = [s for s in traced_spans(spans) if "attention" in s.name]
    block, call = attrs(block_span), attrs(call_span)
    assert block["attnscope.tier"] == "profile" and call["attnscope.tier"] == "timing"
    assert call["attnscope.profiled_by"] == "enclosing"
    names = call["attnscope.kernel.top_names"]
    assert any("scaled_dot_product" in n for n in names), names
    assert not {"aten::mul", "aten::sum"} & set(names), names
    assert block["attnscope.kernel.count"] > call["attnscope.kernel.count"]  # mul, sum too
    assert 0 < call["attnscope.kernel.total_ns"] < block["attnscope.kernel.total_ns"]
    assert call["attnscope.kernel.count"] >= len(names)
