"""Profile tier in Jaeger (issue 11 items 1, 2, 3, 5): op spans nested as they ran, tiny and
metadata-only ops folded, attention core vs projections, spans under the innermost attnscope span,
host syncs and copy time. File structure checks on CPU; the GPU parts with made-up events."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope.capture import profiler_session as _profile
from attnscope.testing import capture_spans
from attnscope.worker.profiles import kernels as _kernels
from attnscope.worker.profiles import optree
from attnscope.worker.profiles.kernels import RawEvent

from .support.helpers import attrs, base_name, children_of, descendants_of, sdpa, traced_spans

PROFILE = {"profile_rate": 1.0, "profile_max_per_minute": 1000.0}


@pytest.fixture(autouse=True)
def _warm() -> Iterator[None]:
    assert _profile.warm_up(), "the profiler must warm up on CPU"
    yield


def _ev(name: str, kind: str, start: int, end: int, device: str = "cpu", op_id: int = 0,
        shapes: str = "") -> RawEvent:
    return RawEvent(name, kind, device, start, end, 0, shapes, op_id)


def _duration(span: Any) -> int:
    return int(span.end_time - span.start_time)


def _check_tree(spans: list[Any], parent: Any) -> list[Any]:
    """Every op span lies inside its parent, and its children's time never exceeds it."""
    below = descendants_of(spans, parent)
    for span in [parent, *below]:
        kids = children_of(spans, span)
        assert sum(_duration(k) for k in kids) <= _duration(span), span.name
        for kid in kids:
            assert span.start_time <= kid.start_time <= kid.end_time <= span.end_time
        if span is not parent and "attnscope.tier" not in attrs(span):
            own = attrs(span).get("attnscope.kernel.self_ns")
            if own is not None:
                assert own == _duration(span) - sum(_duration(k) for k in kids)
    return [s for s in below if "attnscope.tier" not in attrs(s)]


# ---- a real model --------------------------------------------------------------------------------

def _llama_layer(attn: str) -> tuple[list[Any], Any]:
    transformers = pytest.importorskip("transformers")
    # the size of benchmarks/bench_profile_tree.py: the work, not Python, takes the time
    cfg = transformers.LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                   num_attention_heads=8, num_key_value_heads=4, vocab_size=100,
                                   max_position_embeddings=512)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model)
    ids = torch.randint(0, 100, (1, 256))
    try:
        with torch.inference_mode():
            model(ids)
            with capture_spans(sample_rate=1.0, warmup_calls=0, **PROFILE) as spans:
                model(ids)
    finally:
        attnscope.uninstrument(model)
    (layer,) = [s for s in traced_spans(spans) if base_name(s).endswith("self_attn")]
    assert attrs(layer)["attnscope.tier"] == "profile"
    return spans, layer


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_llama_layer_ops_nest_and_fold(attn: str) -> None:
    spans, layer = _llama_layer(attn)
    a = attrs(layer)
    ops = _check_tree(spans, layer)
    names = [s.name for s in ops]
    assert not set(names) & optree.METADATA_OPS, "metadata-only ops are folded, never spans"
    # Which ops clear the time threshold depends on this machine's load: the test holds the
    # structure (most ops folded); the issue's ≤ 20 spans target is measured by
    # benchmarks/bench_profile_tree.py, not asserted here.
    assert 3 * len(ops) <= a["attnscope.kernel.count"]
    # what was folded is counted where its time went
    folded = sum(attrs(s).get("attnscope.kernel.folded", 0) for s in [layer, *ops])
    assert folded > 0
    # nested as they ran: the projections are aten::linear spans at the top, the matmul inside
    top = [s.name for s in children_of(spans, layer)]
    assert "aten::linear" in top and "aten::matmul" not in top[:1]
    if attn == "sdpa":
        assert "aten::scaled_dot_product_attention" in top
    else:
        assert "aten::softmax" in top


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_llama_layer_core_and_projection_time(attn: str) -> None:
    _, layer = _llama_layer(attn)
    a = attrs(layer)
    core, proj = a["attnscope.core_ns"], a["attnscope.projection_ns"]
    assert core > 0 and proj > 0
    assert core + proj <= a["attnscope.wall_ns"]
    assert a["attnscope.host_syncs"] == 0 and "attnscope.host_sync_ops" not in a
    assert "attnscope.device_idle_ns" not in a  # GPU only


# ---- folding, wrappers, the cap (made-up ops) ----------------------------------------------------

