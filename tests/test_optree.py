"""Profile tier in Jaeger (issue 11 items 1, 2, 3, 5): op spans nested as they ran, tiny and
metadata-only ops folded, attention core vs projections, spans under the innermost attnscope span,
host syncs and copy time. File structure checks on CPU; the GPU parts with made-up events."""

from __future__ import annotations

import difflib
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._capture import profiler_session as _profile
from attnscope._profiles import kernels as _kernels
from attnscope._profiles import optree
from attnscope._profiles.kernels import RawEvent
from attnscope.testing import capture_spans

from .support.helpers import attrs, children_of, descendants_of, sdpa, traced_spans

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


def _is_layer(span: Any) -> bool:
    """An attention layer's span (its name also carries the phase and implementation)."""
    return str(attrs(span).get("attnscope.module", "")).endswith("self_attn")


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
    (layer,) = [s for s in traced_spans(spans) if _is_layer(s)]
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
    top = [s.name.split(" (")[0] for s in children_of(spans, layer)]  # without a module label
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
    got = [(c.name, c.parent, c.attributes.get("attnscope.kernel.folded"),
            c.attributes.get("attnscope.kernel.inner")) for c in report.children]
    # the copy is the clone's own work (merged); the tiny add is an operator like the other
    assert got == [("aten::clone", -1, 1, ["aten::copy_"]), ("aten::add", -1, None, None),
                   ("aten::add", -1, None, None)]
    assert report.attributes["kernel.folded"] == 2  # reshape, view
    clone = report.children[0]
    assert clone.attributes["attnscope.kernel.self_ns"] == 480


def test_a_detach_recorded_without_namespace_folds_like_aten_detach() -> None:
    events = [
        _ev("attnscope", "marker", 0, 1000),
        _ev("aten::cat", "cpu_op", 0, 400),
        _ev("detach_", "cpu_op", 500, 502),
        _ev("detach", "cpu_op", 600, 601),
    ]
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=1000, max_spans=64,
                              on_device=False)
    assert [c.name for c in report.children] == ["aten::cat"]
    assert report.attributes["kernel.folded"] == 2


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
    from attnscope._profiles import session as profile

    report = _kernels.KernelReport({"core_ns": 2_000_000, "kernel.count": 1}, [])
    monkeypatch.setattr(_kernels, "from_kineto", lambda result, marker, **kw: [])
    monkeypatch.setattr(_kernels, "analyze", lambda events, **kw: report)

    class Cap:
        profile = type("S", (), {"result": object(), "on_cuda": False})()
        start_epoch_ns = end_epoch_ns = 0
        instance = None  # no module: no labels

    cfg = type("C", (), {"max_kernel_spans": 64, "profile_dir": None})()
    got, _, _ = profile.finish(Cap(), cfg, {"flops": 4 * 10**9})  # type: ignore[arg-type]
    assert got["core_tflops"] == pytest.approx(2.0)  # 4 GFLOP in 2 ms


# ---- one shape per operator (issue 24 §3) --------------------------------------------------------

def _shape_of(children: list[optree.ChildSpan]) -> list[tuple[str, int, tuple[str, ...], int]]:
    return [(c.name, c.parent, tuple(c.attributes.get("attnscope.kernel.inner", ())),
             c.attributes.get("attnscope.kernel.folded", 0)) for c in children]


def _linear_call(scale: int) -> list[RawEvent]:
    """q/k/v projections, a softmax and a copy, every op ``scale`` times as long."""
    def ev(name: str, start: int, end: int) -> RawEvent:
        return _ev(name, "cpu_op", start * scale, end * scale)
    return [
        _ev("attnscope", "marker", 0, 1000 * scale),
        ev("aten::linear", 0, 100), ev("aten::t", 1, 2), ev("aten::matmul", 3, 99),
        ev("aten::mm", 4, 98),
        ev("aten::linear", 100, 140), ev("aten::t", 101, 102), ev("aten::addmm", 103, 139),
        ev("aten::copy_", 104, 105),
        ev("aten::softmax", 150, 152), ev("aten::_softmax", 150, 151),
        ev("aten::view", 160, 161),
        ev("aten::add", 170, 171),
    ]


