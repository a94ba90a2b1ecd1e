"""Profiler events of one call → kernel child spans, backend, memory peak (worker side).

Everything here works on plain :class:`RawEvent` records, so it is tested on CPU with made-up
events; :func:`from_kineto` turns torch's kineto events into them.

Timestamps: a ``RawEvent`` carries the profiler's own clock (nanoseconds). :func:`analyze` maps
them onto the parent span's clock with one offset, taken from the ``attnscope`` marker that
:mod:`attnscope.capture.profiler` records at the start of the call: the marker's start is the span's start.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

from ..capture.record import MAX_NAME

__all__ = [
    "RawEvent", "KernelReport", "analyze", "from_kineto", "detect_backend", "call_kernels",
    "memory_peaks", "covered_ns",
    "KIND_CUDA_KERNEL", "KIND_CPU_OP", "KIND_MEMCPY", "KIND_MEMSET", "KIND_MEMORY", "KIND_MARKER",
    "KIND_OTHER", "MAX_NAME", "TOP_N",
]

KIND_CUDA_KERNEL = "cuda_kernel"
KIND_CPU_OP = "cpu_op"
KIND_MEMCPY = "memcpy"
KIND_MEMSET = "memset"
KIND_MEMORY = "memory"  # allocator event: nbytes > 0 allocates, < 0 frees
KIND_MARKER = "marker"  # attnscope's own record_function around the call
KIND_OTHER = "other"  # runtime/driver calls and anything else: not a child span
DEVICE_KINDS = frozenset((KIND_CUDA_KERNEL, KIND_MEMCPY, KIND_MEMSET))
TOP_N = 5


class RawEvent(NamedTuple):
    """One profiler event, on the profiler's clock."""

    name: str
    kind: str
    device: str  # "cpu", "cuda:0"
    start_ns: int
    end_ns: int
    nbytes: int = 0
    shapes: str = ""
    # The CPU op this belongs to, by the profiler's correlation id: a CPU op's own id, the id of
    # the op that launched a GPU activity (kineto's linked correlation id); 0 when unknown.
    op_id: int = 0


class KernelReport(NamedTuple):
    """What :func:`analyze` found: parent attributes (no prefix) and child spans."""

    attributes: dict[str, Any]
    children: list[tuple[str, int, int, dict[str, Any]]]


# Attention ops, first match wins (prefixes; backward variants share them).
_BACKEND_OPS: tuple[tuple[str, str], ...] = (
    ("aten::_scaled_dot_product_cudnn_attention", "cudnn"),
    ("aten::_cudnn_attention", "cudnn"),  # _forward / _backward
    ("aten::_scaled_dot_product_flash_attention", "flash"),  # also ..._for_cpu
    ("aten::_flash_attention", "flash"),  # _forward / _backward
    ("flash_attn::", "flash"),  # the flash-attn package's custom ops (_flash_attn_forward, ...)
    ("flash_attn_3::", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "efficient"),
    ("aten::_efficient_attention", "efficient"),  # _forward / _backward
    ("aten::_scaled_dot_product_attention_math", "math"),  # also ..._for_mps
    ("FlexAttention", "flex"),  # eager FlexAttention's autograd.Function (FlexAttentionAutogradOp)
)
# Substrings of op names (lower case): FlexAttention's higher-order ops and the ops Inductor
# records around its generated kernels (triton_tem_fused_flex_attention_0, ...).
_FLEX_NEEDLES = ("flex_attention", "flex_decoding")
# Substrings of GPU kernel names (lower case), only of kernels this call's ops launched.
_BACKEND_KERNELS: tuple[tuple[str, str], ...] = (
    ("cudnn", "cudnn"),
    ("flash_fwd", "flash"),
    ("flash_bwd", "flash"),
    ("flash::", "flash"),
    ("fmha_cutlass", "efficient"),
    ("efficient_attention", "efficient"),
    ("mem_eff", "efficient"),
) + tuple((needle, "flex") for needle in _FLEX_NEEDLES)
# Matrix-product kernels: cuBLAS/cuBLASLt GEMMs (Hopper's H100/H200 cuBLAS names them nvjet_*),
# CUTLASS GEMMs.
_GEMM_KERNELS = ("gemm", "nvjet", "cutlass")
_SOFTMAX_OPS = frozenset(("aten::softmax", "aten::_softmax", "aten::_safe_softmax",
                          "aten::log_softmax", "aten::_log_softmax"))
_MATMUL_OPS = frozenset(("aten::matmul", "aten::bmm", "aten::mm", "aten::baddbmm",
                         "aten::einsum", "aten::addmm"))