def test_views_fold_and_their_work_moves_up() -> None:
    events = [
        _ev("attnscope", "marker", 0, 1000),
        _ev("aten::reshape", "cpu_op", 0, 500),  # a view that had to copy
        _ev("aten::view", "cpu_op", 1, 2),
        _ev("aten::clone", "cpu_op", 10, 490),
        _ev("aten::copy_", "cpu_op", 20, 300),
        _ev("aten::empty_like", "cpu_op", 12, 15),
        _ev("aten::add", "cpu_op", 600, 900),
        _ev("aten::add", "cpu_op", 950, 951),  # tiny
    ]
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=1000, max_spans=64,
                              on_device=False, fold_ns=100)
    got = [(c.name, c.parent, c.attributes.get("attnscope.kernel.folded")) for c in report.children]
    assert got == [("aten::clone", -1, 1), ("aten::copy_", 0, None), ("aten::add", -1, None)]
    assert report.attributes["kernel.folded"] == 3  # reshape, view, the tiny add
    clone = report.children[0]
    assert clone.attributes["attnscope.kernel.self_ns"] == 480 - 280


def test_an_op_that_only_wraps_another_is_one_span() -> None:
    events = [
        _ev("aten::linear", "cpu_op", 0, 1000),
        _ev("aten::t", "cpu_op", 1, 5),
        _ev("aten::matmul", "cpu_op", 10, 995),
        _ev("aten::mm", "cpu_op", 20, 990),
    ]
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=1000, max_spans=64,
                              on_device=False, fold_ns=100)
    (linear,) = report.children
    assert linear.name == "aten::linear"
    assert linear.attributes["attnscope.kernel.inner"] == ["aten::matmul", "aten::mm"]
    assert linear.attributes["attnscope.kernel.self_ns"] == 1000
    assert linear.attributes["attnscope.kernel.folded"] == 1  # aten::t


def test_cap_keeps_parents_of_kept_ops() -> None:
    events = [_ev(f"op{i}", "cpu_op", 100 * i, 100 * i + 90) for i in range(8)]
    events.append(_ev("inner", "cpu_op", 705, 785))  # inside op7, nearly as long
    events.append(_ev("sibling", "cpu_op", 786, 789))
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=1000, max_spans=4,
                              on_device=False, fold_ns=0)
    names = [c.name for c in report.children]
    assert len(names) == 4 and "other" in names
    for child in report.children:
        if child.parent >= 0:
            assert report.children[child.parent].start_ns <= child.start_ns
    other = report.children[names.index("other")]
    # what was left out at the top level lasts its own time; the parent's children fit
    assert sum(c.end_ns - c.start_ns for c in report.children if c.parent < 0) <= 1000
    assert other.attributes["attnscope.kernel.count"] == len(events) - 3


# ---- GPU (made-up events): kernels under the op that launched them -------------------------------

def _gpu_call() -> list[RawEvent]:
    return [
        _ev("attnscope", "marker", 0, 1000),
        _ev("aten::linear", "cpu_op", 10, 60, op_id=1),
        _ev("aten::view", "cpu_op", 61, 62, op_id=2),
        _ev("aten::scaled_dot_product_attention", "cpu_op", 100, 150, op_id=3),
        _ev("aten::_scaled_dot_product_flash_attention", "cpu_op", 105, 145, op_id=4),
        _ev("aten::item", "cpu_op", 200, 400, op_id=5),
        _ev("aten::_local_scalar_dense", "cpu_op", 210, 390, op_id=6),
        _ev("cudaStreamSynchronize", "runtime", 300, 380),  # inside aten::item: that sync
        _ev("cudaDeviceSynchronize", "runtime", 500, 520),  # a sync of its own
        _ev("cudaStreamSynchronize", "runtime", 1010, 1050),  # attnscope's, after the call
        _ev("nvjet_tst_gemm", "cuda_kernel", 70, 170, "cuda:0", op_id=1),
        _ev("flash_fwd_kernel", "cuda_kernel", 180, 280, "cuda:0", op_id=4),
        _ev("Memcpy DtoH", "memcpy", 290, 300, "cuda:0", op_id=6),
    ]


def test_gpu_kernels_hang_under_their_launching_op() -> None:
    report = _kernels.analyze(_gpu_call(), span_start_ns=0, span_end_ns=1000, max_spans=64,
                              on_device=True, fold_ns=20)
    by_name = {c.name: c for c in report.children}
    gemm, flash = by_name["nvjet_tst_gemm"], by_name["flash_fwd_kernel"]
    assert report.children[gemm.parent].name == "aten::linear"
    # the flash op was merged into the SDPA span it is the only child of
    parent = report.children[flash.parent]
    assert parent.name == "aten::scaled_dot_product_attention"
    assert (flash.start_ns, flash.end_ns) == (180, 280)  # on the device's timeline
    a = report.attributes
    assert a["core_ns"] == 100 and a["projection_ns"] == 100
    assert a["host_syncs"] == 2
    assert a["host_sync_ops"] == ["aten::item", "cudaDeviceSynchronize"]
    assert a["memcpy_ns"] == 10
    # device busy [70, 170) [180, 280) [290, 300): gaps 10 + 10
    assert a["device_idle_ns"] == 20