@pytest.mark.parametrize("scale", [1, 1000, 100_000])
def test_the_span_shape_depends_on_the_operators_not_their_time(scale: int) -> None:
    # The same ops, taking 1 ns to 100 µs each: the same spans (the fold threshold of the old
    # code, max(5 µs, 0.5 % of the call), folded the short ones away and merged by time).
    report = _kernels.analyze(_linear_call(scale), span_start_ns=0, span_end_ns=1000 * scale,
                              max_spans=64, on_device=False)
    assert _shape_of(report.children) == [
        ("aten::linear", -1, ("aten::matmul", "aten::mm"), 1),
        ("aten::linear", -1, ("aten::addmm", "aten::copy_"), 1),
        ("aten::softmax", -1, ("aten::_softmax",), 0),
        ("aten::add", -1, (), 0),
    ]
    assert report.attributes["kernel.folded"] == 1  # the view
    # own time: nothing below a merged op is a span, so all of its time is its own
    assert [c.attributes["attnscope.kernel.self_ns"] for c in report.children] == [
        100 * scale, 40 * scale, 2 * scale, 1 * scale]


def test_ops_under_a_region_without_a_namespace_stay_spans() -> None:
    # a record_function-like region is no operator: what it ran is shown, each op merged as above
    events = [_ev("my_region", "cpu_op", 0, 100), _ev("aten::linear", "cpu_op", 10, 50),
              _ev("aten::mm", "cpu_op", 11, 49), _ev("aten::relu", "cpu_op", 60, 70)]
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=100, max_spans=64,
                              on_device=False)
    assert _shape_of(report.children) == [("my_region", -1, (), 0),
                                          ("aten::linear", 0, ("aten::mm",), 0),
                                          ("aten::relu", 0, (), 0)]
    assert report.children[0].attributes["attnscope.kernel.self_ns"] == 100 - 40 - 10


def _child(name: str, start: int, end: int, parent: int = -1) -> optree.ChildSpan:
    return optree.ChildSpan(name, start, end, {"attnscope.kernel.kind": "cpu_op",
                                               "attnscope.kernel.device": "cpu",
                                               "attnscope.kernel.self_ns": end - start}, parent)


class _Nested:
    def __init__(self, start: int, end: int, module: str) -> None:
        self.start_ns, self.end_ns = start, end
        self.attrs = {"attnscope.module": module}
        self.children: list[optree.ChildSpan] = []


def test_the_cap_applies_to_each_nested_span_after_hand_down() -> None:
    # 2 nested layers with 6 ops each, 3 ops between: the cap (4) is per span, after hand-down
    spans = [_child(f"aten::op{i}", 10 * i, 10 * i + 5) for i in range(15)]
    spans[1] = _child("aten::linear (model.layers.0.self_attn.q_proj)", 10, 15)
    children = optree.Children.of(spans, 4)
    assert len(children) == 4  # the call's own cap, when nothing is nested
    nested = [_Nested(8, 67, "model.layers.0.self_attn"), _Nested(88, 147, "elsewhere")]
    stay = optree.hand_down(children, nested)
    assert [c.name for c in stay] == ["aten::op0", "aten::op7", "aten::op8"]
    for res in nested:
        assert len(res.children) == 4 and res.children[-1].name == "other"
        (other,) = [c for c in res.children if c.name == "other"]
        assert other.attributes["attnscope.kernel.count"] == 3  # 6 ops, 3 kept
    # all 6 of each layer were there before the cap: the longest kept are its first 3 (a tie)
    assert [c.name for c in nested[0].children[:3]] == [
        "aten::linear (q_proj)", "aten::op2", "aten::op3"]  # relative to the layer's module
    assert nested[1].children[0].name == "aten::op9"


