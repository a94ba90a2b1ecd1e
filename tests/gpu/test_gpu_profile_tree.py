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