def test_from_kineto_keeps_runtime_syncs_only() -> None:
    class Ev:
        def __init__(self, name: str, activity: str) -> None:
            self._n, self._a = name, activity

        def name(self) -> str:
            return self._n

        def activity_type(self) -> str:
            return self._a

        def device_type(self) -> str:
            return "DeviceType.CPU"

        def device_index(self) -> int:
            return -1

        def start_ns(self) -> int:
            return 1

        def end_ns(self) -> int:
            return 2

        def correlation_id(self) -> int:
            return 7

        def start_thread_id(self) -> int:
            return 3

        def shapes(self) -> list[list[int]]:
            return [[2, 2]]

    class Result:
        def events(self) -> list[Ev]:
            return [Ev("cudaLaunchKernel", "cuda_runtime"),
                    Ev("cudaStreamSynchronize", "cuda_runtime"),
                    Ev("aten::mm", "cpu_op")]

    got = [(e.name, e.kind, e.thread) for e in _kernels.from_kineto(Result(), "attnscope")]
    assert got == [("cudaStreamSynchronize", "runtime", 0), ("aten::mm", "cpu_op", 3)]


# ---- host syncs on CPU ---------------------------------------------------------------------------

def test_host_syncs_of_item_and_nonzero() -> None:
    @attnscope.trace
    def needless(q: torch.Tensor) -> torch.Tensor:
        scale = float(q.abs().max().item())  # a value read back
        keep = torch.nonzero(q[0, 0, 0] > 0)  # an output size known only after the data
        return F.scaled_dot_product_attention(q, q, q) * scale + keep.numel()

    q = torch.randn(1, 2, 32, 16)
    with capture_spans(**PROFILE) as spans:
        needless(q)
        sdpa(q, q, q)
    (noisy,) = [s for s in traced_spans(spans) if s.name.endswith("needless")]
    (quiet,) = [s for s in traced_spans(spans) if s.name.endswith("sdpa")]
    a = attrs(noisy)
    assert a["attnscope.host_syncs"] == 2  # aten::item -> _local_scalar_dense counts once
    assert sorted(a["attnscope.host_sync_ops"]) == ["aten::item", "aten::nonzero"]
    assert attrs(quiet)["attnscope.host_syncs"] == 0
    assert a["attnscope.memcpy_ns"] >= 0


# ---- spans under the innermost attnscope span ----------------------------------------------------

def test_ops_hang_under_the_innermost_attnscope_span() -> None:
    q = torch.randn(2, 4, 128, 64)
    with capture_spans(**PROFILE) as spans:
        with attnscope.sampling(force=True, profile=True):
            with attnscope.span("block"):
                torch.relu(q @ q.transpose(-1, -2))
                sdpa(q, q, q)
    (block,) = [s for s in traced_spans(spans) if s.name == "block"]
    (inner,) = [s for s in traced_spans(spans) if s.name != "block"]
    assert attrs(block)["attnscope.tier"] == "profile"
    assert inner.parent is not None and inner.parent.span_id == block.context.span_id
    under_block = [s.name for s in descendants_of(spans, block)
                   if s not in descendants_of(spans, inner) and s is not inner]
    under_inner = [s.name for s in descendants_of(spans, inner)]
    assert "aten::scaled_dot_product_attention" in under_inner
    assert not any("scaled_dot_product" in n for n in under_block)
    assert "aten::matmul" in under_block
    _check_tree(spans, block)


def test_core_tflops_from_the_derived_flops(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope.worker.profiles import session as profile

    report = _kernels.KernelReport({"core_ns": 2_000_000, "kernel.count": 1}, [])
    monkeypatch.setattr(_kernels, "from_kineto", lambda result, marker: [])
    monkeypatch.setattr(_kernels, "analyze", lambda events, **kw: report)

    class Cap:
        profile = type("S", (), {"result": object(), "on_cuda": False})()
        start_epoch_ns = end_epoch_ns = 0

    cfg = type("C", (), {"max_kernel_spans": 64, "profile_dir": None})()
    got, _ = profile.finish(Cap(), cfg, {"flops": 4 * 10**9})  # type: ignore[arg-type]
    assert got["core_tflops"] == pytest.approx(2.0)  # 4 GFLOP in 2 ms