def test_an_op_goes_to_the_latest_nested_call_started_before_it() -> None:
    # Two layers run one after the other. The first one's end was read late (its thread was
    # preempted between the call's return and the clock read: seen under two CPU burners), so
    # its span reaches into the second's: the second's first op started after the second began,
    # and belongs to it, not to the first (it used to go to the first span found).
    spans = [_child("aten::mul (model.layers.0.input_layernorm)", 10, 12),
             _child("aten::linear (model.layers.0.mlp.up_proj)", 30, 40),
             _child("aten::mul (model.layers.1.input_layernorm)", 52, 54),
             _child("aten::linear (model.layers.1.mlp.up_proj)", 70, 80)]
    nested = [_Nested(5, 60, "model.layers.0"), _Nested(50, 90, "model.layers.1")]
    stay = optree.hand_down(spans, nested)
    assert stay == []
    assert [c.name for c in nested[0].children] == ["aten::mul (input_layernorm)",
                                                    "aten::linear (mlp.up_proj)"]
    assert [c.name for c in nested[1].children] == ["aten::mul (input_layernorm)",
                                                    "aten::linear (mlp.up_proj)"]


def test_labels_name_the_one_submodule_whose_weights_an_op_read() -> None:
    lin, shared = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    root = torch.nn.Module()
    root.q_proj = lin
    root.a = shared
    root.b = shared  # one module under two names: no label says which
    root.tied = torch.nn.Linear(4, 4)
    root.tied.weight = lin.weight  # tied to q_proj: neither is certain
    root.k_proj = torch.nn.Linear(4, 4, bias=True)
    ptr = {n: p.untyped_storage().data_ptr() for n, p in root.named_parameters(
        remove_duplicate=False)}
    owners = _kernels.parameter_owners(root)
    assert owners == {ptr["k_proj.weight"]: {"k_proj"}, ptr["k_proj.bias"]: {"k_proj"},
                      ptr["q_proj.weight"]: {"q_proj", "tied"}, ptr["q_proj.bias"]: {"q_proj"},
                      ptr["tied.bias"]: {"tied"}, ptr["a.weight"]: {"a", "b"},
                      ptr["a.bias"]: {"a", "b"}}
    activation = 12345
    events = [
        RawEvent("aten::linear", "cpu_op", "cpu", 0, 10, inputs=(activation, ptr["k_proj.weight"],
                                                               ptr["k_proj.bias"])),
        RawEvent("aten::linear", "cpu_op", "cpu", 10, 20, inputs=(activation, ptr["a.weight"])),
        RawEvent("aten::linear", "cpu_op", "cpu", 20, 30,
                 inputs=(activation, ptr["q_proj.weight"], ptr["q_proj.bias"])),
        RawEvent("aten::add", "cpu_op", "cpu", 30, 40,
                 inputs=(ptr["k_proj.bias"], ptr["tied.bias"])),  # two modules: no label
        RawEvent("aten::mm", "cpu_op", "cpu", 40, 50,
                 inputs=(activation, ptr["q_proj.weight"])),  # q_proj's or tied's: no label
    ]
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=50, max_spans=64,
                              on_device=False, module=root)
    # q_proj's weight is tied's too, its bias only q_proj's: q_proj owns all the op read
    assert [c.name for c in report.children] == [
        "aten::linear (k_proj)", "aten::linear", "aten::linear (q_proj)", "aten::add", "aten::mm"]