def detect_backend(ops: Iterable[str], kernels: Iterable[str] = ()) -> str:
    """The attention backend that ran: flash, efficient, cudnn, flex, math or unknown.

    ``ops`` are the names of the call's CPU ops, ``kernels`` those of the GPU kernels that these
    ops launched (:func:`call_kernels`), never of all kernels the profiler saw: CUPTI records the
    whole process, and another thread's kernel says nothing about this call. First match wins:

    1. an attention op names its backend (fused SDPA, the flash-attn package, FlexAttention);
    2. a softmax op and a matrix-product op: the math path, forced or written by hand;
    3. a kernel names its backend;
    4. a softmax kernel and a GEMM kernel (``gemm``, ``nvjet_*``, ``cutlass``): math;
    5. else unknown.
    """
    op_names = set(ops)
    for prefix, backend in _BACKEND_OPS:
        if any(name.startswith(prefix) for name in op_names):
            return backend
    lowered_ops = [name.lower() for name in op_names]
    if any(needle in name for name in lowered_ops for needle in _FLEX_NEEDLES):
        return "flex"
    if op_names & _SOFTMAX_OPS and op_names & _MATMUL_OPS:
        return "math"
    lowered = [name.lower() for name in set(kernels)]
    for needle, backend in _BACKEND_KERNELS:
        if any(needle in name for name in lowered):
            return backend
    if (any("softmax" in name for name in lowered)
            and any(g in name for name in lowered for g in _GEMM_KERNELS)):
        return "math"  # kernels only: GEMMs around a softmax kernel
    return "unknown"


def call_kernels(cpu_ops: Iterable[RawEvent], device_ops: Iterable[RawEvent]) -> list[RawEvent]:
    """The GPU kernels launched by one of ``cpu_ops`` (CUPTI correlation through ``op_id``).

    A kernel without a link (``op_id`` 0: launched on a thread the profiler does not record, or by
    code outside any op) or linked to an op that is not among ``cpu_ops`` is left out.
    """
    ids = {op.op_id for op in cpu_ops if op.op_id}
    return [e for e in device_ops if e.kind == KIND_CUDA_KERNEL and e.op_id and e.op_id in ids]


def memory_peaks(events: Iterable[RawEvent]) -> dict[str, int]:
    """Peak of the running sum of allocations minus frees, per device, in event order.

    Only what the call itself allocated counts: memory held before the call is the baseline 0.
    """
    running: dict[str, int] = {}
    peaks: dict[str, int] = {}
    for ev in sorted((e for e in events if e.kind == KIND_MEMORY), key=lambda e: e.start_ns):
        total = running.get(ev.device, 0) + ev.nbytes
        running[ev.device] = total
        if total > peaks.get(ev.device, 0):
            peaks[ev.device] = total
        else:
            peaks.setdefault(ev.device, 0)
    return peaks


def covered_ns(intervals: Iterable[tuple[int, int]], lo: int, hi: int) -> int:
    """Length of ``[lo, hi)`` covered by the union of ``intervals``."""
    covered = 0
    cursor = lo
    for start, end in sorted(intervals):
        start = max(start, cursor)
        end = min(end, hi)
        if end > start:
            covered += end - start
            cursor = end
    return covered


def _self_times(ops: Sequence[RawEvent]) -> list[int]:
    """Own time of each CPU op (its duration minus its direct children's), ops sorted by start."""
    own = [op.end_ns - op.start_ns for op in ops]
    stack: list[int] = []
    for i, op in enumerate(ops):
        while stack and ops[stack[-1]].end_ns <= op.start_ns:
            stack.pop()
        if stack:
            own[stack[-1]] -= op.end_ns - op.start_ns
        stack.append(i)
    return [max(0, t) for t in own]


def analyze(
    events: Sequence[RawEvent],
    *,
    span_start_ns: int,
    span_end_ns: int,
    max_spans: int,
    on_device: bool,
) -> KernelReport:
    """Kernel/op children and parent attributes for one profiled call.

    ``on_device``: the call's tensors were on a GPU, so the device activities are the kernels
    (CPU ops are their launches); otherwise the CPU ops are, ranked by their own (self) time.
    """
    marker = next((e for e in events if e.kind == KIND_MARKER), None)
    if marker is not None:
        offset = span_start_ns - marker.start_ns
        lo, hi = marker.start_ns, marker.end_ns
    else:
        offset = 0
        lo, hi = span_start_ns, span_end_ns
    cpu_ops = sorted((e for e in events if e.kind == KIND_CPU_OP), key=lambda e: e.start_ns)
    device_ops = sorted((e for e in events if e.kind in DEVICE_KINDS), key=lambda e: e.start_ns)
    cpu_own = _self_times(cpu_ops)

    # (own ns, event) for every candidate child; the kernels of the call come first.
    ranked_device = [(e.end_ns - e.start_ns, e) for e in device_ops]
    ranked_cpu = list(zip(cpu_own, cpu_ops))
    work = ranked_device if on_device else ranked_cpu
    attrs: dict[str, Any] = {
        "kernel.count": len(work),
        "kernel.total_ns": sum(ns for ns, _ in work),
        "backend": detect_backend((e.name for e in cpu_ops),
                                  (e.name for e in call_kernels(cpu_ops, device_ops))),
    }
    by_name: dict[str, int] = {}
    for ns, ev in work:
        by_name[ev.name] = by_name.get(ev.name, 0) + ns
    top = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_N]
    attrs["kernel.top_names"] = [name[:MAX_NAME] for name, _ in top]
    attrs["kernel.top_ns"] = [ns for _, ns in top]
    if on_device:
        intervals = [(e.start_ns, e.end_ns) for e in device_ops]
        attrs["launch_overhead_ns"] = max(0, (hi - lo) - covered_ns(intervals, lo, hi))
    peaks = memory_peaks(events)
    if peaks:
        device_peaks = [v for k, v in peaks.items() if k != "cpu"]
        if on_device and device_peaks:
            attrs["memory.peak_bytes"] = max(device_peaks)
            if "cpu" in peaks:
                attrs["memory.host_peak_bytes"] = peaks["cpu"]
        elif "cpu" in peaks:
            attrs["memory.peak_bytes"] = peaks["cpu"]

    candidates = ranked_device + ranked_cpu if on_device else ranked_cpu
    children = _children(candidates, offset, span_start_ns, span_end_ns, max_spans)
    return KernelReport(attrs, children)


