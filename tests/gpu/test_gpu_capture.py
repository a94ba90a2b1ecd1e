"""Kernel-level capture and device timing on a real GPU (skipped without CUDA).

Run with scripts/gpu_check.sh, which also runs the GPU benchmarks and keeps the output.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnscope
from attnscope._capture import profiler_session as _profile
from attnscope._runtime import runtime
from attnscope.testing import capture_spans

from ..support.helpers import attrs, naive, sdpa
from ..support.helpers import descendants_of as _descendants
from ..support.helpers import traced_spans as _parents

SHAPE = (8, 16, 1024, 64)
PROFILE = {"profile_rate": 1.0, "profile_max_per_minute": 1000.0}


@pytest.fixture(scope="module")
def q() -> torch.Tensor:
    return torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16)


@pytest.fixture(autouse=True)
def _drain() -> Iterator[None]:
    torch.cuda.synchronize()
    yield
    torch.cuda.synchronize()


@contextlib.contextmanager
def _no_host_sync() -> Iterator[None]:
    """Sync debug mode "error", and explicit synchronize() calls raise, while traced calls run."""
    real = (torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.Stream.synchronize)

    def forbidden(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("attnscope synchronised the device in the timing tier")

    torch.cuda.synchronize = forbidden  # type: ignore[assignment]
    torch.cuda.Event.synchronize = forbidden  # type: ignore[method-assign]
    torch.cuda.Stream.synchronize = forbidden  # type: ignore[method-assign]
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize, torch.cuda.Event.synchronize, torch.cuda.Stream.synchronize = real  # type: ignore[method-assign]


# ---- timing tier ------------------------------------------------------------------------------

def test_timing_tier_device_time_without_host_sync(q: torch.Tensor) -> None:
    sdpa(q, q, q)  # CUDA initialised, kernels loaded
    torch.cuda.synchronize()
    with capture_spans() as spans:
        with _no_host_sync():
            for _ in range(20):
                sdpa(q, q, q)
            assert attnscope.flush(timeout_s=30.0)  # the worker polls event.query(): no sync either
    assert len(spans) == 20
    for span in spans:
        a = attrs(span)
        assert a["attnscope.tier"] == "timing"
        assert a["attnscope.device_ns"] > 0
        assert 0 < a["attnscope.tflops"] < 5000
        assert a["attnscope.tokens_per_s"] > 0
        assert a["attnscope.memory.delta_bytes"] >= 0
    assert len(runtime.device.event_pool or ()) >= 1  # pairs came back to the pool


def test_users_peak_statistics_untouched(q: torch.Tensor) -> None:
    big = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    del big
    peak = torch.cuda.max_memory_allocated()
    with capture_spans() as spans:
        sdpa(q, q, q)
    assert torch.cuda.max_memory_allocated() == peak
    assert len(spans) == 1


def test_cuda_graph_capture_passes_through(q: torch.Tensor) -> None:
    static_q = q.clone()
    sdpa(static_q, static_q, static_q)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with capture_spans(**PROFILE) as spans:
        with torch.cuda.graph(graph):
            out = sdpa(static_q, static_q, static_q)
        graph.replay()
        torch.cuda.synchronize()
    # nothing sampled while the graph was being recorded: the replay's span and its call (issue 40)
    assert sorted(s.name for s in _parents(spans)) == ["cuda_graph.replay", "sdpa"]
    assert [attrs(s)["attnscope.replayed"] for s in _parents(spans) if s.name == "sdpa"] == [True]
    torch.testing.assert_close(out, F.scaled_dot_product_attention(static_q, static_q, static_q))


# ---- profile tier -------------------------------------------------------------------------------

BACKENDS = [
    ("naive", None, "math"),
    ("sdpa", SDPBackend.MATH, "math"),
    ("sdpa", SDPBackend.EFFICIENT_ATTENTION, "efficient"),
    ("sdpa", SDPBackend.FLASH_ATTENTION, "flash"),
    ("sdpa", SDPBackend.CUDNN_ATTENTION, "cudnn"),
]


@pytest.mark.parametrize(("fn_name", "backend", "expected"), BACKENDS,
                         ids=[b[2] if b[0] == "sdpa" else "naive" for b in BACKENDS])
def test_profile_tier_kernels_and_backend(q: torch.Tensor, fn_name: str, backend: Any,
                                          expected: str) -> None:
    fn = naive if fn_name == "naive" else sdpa

    def ctx() -> Any:  # sdpa_kernel() is single-use
        return sdpa_kernel(backend) if backend is not None else contextlib.nullcontext()

    try:
        with ctx():
            fn.__wrapped__(q, q, q)  # type: ignore[attr-defined]  # available, and warm
    except RuntimeError as exc:
        pytest.skip(f"backend not available here: {exc}")
    torch.cuda.synchronize()
    assert _profile.warm_up(cuda=True)
    with capture_spans(**PROFILE) as spans, ctx():
        fn(q, q, q)
    (parent,) = _parents(spans)
    a = attrs(parent)
    assert a["attnscope.tier"] == "profile"
    assert a["attnscope.backend"] == expected
    assert a["attnscope.kernel.count"] >= 1
    assert a["attnscope.launch_overhead_ns"] >= 0
    assert a["attnscope.memory.peak_bytes"] > 0
    kids = _descendants(spans, parent)  # kernels hang under the op that launched them
    kernels = [k for k in kids if attrs(k)["attnscope.kernel.kind"] == "cuda_kernel"]
    assert kernels
    for k in kernels:
        assert attrs(k)["attnscope.kernel.device"].startswith("cuda")
        # a kernel cannot run before its launch: it starts inside the call's time or after
        assert k.start_time >= parent.start_time - 50_000
    print(f"\n{expected}: {a['attnscope.kernel.count']} kernels, "
          f"top {list(a['attnscope.kernel.top_names'])[:3]}")


def test_user_cuda_profiler_active_skips(q: torch.Tensor) -> None:
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with capture_spans(**PROFILE) as spans:
        with torch.profiler.profile(activities=acts) as user:
            sdpa(q, q, q)
    assert [attrs(p)["attnscope.tier"] for p in _parents(spans)] == ["timing"]
    assert any(e.device_type == torch.autograd.DeviceType.CUDA for e in user.events())


def test_profile_tier_under_sync_debug_mode_times_instead(q: torch.Tensor) -> None:
    assert _profile.warm_up(cuda=True)
    before = _profile.stats()["skipped_sync_debug"]
    with capture_spans(**PROFILE) as spans:
        torch.cuda.set_sync_debug_mode("error")
        try:
            sdpa(q, q, q)  # profile tier requested; stopping CUPTI would need a sync: timed instead
        finally:
            torch.cuda.set_sync_debug_mode("default")
    assert [attrs(p)["attnscope.tier"] for p in _parents(spans)] == ["timing"]
    assert _profile.stats()["skipped_sync_debug"] == before + 1