def _profiled_layer_result(attn: str, seq: int) -> tuple[Any, Any, Any]:
    """A real profile of one tiny-Llama attention layer: the profiler's result, the layer, and
    the span attnscope made of it."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=100,
                                   max_position_embeddings=128)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    layer = model.model.layers[0].self_attn
    results: list[Any] = []
    real = _kernels.from_kineto

    def keep(result: Any, marker: str, **kw: Any) -> list[RawEvent]:
        results.append(result)
        return real(result, marker, **kw)

    attnscope.instrument(model)
    ids = torch.randint(0, 100, (1, seq))
    try:
        with torch.inference_mode():
            model(ids)
            with pytest.MonkeyPatch.context() as mp:
                mp.setattr(_kernels, "from_kineto", keep)
                with capture_spans(**PROFILE) as spans:
                    model(ids)
    finally:
        attnscope.uninstrument(model)
    (span,) = [s for s in traced_spans(spans) if _is_layer(s)]
    assert attrs(span)["attnscope.tier"] == "profile" and len(results) == 1
    return results[0], layer, span


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_projections_are_labelled_from_a_real_profile(attn: str) -> None:
    from attnscope._record.capture import PROFILE_MARKER

    result, layer, span = _profiled_layer_result(attn, 16)
    events = _kernels.from_kineto(result, PROFILE_MARKER)
    report = _kernels.analyze(events, span_start_ns=span.start_time, span_end_ns=span.end_time,
                              max_spans=64, on_device=False, module=layer)
    linears = [c.name for c in report.children if c.name.startswith("aten::linear")]
    # LlamaAttention.forward: q, k, v projections, the attention, the output projection
    assert linears == ["aten::linear (q_proj)", "aten::linear (k_proj)", "aten::linear (v_proj)",
                       "aten::linear (o_proj)"]
    # the layer's weights are what the ops read: the same tensors as its children's
    assert set(_kernels.parameter_owners(layer).values()) == {
        frozenset({name}) for name in ("q_proj", "k_proj", "v_proj", "o_proj")}
    # without the module: the same spans, unlabelled
    plain = _kernels.analyze(events, span_start_ns=span.start_time, span_end_ns=span.end_time,
                             max_spans=64, on_device=False)
    assert [c.name.split(" (")[0] for c in report.children] == [c.name for c in plain.children]


# ---- the same shape in the files a person opens (Jaeger JSON, OTLP JSON) -------------------------

_KIND_TAG, _INNER_TAG = "attnscope.kernel.kind", "attnscope.kernel.inner"


def _otlp_value(value: Any) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_otlp_value(v) for v in value.array_value.values]
    return getattr(value, which) if which else None


def _file_spans(path: Any) -> list[tuple[str, str, str, dict[str, Any]]]:
    """(span id, parent id or "", name, attributes) of every span in a Jaeger or OTLP JSON file."""
    import json

    from attnscope.exporters import read_otlp_json_lines

    out: list[tuple[str, str, str, dict[str, Any]]] = []
    if str(path).endswith(".json"):
        for trace in json.loads(path.read_text())["data"]:
            for s in trace["spans"]:
                parent = next((r["spanID"] for r in s.get("references", ())
                               if r["refType"] == "CHILD_OF"), "")
                tags = {t["key"]: t["value"] for t in s["tags"]}
                if isinstance(tags.get(_INNER_TAG), str):  # Jaeger JSON: a list as JSON text
                    tags[_INNER_TAG] = json.loads(tags[_INNER_TAG])
                out.append((s["spanID"], parent, s["operationName"], tags))
        return out
    for request in read_otlp_json_lines(path):
        for rs in request.resource_spans:
            for ss in rs.scope_spans:
                for s in ss.spans:
                    tags = {a.key: _otlp_value(a.value) for a in s.attributes}
                    out.append((s.span_id.hex(), s.parent_span_id.hex(), s.name, tags))
    return out


def _op_shape(rows: list[tuple[str, str, str, dict[str, Any]]], span_id: str) -> tuple[Any, ...]:
    """The operator spans under a span: (name, what was merged into it, its own operator spans)."""
    kids = [r for r in rows if r[1] == span_id and _KIND_TAG in r[3]]
    return tuple((name, tuple(tags.get(_INNER_TAG) or ()), _op_shape(rows, sid))
                 for sid, _, name, tags in kids)


def _shape_lines(shape: tuple[Any, ...], depth: int = 0) -> list[str]:
    out = []
    for name, inner, kids in shape:
        out.append("  " * depth + name + (" = " + ", ".join(inner) if inner else ""))
        out += _shape_lines(kids, depth + 1)
    return out


def _shape_diff(expected: tuple[Any, ...], got: tuple[Any, ...]) -> str:
    """Two :func:`_op_shape` trees as a unified diff of their names (a failure's message)."""
    return "\n".join(difflib.unified_diff(_shape_lines(expected), _shape_lines(got), "alone",
                                           "nested", lineterm="", n=1))


def _count(shape: tuple[Any, ...]) -> int:
    """Spans in an :func:`_op_shape`, at every depth."""
    return sum(1 + _count(kids) for _, _, kids in shape)


def _tiny_llama(attn: str, layers: int = 4) -> Any:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, vocab_size=100,
                                   max_position_embeddings=128)
    cfg._attn_implementation = attn
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _profiled_generate(model: Any, path: Any, max_kernel_spans: int = 64,
                       **instrument: Any) -> list[Any]:
    """One profiled ``generate()`` (prefill, 2 decode steps) written to ``path``; its rows."""
    ids = torch.randint(0, 100, (1, 16), generator=torch.Generator().manual_seed(1))
    attnscope.instrument(model, **instrument)
    try:
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=3, do_sample=False)  # warm
            kind = "jaeger-json" if str(path).endswith(".json") else "otlp-json"
            attnscope.configure(exporter=f"{kind}:{path}", sample_rate=1.0, warmup_calls=0,
                                overhead_budget=1.0, profile_rate=1.0,
                                profile_max_per_minute=1000.0,
                                max_kernel_spans=max_kernel_spans)
            model.generate(ids, max_new_tokens=3, do_sample=False)
            assert attnscope.shutdown(timeout_s=30.0)
    finally:
        attnscope.uninstrument(model)
    return _file_spans(path)