def _children(
    candidates: list[tuple[int, RawEvent]],
    offset: int,
    span_start_ns: int,
    span_end_ns: int,
    max_spans: int,
) -> list[tuple[str, int, int, dict[str, Any]]]:
    if len(candidates) > max_spans:
        # Device work before CPU ops, then the longest own time; ties keep event order.
        order = sorted(range(len(candidates)), key=lambda i: (
            candidates[i][1].kind not in DEVICE_KINDS, -candidates[i][0], i))
        keep_idx = set(order[: max_spans - 1])
        kept = [c for i, c in enumerate(candidates) if i in keep_idx]
        rest = [c for i, c in enumerate(candidates) if i not in keep_idx]
    else:
        kept, rest = candidates, []

    def clamp(ev: RawEvent) -> tuple[int, int]:
        start, end = ev.start_ns + offset, ev.end_ns + offset
        if ev.kind in DEVICE_KINDS:
            return start, max(start, end)  # where it ran on the GPU, even after the call returned
        start = min(max(start, span_start_ns), span_end_ns)
        return start, min(max(end, start), span_end_ns)

    children: list[tuple[str, int, int, dict[str, Any]]] = []
    for own, ev in kept:
        start, end = clamp(ev)
        c_attrs: dict[str, Any] = {"attnscope.kernel.kind": ev.kind, "attnscope.kernel.device": ev.device}
        if ev.kind == KIND_CPU_OP:
            c_attrs["attnscope.kernel.self_ns"] = own
            if ev.shapes:
                c_attrs["attnscope.kernel.input_shapes"] = ev.shapes
        children.append((ev.name[:MAX_NAME] or "?", start, end, c_attrs))
    if rest:
        summed = sum(own for own, _ in rest)
        first = min((clamp(ev)[0] for _, ev in rest))
        end = first + summed
        if all(ev.kind not in DEVICE_KINDS for _, ev in rest):
            end = min(end, span_end_ns)
        children.append(("other", first, max(first, end), {
            "attnscope.kernel.kind": "other",
            "attnscope.kernel.device": rest[0][1].device,
            "attnscope.kernel.count": len(rest),
            "attnscope.kernel.total_ns": summed,
        }))
    children.sort(key=lambda c: (c[1], c[2]))
    return children


_KINDS = {
    "cpu_op": KIND_CPU_OP,
    "kernel": KIND_CUDA_KERNEL,
    "gpu_memcpy": KIND_MEMCPY,
    "gpu_memset": KIND_MEMSET,
}


def from_kineto(result: Any, marker: str) -> list[RawEvent]:
    """torch's kineto events as plain records (profiler clock, nanoseconds)."""
    out: list[RawEvent] = []
    for ev in result.events():
        name = ev.name()
        activity = ev.activity_type()
        device = _device_name(ev)
        if name == "[memory]":
            out.append(RawEvent(name, KIND_MEMORY, device, ev.start_ns(),
                                         ev.start_ns(), int(ev.nbytes())))
            continue
        if activity == "user_annotation" and name == marker:
            kind = KIND_MARKER
        else:
            kind = _KINDS.get(activity, KIND_OTHER)
        if kind == KIND_OTHER:
            continue
        shapes = ""
        if kind == KIND_CPU_OP:
            try:
                found = [s for s in ev.shapes() if s]
                shapes = str(found)[:256] if found else ""
            except Exception:
                shapes = ""
        out.append(RawEvent(name, kind, device, ev.start_ns(), ev.end_ns(), 0, shapes,
                            _op_id(ev, kind)))
    return out


def _op_id(ev: Any, kind: str) -> int:
    """A CPU op's correlation id; for a GPU activity, the id of the CPU op that launched it."""
    try:
        if kind == KIND_CPU_OP:
            return int(ev.correlation_id())
        if kind in DEVICE_KINDS:
            return int(ev.linked_correlation_id())
    except Exception:  # an event type without correlation: no link, not a failed parse
        pass
    return 0


def _device_name(ev: Any) -> str:
    kind = str(ev.device_type()).rsplit(".", 1)[-1].lower()
    if kind == "cpu":
        return "cpu"
    index = ev.device_index()
    return f"{kind}:{index}" if index >= 0 else kind
