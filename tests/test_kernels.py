"""Backend detection from recorded op and kernel names (what a GPU profile holds), on CPU.

The kernel names are as CUPTI reports them on Ampere/Hopper GPUs (cuBLAS on H100/H200 names its
GEMMs ``nvjet_*``). Each case lists the call's CPU ops with their correlation ids and the kernels
with the id of the op that launched them (kineto's linked correlation id); ``0`` is a kernel that
no op of this call launched, e.g. one from another thread, which CUPTI records all the same.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import profiler_session as _profile
from attnscope._profiles import kernels as _kernels
from attnscope._profiles.kernels import RawEvent
from attnscope.testing import capture_spans

from .support.helpers import naive, traced_spans

# ---- recorded names ------------------------------------------------------------------------------

FLASH_FWD = ("void pytorch_flash::flash_fwd_kernel<pytorch_flash::Flash_fwd_kernel_traits<"
             "128, 128, 64, 4, false, false, cutlass::bfloat16_t, "
             "pytorch_flash::Flash_kernel_traits<128, 128, 64, 4, "
             "cutlass::bfloat16_t> >, false, true, false, false, true, true, false, false>"
             "(pytorch_flash::Flash_fwd_params)")
MEM_EFF_FWD = ("fmha_cutlassF_bf16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel"
               "<cutlass::bfloat16_t, cutlass::arch::Sm80, true, 64, 128, 128, true, true>"
               "::Params)")
CUDNN_FWD = ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_"
             "4x1x1_kernel0_0")
NVJET_QK = "nvjet_hsh_256x128_64x4_1x2_h_bz_coopA_NTN"
NVJET_PV = "nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNN"
AMPERE_GEMM = "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn"
SM90_GEMM = ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_"
             "execute_segment_k_off_kernel__5x_cublas")
CUTLASS_GEMM = ("void cutlass::Kernel2<"
                "cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>"
                "(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8::Params)")
SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<8, c10::BFloat16, float, "
           "c10::BFloat16, at::native::(anonymous namespace)::SoftMaxForwardEpilogue>"
           "(c10::BFloat16*, c10::BFloat16 const*, int)")
TRITON_SOFTMAX = "triton_per_fused__softmax_div_0"
FLEX_FWD = "triton_tem_fused_flex_attention_0"
FLEX_BWD = "triton_tem_fused_flex_attention_backward_zeros_1"
FLEX_DECODE = "triton_tem_fused_flex_decoding_0"
ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, "
               "at::native::CUDAFunctor_add<float>, std::array<char*, 3ul> >"
               "(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")

SDPA = "aten::scaled_dot_product_attention"
# naive attention: softmax(q @ kᵀ / √d) @ v, as eager PyTorch records it
NAIVE_OPS = [(11, "aten::transpose"), (12, "aten::matmul"), (13, "aten::bmm"), (14, "aten::div"),
             (15, "aten::softmax"), (16, "aten::_softmax"), (17, "aten::matmul"), (18, "aten::bmm")]
NAIVE_KERNELS = [(13, NVJET_QK), (14, ELEMENTWISE), (16, SOFTMAX), (18, NVJET_PV)]

# (case, [(op id, op name)], [(launching op id, kernel name)], expected)
CASES: list[tuple[str, list[tuple[int, str]], list[tuple[int, str]], str]] = [
    ("flash", [(1, SDPA), (2, "aten::_scaled_dot_product_flash_attention"),
               (3, "aten::_flash_attention_forward"), (4, "aten::empty")],
     [(3, FLASH_FWD)], "flash"),
    ("flash backward", [(1, "aten::_scaled_dot_product_flash_attention_backward"),
                        (2, "aten::_flash_attention_backward")],
     [(2, "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<...>")], "flash"),
    ("flash-attn package", [(1, "flash_attn::_flash_attn_forward"), (2, "aten::empty_like")],
     [(1, "void flash::flash_fwd_kernel<Flash_fwd_kernel_traits<128, 128, 64, 4>>"
          "(Flash_fwd_params)")],
     "flash"),
    ("efficient", [(1, SDPA), (2, "aten::_scaled_dot_product_efficient_attention"),
                   (3, "aten::_efficient_attention_forward")],
     [(3, MEM_EFF_FWD)], "efficient"),
    ("cudnn", [(1, SDPA), (2, "aten::_scaled_dot_product_cudnn_attention"),
               (3, "aten::_cudnn_attention_forward")],
     [(3, CUDNN_FWD)], "cudnn"),
    ("forced math", [(1, SDPA), (2, "aten::_scaled_dot_product_attention_math"), *NAIVE_OPS[1:]],
     NAIVE_KERNELS, "math"),
    ("naive attention, nvjet GEMMs", NAIVE_OPS, NAIVE_KERNELS, "math"),
    # the ops alone cannot tell: a custom op (or a compiled region) launching the kernels itself
    ("math via nvjet kernels",
     [(1, "Torch-Compiled Region: 0/0"), (2, "aten::bmm"), (3, "aten::bmm")],
     [(2, NVJET_QK), (1, TRITON_SOFTMAX), (3, NVJET_PV)], "math"),
    ("math via gemm kernels", [(1, "mylib::attention")], [(1, AMPERE_GEMM), (1, SOFTMAX)], "math"),
    ("math via sm90 cublas", [(1, "mylib::attention")], [(1, SM90_GEMM), (1, SOFTMAX)], "math"),
    ("math via cutlass gemm", [(1, "mylib::attention")], [(1, CUTLASS_GEMM), (1, SOFTMAX)], "math"),
    ("flex compiled", [(1, "Torch-Compiled Region: 0/0"), (2, "aten::empty")], [(1, FLEX_FWD)],
     "flex"),
    ("flex compiled backward", [(1, "CompiledFunctionBackward")], [(1, FLEX_BWD)], "flex"),
    ("flex decoding", [(1, "Torch-Compiled Region: 1/0")], [(1, FLEX_DECODE)], "flex"),
    # torch.profiler.profile (not attnscope's session) makes Inductor record an op per kernel
    ("flex op", [(1, "Torch-Compiled Region: 0/0"), (2, FLEX_FWD)], [(2, FLEX_FWD)], "flex"),
    ("flex eager",
     [(1, "FlexAttentionAutogradOp"), (2, "aten::matmul"), (3, "aten::_safe_softmax")],
     [(2, NVJET_QK), (3, SOFTMAX)], "flex"),
    ("unknown", [(1, "aten::add"), (2, "aten::mul")], [(1, ELEMENTWISE)], "unknown"),
    ("nothing", [], [], "unknown"),
    # a softmax alone, or a GEMM alone, is not attention
    ("softmax only", [(1, "mylib::op")], [(1, SOFTMAX)], "unknown"),
    ("gemm only", [(1, "aten::mm")], [(1, NVJET_QK)], "unknown"),
    # another thread's attention kernels ran during this call: they decide nothing
    ("naive attention + concurrent cudnn", NAIVE_OPS, [*NAIVE_KERNELS, (0, CUDNN_FWD)], "math"),
    ("naive attention + concurrent flash", NAIVE_OPS, [*NAIVE_KERNELS, (0, FLASH_FWD)], "math"),
    ("kernels only + concurrent cudnn", [(1, "mylib::attention")],
     [(1, NVJET_QK), (1, SOFTMAX), (0, CUDNN_FWD)], "math"),
    ("elementwise + concurrent flash", [(1, "aten::add")], [(1, ELEMENTWISE), (0, FLASH_FWD)],
     "unknown"),
    # linked to an op that is not this call's (an id the call's ops do not have)
    ("linked elsewhere", [(1, "mylib::attention")], [(99, MEM_EFF_FWD)], "unknown"),
]


def _events(ops: list[tuple[int, str]], launched: list[tuple[int, str]]) -> list[RawEvent]:
    out = [RawEvent("attnscope", "marker", "cpu", 0, 10_000)]
    out += [RawEvent(name, "cpu_op", "cpu", 100 * i, 100 * i + 50, op_id=op_id)
            for i, (op_id, name) in enumerate(ops)]
    out += [RawEvent(name, "cuda_kernel", "cuda:0", 5_000 + 100 * i, 5_000 + 100 * i + 80,
                     op_id=op_id)
            for i, (op_id, name) in enumerate(launched)]
    return out


@pytest.mark.parametrize(("case", "ops", "launched", "expected"), CASES, ids=[c[0] for c in CASES])
def test_backend_from_recorded_events(case: str, ops: list[tuple[int, str]],
                                      launched: list[tuple[int, str]], expected: str) -> None:
    report = _kernels.analyze(_events(ops, launched), span_start_ns=0, span_end_ns=10_000,
                              max_spans=64, on_device=True)
    assert report.attributes["backend"] == expected
    # every kernel still counts as the call's device work; only the backend ignores unlinked ones
    assert report.attributes["kernel.count"] == len(launched)


@pytest.mark.parametrize(("case", "ops", "launched", "expected"), CASES, ids=[c[0] for c in CASES])
def test_detect_backend_from_names(case: str, ops: list[tuple[int, str]],
                                   launched: list[tuple[int, str]], expected: str) -> None:
    op_ids = {op_id for op_id, _ in ops}
    linked = [name for op_id, name in launched if op_id in op_ids]
    assert _kernels.detect_backend([name for _, name in ops], linked) == expected


def test_ops_decide_before_kernels() -> None:
    # the op says efficient; a linked kernel's name must not overrule it
    assert (_kernels.detect_backend(["aten::_efficient_attention_forward"], [CUDNN_FWD])
            == "efficient")
    # a softmax and a matmul op: math, even when a linked kernel's name says flash
    assert _kernels.detect_backend(["aten::bmm", "aten::_softmax"], [FLASH_FWD]) == "math"
    # the flash kernel's template arguments name cutlass: still flash, not a GEMM
    assert _kernels.detect_backend(["mylib::attention"], [FLASH_FWD, SOFTMAX]) == "flash"


def test_call_kernels_keeps_only_linked_kernels() -> None:
    events = _events([(1, "aten::bmm"), (2, "aten::_softmax")],
                     [(1, NVJET_QK), (0, CUDNN_FWD), (2, SOFTMAX), (7, FLASH_FWD)])
    cpu_ops = [e for e in events if e.kind == "cpu_op"]
    device = [e for e in events if e.kind == "cuda_kernel"]
    device.append(RawEvent("Memcpy HtoD (Pageable -> Device)", "memcpy", "cuda:0", 9_000, 9_100,
                           op_id=1))
    assert [e.name for e in _kernels.call_kernels(cpu_ops, device)] == [NVJET_QK, SOFTMAX]


# ---- from_kineto: the ids come from torch's correlation ids --------------------------------------

class _FakeKineto:
    def __init__(self, name: str, activity: str, device: str, corr: int, linked: int) -> None:
        self._name, self._activity, self._device = name, activity, device
        self._corr, self._linked = corr, linked

    def name(self) -> str:
        return self._name

    def activity_type(self) -> str:
        return self._activity

    def device_type(self) -> str:
        return f"DeviceType.{self._device.upper()}"

    def device_index(self) -> int:
        return 0 if self._device == "cuda" else -1

    def start_ns(self) -> int:
        return 100

    def end_ns(self) -> int:
        return 200

    def nbytes(self) -> int:
        return 0

    def shapes(self) -> list[list[int]]:
        return []

    def correlation_id(self) -> int:
        return self._corr

    def linked_correlation_id(self) -> int:
        return self._linked


class _FakeResult:
    def __init__(self, events: list[_FakeKineto]) -> None:
        self._events = events

    def events(self) -> list[_FakeKineto]:
        return self._events


def test_from_kineto_links_kernels_to_their_op() -> None:
    # a kernel's own correlation id pairs it with its cudaLaunchKernel; the linked id is the op's
    result = _FakeResult([
        _FakeKineto("aten::bmm", "cpu_op", "cpu", 42, 0),
        _FakeKineto("cudaLaunchKernel", "cuda_runtime", "cpu", 9001, 42),
        _FakeKineto(NVJET_QK, "kernel", "cuda", 9001, 42),
        _FakeKineto(CUDNN_FWD, "kernel", "cuda", 9002, 0),
    ])
    events = _kernels.from_kineto(result, "attnscope")
    assert [(e.name, e.kind, e.device, e.op_id) for e in events] == [
        ("aten::bmm", "cpu_op", "cpu", 42),
        (NVJET_QK, "cuda_kernel", "cuda:0", 42),
        (CUDNN_FWD, "cuda_kernel", "cuda:0", 0),
    ]


def test_real_profile_gives_every_op_an_id(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _profile.warm_up()
    seen: list[list[RawEvent]] = []
    real = _kernels.from_kineto

    def spy(result: Any, marker: str, **kw: Any) -> list[RawEvent]:
        seen.append(real(result, marker, **kw))
        return seen[-1]

    monkeypatch.setattr(_kernels, "from_kineto", spy)
    q = torch.randn(1, 2, 16, 8)
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
        naive(q, q, q)
    (parent,) = traced_spans(spans)
    assert parent.attributes["attnscope.backend"] == "math"
    (events,) = seen
    ops = [e for e in events if e.kind == "cpu_op"]
    assert ops and all(e.op_id > 0 for e in ops)
    assert len({e.op_id for e in ops}) == len(ops)


def test_eager_flex_attention_is_flex() -> None:
    flex_attention = pytest.importorskip(  # torch 2.5 and later
        "torch.nn.attention.flex_attention").flex_attention
    # eager FlexAttention runs its unfused reference (softmax and matmul ops, as the math path
    # does) under its autograd.Function's op: the op names FlexAttention
    assert _profile.warm_up()
    traced = attnscope.trace(flex_attention)
    q = torch.randn(1, 2, 16, 8)
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
        traced(q, q, q)
    (parent,) = traced_spans(spans)
    assert parent.attributes["attnscope.tier"] == "profile"
    assert parent.attributes["attnscope.backend"] == "flex"


# ---- the clocks, and what each op read (issue 24 §3) ---------------------------------------------

def test_events_on_the_span_clock_keep_their_time() -> None:
    # torch 2.13: kineto's clock is time.time_ns()'s; the marker starts 40 µs before the span's
    # start was read. Pairing the two put every op 40 µs late (out of the nested span that ran
    # it, under trace_model=True); the events keep their own timestamps instead.
    start = 1_700_000_000_000_000_000
    events = [RawEvent("attnscope", "marker", "cpu", start - 40_000, start + 1_000_000),
              RawEvent("aten::mm", "cpu_op", "cpu", start + 10_000, start + 30_000)]
    report = _kernels.analyze(events, span_start_ns=start, span_end_ns=start + 1_000_000,
                              max_spans=64, on_device=False)
    ((_, op_start, op_end, _, _),) = report.children
    assert (op_start, op_end) == (start + 10_000, start + 30_000)
    # the calling thread preempted for 50 ms between the marker and the span's start: one clock
    late = [events[0]._replace(start_ns=start - 50_000_000), events[1]]
    report = _kernels.analyze(late, span_start_ns=start, span_end_ns=start + 1_000_000,
                              max_spans=64, on_device=False)
    ((_, op_start, op_end, _, _),) = report.children
    assert (op_start, op_end) == (start + 10_000, start + 30_000)
    # another clock (the marker nowhere near the span's start): one offset, marker start = start
    far = [e._replace(start_ns=e.start_ns - 10**12, end_ns=e.end_ns - 10**12) for e in events]
    report = _kernels.analyze(far, span_start_ns=start, span_end_ns=start + 1_000_000,
                              max_spans=64, on_device=False)
    ((_, op_start, op_end, _, _),) = report.children
    assert (op_start, op_end) == (start + 50_000, start + 70_000)


def test_from_kineto_reads_each_ops_inputs_from_a_real_profile(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert _profile.warm_up()
    results: list[Any] = []
    real = _kernels.from_kineto

    def keep(result: Any, marker: str, **kw: Any) -> list[RawEvent]:
        results.append(result)
        return real(result, marker, **kw)

    monkeypatch.setattr(_kernels, "from_kineto", keep)
    proj = torch.nn.Linear(8, 8)

    @attnscope.trace
    def project(x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = proj(x)
        return out

    x = torch.randn(2, 8)
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0):
        project(x)
    (result,) = results
    plain = real(result, "attnscope", inputs=False)
    events = real(result, "attnscope")
    assert [e._replace(inputs=()) for e in events] == plain and all(not e.inputs for e in plain)
    (linear,) = [e for e in events if e.name == "aten::linear"]
    storage = {p.untyped_storage().data_ptr() for p in (proj.weight, proj.bias)}
    assert x.untyped_storage().data_ptr() in linear.inputs
    assert storage <= set(linear.inputs)


def test_from_kineto_without_an_event_tree_reads_no_inputs() -> None:
    class Result(_FakeResult):
        def experimental_event_tree(self) -> list[Any]:
            raise RuntimeError("not recorded")

    events = _kernels.from_kineto(Result([_FakeKineto("aten::mm", "cpu_op", "cpu", 3, 0)]),
                                  "attnscope")
    assert [(e.name, e.inputs) for e in events] == [("aten::mm", ())]