def _layer_shapes(rows: list[Any]) -> dict[str, list[tuple[Any, ...]]]:
    """Each phase's attention-layer spans' operator shapes, in file order."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    for sid, _, _, tags in rows:
        if str(tags.get("attnscope.module", "")).endswith("self_attn"):
            assert tags.get("attnscope.tier") == "profile"
            out.setdefault(str(tags["attnscope.phase"]), []).append(_op_shape(rows, sid))
    return out


def test_over_the_cap_layers_and_runs_keep_one_shape(tmp_path: Any) -> None:
    # An eager layer has 24-25 operator spans: with a cap of 8 each keeps 7 and an ``other``,
    # the same 7 in every layer and run, however long each op took this time.
    model = _tiny_llama("eager")
    runs = [_layer_shapes(_profiled_generate(model, tmp_path / name, max_kernel_spans=8))
            for name in ("run1.json", "run2.jsonl")]
    for shapes in runs:
        for phase, per_layer in shapes.items():
            for shape in per_layer:
                assert _count(shape) == 8 and "other" in [name for name, *_ in shape], shape
            assert all(s == per_layer[0] for s in per_layer), f"{phase}: the layers differ"
    for phase in ("prefill", "decode"):
        assert runs[0][phase][0] == runs[1][phase][0], f"{phase}: the two runs differ"


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_one_operator_shape_across_layers_and_runs(attn: str, tmp_path: Any) -> None:
    model = _tiny_llama(attn)
    runs = [_layer_shapes(_profiled_generate(model, tmp_path / name))
            for name in ("run1.json", "run2.jsonl")]
    for shapes in runs:
        assert sorted(shapes) == ["decode", "prefill"]
        assert len(shapes["prefill"]) == 4 and len(shapes["decode"]) == 8  # 4 layers, 2 steps
        for phase, per_layer in shapes.items():
            assert all(s == per_layer[0] for s in per_layer), (
                f"{attn} {phase}: the layers' operator spans differ")
    for phase in ("prefill", "decode"):
        assert runs[0][phase][0] == runs[1][phase][0], f"{attn} {phase}: the two runs differ"
    for phase in ("prefill", "decode"):
        top = [name for name, _, _ in runs[0][phase][0]]
        # q, k, v and the output projection, each one span with its matrix product merged
        linears = [(name, inner) for name, inner, _ in runs[0][phase][0]
                   if name.startswith("aten::linear")]
        assert len(linears) == 4, top
        assert all({"aten::mm", "aten::addmm"} & set(inner) for _, inner in linears), linears
        assert not set(top) & optree.METADATA_OPS
        assert ("aten::scaled_dot_product_attention" in top) == (attn == "sdpa")
        assert ("aten::softmax" in top) == (attn == "eager")
        if attn == "eager":
            (softmax,) = [inner for name, inner, _ in runs[0][phase][0] if name == "aten::softmax"]
            assert softmax == ("aten::_softmax",)  # one shape, prefill and decode alike


@pytest.mark.parametrize("attn", ["eager", "sdpa"])
def test_trace_model_ops_fold_under_the_innermost_span(attn: str, tmp_path: Any) -> None:
    # trace_model=True: the profile lands on generate(); its ops go down to the model forwards
    # and the attention layers that ran them, each then folded and capped on its own, so every
    # layer shows the operator spans a layer profiled by itself shows.
    model = _tiny_llama(attn)
    alone = _layer_shapes(_profiled_generate(model, tmp_path / "alone.json"))
    rows = _profiled_generate(model, tmp_path / "model.jsonl", trace_model=True)
    layers: dict[str, list[tuple[Any, ...]]] = {}
    for sid, _, _, tags in rows:
        if str(tags.get("attnscope.module", "")).endswith("self_attn"):
            assert tags.get("attnscope.tier") != "profile"  # generate() held the profiler
            layers.setdefault(str(tags["attnscope.phase"]), []).append(_op_shape(rows, sid))
    assert {p: len(v) for p, v in layers.items()} == {"prefill": 4, "decode": 8}
    for phase, per_layer in layers.items():
        for s in per_layer:  # seen once under four burners: the diff says which op moved
            assert s == alone[phase][0], f"{attn} {phase}: " + _shape_diff(alone[phase][0], s)
    (generate,) = [r for r in rows if r[3].get("attnscope.tier") == "profile"]
    ops = [r for r in rows if _KIND_TAG in r[3]]
    # far more than one cap's worth: the cap (64) applies per span, after the hand-down
    assert len(ops) > 64 * 3
    assert len([r for r in ops if r[1] == generate[0]]) <= 64


@pytest.mark.parametrize("fmt", ["json", "jsonl"])
def test_trace_model_hangs_a_blocks_ops_under_its_decoder_layer(fmt: str, tmp_path: Any) -> None:
    # trace_model=True: each decoder layer (an entry of model.layers) gets a span; its norms and
    # MLP ops hang under it, its attention layer's span with them, nothing of it on the forward
    rows = _profiled_generate(_tiny_llama("sdpa", layers=2), tmp_path / f"blocks.{fmt}",
                              trace_model=True)
    by_id = {r[0]: r for r in rows}
    blocks = [r for r in rows if r[3].get("attnscope.module") in ("model.layers.0",
                                                                   "model.layers.1")]
    assert len(blocks) == 2 * 3  # per layer: the prefill and two decode forwards
    for sid, parent, name, tags in blocks:
        assert name == tags["attnscope.module"]  # no phase: a block has no attention facts
        assert "attnscope.flops" not in tags and "attnscope.tokens" not in tags
        assert by_id[parent][3].get("attnscope.module") == "LlamaForCausalLM"
        kids = [r for r in rows if r[1] == sid]
        ops = [r[2] for r in kids if _KIND_TAG in r[3]]
        assert [n for n in ops if n.startswith("aten::linear")] == [
            f"aten::linear (mlp.{p})" for p in ("gate_proj", "up_proj", "down_proj")]
        assert {"aten::mul (input_layernorm)", "aten::mul (post_attention_layernorm)"} <= set(ops)
        (attn,) = [r for r in kids if r[3].get("attnscope.module", "").endswith("self_attn")]
        assert attn[3]["attnscope.module"] == tags["attnscope.module"] + ".self_attn"
    forwards = {r[0] for r in rows if r[3].get("attnscope.module") == "LlamaForCausalLM"}
    on_forward = [r[2] for r in rows if r[1] in forwards and _KIND_TAG in r[3]]
    assert on_forward and not any("mlp" in n or "layernorm" in n for n in on_forward)


def test_projections_are_labelled_in_the_files(tmp_path: Any) -> None:
    rows = _profiled_generate(_tiny_llama("eager", layers=2), tmp_path / "labels.json")
    for sid, _, _, tags in rows:
        if str(tags.get("attnscope.module", "")).endswith("self_attn"):
            names = [name for name, _, _ in _op_shape(rows, sid)]
            assert [n for n in names if n.startswith("aten::linear")] == [
                f"aten::linear ({p})" for p in ("q_proj", "k_proj", "v_proj", "o_proj")]
