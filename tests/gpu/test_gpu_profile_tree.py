"""Profile tier on CUDA (issue 11 items 1, 3, 5): kernels under their launching op, host syncs,
memcpy and device idle time. Not run yet: no GPU was lent to the session that wrote it."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._capture import profiler_session as _profile
from attnscope.testing import capture_spans

from ..support.helpers import attrs, descendants_of, traced_spans

PROFILE = {"profile_rate": 1.0, "profile_max_per_minute": 1000.0}


@pytest.fixture
def q() -> torch.Tensor:
    torch.cuda.init()
    return torch.randn(4, 8, 512, 64, device="cuda", dtype=torch.float16)


@attnscope.trace
def syncing(q: torch.Tensor) -> torch.Tensor:
    scale = q.abs().max().item()  # device -> host copy, then a stream sync
    keep = torch.nonzero(q[0, 0, 0] > 0)  # output size known only on the host
    return F.scaled_dot_product_attention(q, q, q) * scale + keep.numel()


def test_gpu_host_syncs_memcpy_and_idle(q: torch.Tensor) -> None:
    syncing.__wrapped__(q)  # type: ignore[attr-defined]  # kernels loaded
    torch.cuda.synchronize()
    assert _profile.warm_up(cuda=True)
    with capture_spans(**PROFILE) as spans:
        syncing(q)
    (parent,) = traced_spans(spans)
    a = attrs(parent)
    assert a["attnscope.tier"] == "profile"
    assert a["attnscope.host_syncs"] >= 2  # attnscope's own sync after the call is not counted
    assert {"aten::item", "aten::nonzero"} <= set(a["attnscope.host_sync_ops"])
    assert a["attnscope.memcpy_ns"] > 0  # the scalar's device -> host copy
    assert a["attnscope.device_idle_ns"] >= 0
    assert a["attnscope.core_ns"] > 0
    below = descendants_of(spans, parent)
    kernels = [k for k in below if attrs(k)["attnscope.kernel.kind"] == "cuda_kernel"]
    assert kernels
    # a kernel hangs under the op span that launched it (or the call's span when none is kept)
    ops = {s.context.span_id: s for s in below if attrs(s)["attnscope.kernel.kind"] == "cpu_op"}
    under_ops = [k for k in kernels if k.parent is not None and k.parent.span_id in ops]
    assert under_ops, "no kernel found its launching op"


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def test_gpu_a_call_timed_inside_a_profiled_one_has_the_kernels_it_launched(
        q: torch.Tensor) -> None:
    attention.__wrapped__(q, q, q)  # type: ignore[attr-defined]  # kernels loaded
    torch.cuda.synchronize()
    assert _profile.warm_up(cuda=True)
    with capture_spans(**PROFILE) as spans:
        with attnscope.sampling(force=True, profile=True), attnscope.span("block"):
            attention(q, q, q)
            q.mul(2).sum()  # the block's own kernels: not the attention call's
    by_name = {s.name.split(" (")[0]: s for s in traced_spans(spans)}
    block, call = attrs(by_name["block"]), attrs(by_name["attention"])
    assert block["attnscope.tier"] == "profile"
    assert call["attnscope.profiled_by"] == "enclosing"
    names, times = call["attnscope.kernel.top_names"], call["attnscope.kernel.top_ns"]
    # the device activities its ops launched: the attention kernel, not the block's reduction
    assert names and all(t > 0 for t in times)
    assert any("fmha" in n or "flash" in n or "attention" in n.lower() for n in names), names
    assert not any("reduce" in n.lower() for n in names), names
    assert 0 < call["attnscope.kernel.total_ns"] < block["attnscope.kernel.total_ns"]
    pairs = list(zip(names, times, strict=True))
    print(f"\nnested kernels on {torch.cuda.get_device_name()}: {pairs}")
