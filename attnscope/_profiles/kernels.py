"""Profiler events of one call → kernel child spans, backend, memory peak (worker side).

Everything here works on plain :class:`RawEvent` records, so it is tested on CPU with made-up
events; :func:`from_kineto` turns torch's kineto events into them.

Timestamps: a ``RawEvent`` carries the profiler's own clock (nanoseconds). :func:`analyze` maps
them onto the parent span's clock with one offset, taken from the ``attnscope`` marker that
:mod:`attnscope._capture.profiler_session` records at the start of the call: the marker's start is
the span's start.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from .. import _schema as schema
from .._record.capture import MAX_NAME
from . import opstats, optree

__all__ = [
    "RawEvent", "KernelReport", "analyze", "from_kineto", "detect_backend", "call_kernels",
    "memory_peaks", "covered_ns", "parameter_owners", "module_labels", "call_bounds", "cpu_tree",
    "top_kernels",
    "KIND_CUDA_KERNEL", "KIND_CPU_OP", "KIND_MEMCPY", "KIND_MEMSET", "KIND_MEMORY", "KIND_MARKER",
    "KIND_RUNTIME", "KIND_OTHER", "MAX_NAME", "TOP_N",
]

KIND_CUDA_KERNEL = "cuda_kernel"
KIND_CPU_OP = "cpu_op"
KIND_MEMCPY = "memcpy"
KIND_MEMSET = "memset"
KIND_MEMORY = "memory"  # allocator event: nbytes > 0 allocates, < 0 frees
KIND_MARKER = "marker"  # attnscope's own record_function around the call
KIND_RUNTIME = "runtime"  # a CUDA runtime/driver call that blocks the host (host_syncs only)
KIND_OTHER = "other"  # other runtime/driver calls and anything else: not a child span
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
    thread: int = 0  # CPU ops: the thread that ran it (ops nest per thread)
    # CPU ops: the storage addresses of the op's tensor inputs (``from_kineto(inputs=True)``), to
    # tell which module's parameters it read; empty when not recorded.
    inputs: tuple[int, ...] = ()


class KernelReport(NamedTuple):
    """What :func:`analyze` found: parent attributes (no prefix) and child spans."""

    attributes: dict[str, Any]
    children: list[optree.ChildSpan]


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


def ran_implementation(ops: Iterable[str]) -> str | None:
    """Which attention implementation a profiled layer's own ops show it ran: ``sdpa`` (torch's
    dispatcher op, whatever backend it chose), ``flex``, ``flash_attn`` (the package), ``eager``
    (a softmax between matrix products, none of those), or None when the ops do not say."""
    names = set(ops)
    if any(n.startswith("aten::scaled_dot_product_attention") for n in names):
        return "sdpa"
    lowered = [n.lower() for n in names]
    if any(needle in n for n in lowered for needle in _FLEX_NEEDLES) or any(
            n.startswith("FlexAttention") for n in names):
        return "flex"
    if any(n.startswith(("flash_attn::", "flash_attn_3::")) for n in names):
        return "flash_attn"
    if names & _SOFTMAX_OPS and names & _MATMUL_OPS:
        return "eager"
    return None


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


def analyze(
    events: Sequence[RawEvent],
    *,
    span_start_ns: int,
    span_end_ns: int,
    max_spans: int,
    on_device: bool,
    module: Any = None,
    fold_ns: int | None = None,
) -> KernelReport:
    """Kernel/op children and parent attributes for one profiled call.

    ``on_device``: the call's tensors were on a GPU, so the device activities are the kernels
    (CPU ops are their launches); otherwise the CPU ops are, ranked by their own (self) time.
    ``module``: the instrumented module that ran the call; an op span whose tensor inputs
    (:attr:`RawEvent.inputs`) include parameters of exactly one of its submodules is labelled
    with that submodule's path (:func:`module_labels`). ``fold_ns`` is not used: folding
    depends on the operators, not on their time (:mod:`.optree`); accepted for older callers.
    """
    del fold_ns
    lo, hi, offset = call_bounds(events, span_start_ns, span_end_ns)
    clock = _Clock(offset)
    cpu_ops, par, cpu_own = cpu_tree(events)
    device_ops = sorted((e for e in events if e.kind in DEVICE_KINDS), key=lambda e: e.start_ns)

    # (own ns, event) for every kernel of the call: device activities on a GPU, else CPU ops.
    work = ([(e.end_ns - e.start_ns, e) for e in device_ops] if on_device
            else list(zip(cpu_own, cpu_ops, strict=True)))
    attrs: dict[str, Any] = {
        schema.KERNEL_COUNT.key: len(work),
        schema.KERNEL_TOTAL_NS.key: sum(ns for ns, _ in work),
        schema.BACKEND.key: detect_backend((e.name for e in cpu_ops),
                                  (e.name for e in call_kernels(cpu_ops, device_ops))),
    }
    ran = ran_implementation(e.name for e in cpu_ops)
    if ran is not None:
        attrs[schema.IMPLEMENTATION_RAN.key] = ran
    attrs.update(top_kernels((ns, ev.name) for ns, ev in work))
    if on_device:
        intervals = [(e.start_ns, e.end_ns) for e in device_ops]
        attrs[schema.LAUNCH_OVERHEAD_NS.key] = max(0, (hi - lo) - covered_ns(intervals, lo, hi))
    attrs.update(_memory(events, on_device))

    ops, device = _tree(cpu_ops, par, device_ops if on_device else [], clock, span_start_ns,
                        span_end_ns)
    attrs.update(_op_attributes(ops, device, events, lo, hi, clock, on_device))
    labels = module_labels(cpu_ops, module) if module is not None else None
    children, top_folded = optree.build(ops, device, max_spans=max_spans, labels=labels)
    if top_folded:
        attrs[schema.KERNEL_FOLDED.key] = top_folded
    return KernelReport(attrs, children)


# The most the marker's start may lie before the span's start on one clock: the calling thread
# preempted between the two reads on a loaded host (5 ms was too little: every op then moved by
# the preemption, out of the nested call that ran it). Another clock is seconds to years away.
_SAME_CLOCK_NS = 1_000_000_000


def top_kernels(work: Iterable[tuple[int, str]]) -> dict[str, Any]:
    """``kernel.top_names`` / ``kernel.top_ns`` (schema keys) of (own ns, name) pairs: the
    :data:`TOP_N` names with the most time."""
    by_name: dict[str, int] = {}
    for ns, name in work:
        by_name[name] = by_name.get(name, 0) + ns
    top = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_N]
    return {schema.KERNEL_TOP_NAMES.key: [name[:MAX_NAME] for name, _ in top],
            schema.KERNEL_TOP_NS.key: [ns for _, ns in top]}


def call_bounds(events: Sequence[RawEvent], span_start_ns: int,
                span_end_ns: int) -> tuple[int, int, int]:
    """The call's start and end on the profiler's clock (its ``attnscope`` marker, else the
    span's), and the offset that maps the profiler's clock onto the span's."""
    marker = next((e for e in events if e.kind == KIND_MARKER), None)
    if marker is None:
        return span_start_ns, span_end_ns, 0
    lo = marker.start_ns
    # The profiler's own clock when it is the span's (torch 2.13: Unix-epoch ns; the marker then
    # starts just before the span's start was read): exact, where pairing the marker's start
    # with the span's start was off by the 30-100 µs between the two (measured under load).
    # Else one offset: the marker's start is the span's start.
    same = 0 <= span_start_ns - lo <= _SAME_CLOCK_NS
    return lo, marker.end_ns, 0 if same else span_start_ns - lo


def cpu_tree(events: Iterable[RawEvent]) -> tuple[list[RawEvent], list[int], list[int]]:
    """The CPU ops by start (outer first), each one's parent (:func:`optree.parents`) and its
    own time, its children's taken out."""
    cpu_ops = sorted((e for e in events if e.kind == KIND_CPU_OP),
                     key=lambda e: (e.start_ns, -e.end_ns))
    par = optree.parents([e.start_ns for e in cpu_ops], [e.end_ns for e in cpu_ops],
                         [e.thread for e in cpu_ops])
    own = [e.end_ns - e.start_ns for e in cpu_ops]
    for i, p in enumerate(par):
        if p >= 0:
            own[p] -= cpu_ops[i].end_ns - cpu_ops[i].start_ns
    return cpu_ops, par, [max(0, t) for t in own]


class _Clock:
    """The profiler's clock → the span's: one offset (the marker's start is the span's)."""

    __slots__ = ("offset",)

    def __init__(self, offset: int) -> None:
        self.offset = offset

    def __call__(self, t: int) -> int:
        return t + self.offset


def _memory(events: Sequence[RawEvent], on_device: bool) -> dict[str, int]:
    peaks = memory_peaks(events)
    out: dict[str, int] = {}
    device_peaks = [v for k, v in peaks.items() if k != "cpu"]
    if on_device and device_peaks:
        out[schema.PEAK_BYTES.key] = max(device_peaks)
        if "cpu" in peaks:
            out[schema.HOST_PEAK_BYTES.key] = peaks["cpu"]
    elif "cpu" in peaks:
        out[schema.PEAK_BYTES.key] = peaks["cpu"]
    return out


def _tree(cpu_ops: Sequence[RawEvent], par: Sequence[int], device_ops: Sequence[RawEvent],
          clock: _Clock, span_start_ns: int, span_end_ns: int,
          ) -> tuple[list[optree.Op], list[tuple[RawEvent, int, int, int]]]:
    """Ops on the span's clock, clamped into the call and into their parent op; GPU activities
    with the index of the op that launched them."""
    by_id = {e.op_id: i for i, e in enumerate(cpu_ops) if e.op_id}
    device: list[tuple[RawEvent, int, int, int]] = []
    for ev in device_ops:
        start = clock(ev.start_ns)
        # where it ran on the GPU, even after the call returned
        end = max(start, clock(ev.end_ns))
        op = by_id.get(ev.op_id, -1) if ev.op_id else -1
        device.append((ev, start, end, op))
    ops: list[optree.Op] = []
    for i, ev in enumerate(cpu_ops):
        lo, hi = ((span_start_ns, span_end_ns) if par[i] < 0
                  else (ops[par[i]].start, ops[par[i]].end))
        start = min(max(clock(ev.start_ns), lo), hi)
        end = min(max(clock(ev.end_ns), start), hi)
        ops.append(optree.Op(ev.name[:MAX_NAME], start, end, ev.kind, ev.device, ev.shapes,
                             par[i]))
    return ops, device


def _op_attributes(ops: Sequence[Any], device: Sequence[tuple[RawEvent, int, int, int]],
                   events: Sequence[RawEvent], lo: int, hi: int, clock: _Clock,
                   on_device: bool) -> dict[str, Any]:
    """Attention core / projection time, host syncs, copy time, device idle time."""
    role = opstats.roles(ops)
    out: dict[str, Any] = {}
    for name, attr in ((opstats.CORE, schema.CORE_NS),
                       (opstats.PROJECTION, schema.PROJECTION_NS)):
        if on_device:
            spans = [(s, e) for _, s, e, op in device if op >= 0 and role[op] == name]
            out[attr.key] = covered_ns(spans, min((s for s, _ in spans), default=0),
                                       max((e for _, e in spans), default=0))
        else:
            out[attr.key] = sum(op.end - op.start for i, op in enumerate(ops)
                                if op.parent < 0 and role[i] == name)
    # runtime sync calls inside the call's window (not attnscope's own sync after it)
    runtime = sorted((e.name, clock(e.start_ns), clock(e.end_ns)) for e in events
                     if e.kind == KIND_RUNTIME and lo <= e.start_ns and e.end_ns <= hi)
    syncs = opstats.host_syncs(ops, runtime)
    out[schema.HOST_SYNCS.key] = len(syncs)
    if syncs:
        counts: dict[str, int] = {}
        for name in syncs:
            counts[name] = counts.get(name, 0) + 1
        out[schema.HOST_SYNC_OPS.key] = sorted(counts, key=lambda n: (-counts[n], n))
    if on_device:
        copies = [(s, e) for ev, s, e, _ in device if ev.kind in (KIND_MEMCPY, KIND_MEMSET)]
        out[schema.MEMCPY_NS.key] = sum(e - s for s, e in copies)
        if device:
            first = min(s for _, s, _, _ in device)
            last = max(e for _, _, e, _ in device)
            out[schema.DEVICE_IDLE_NS.key] = max(0, (last - first) - covered_ns(
                [(s, e) for _, s, e, _ in device], first, last))
    else:
        out[schema.MEMCPY_NS.key] = opstats.copy_ns(ops)
    return out


def parameter_owners(module: Any) -> dict[int, frozenset[str]]:
    """Storage address → paths of the submodules of ``module`` whose own parameters live there.

    Usually one path; tied weights, or a module registered under two names, give several. The
    module's own parameters have the path ``""``.
    """
    owners: dict[int, set[str]] = {}
    try:
        for path, sub in module.named_modules(remove_duplicate=False):
            for param in sub.parameters(recurse=False):
                try:
                    ptr = int(param.untyped_storage().data_ptr())
                except Exception:  # a parameter without storage (meta, a tensor subclass)
                    continue
                if ptr:
                    owners.setdefault(ptr, set()).add(path)
    except Exception:  # not an nn.Module after all: no labels
        return {}
    return {ptr: frozenset(paths) for ptr, paths in owners.items()}


def module_labels(cpu_ops: Sequence[RawEvent], module: Any) -> dict[int, str]:
    """Op index → the one submodule that owns every parameter the op read (``q_proj``).

    Certain or nothing: an op that read no parameter, or parameters that no single submodule
    owns all of (two modules' weights, a weight tied between two modules and nothing else of
    either, the instrumented module's own parameters), has no label.
    """
    owners = parameter_owners(module)
    if not owners:
        return {}
    out: dict[int, str] = {}
    for i, ev in enumerate(cpu_ops):
        if not ev.inputs:
            continue
        found: frozenset[str] | None = None
        for ptr in ev.inputs:
            paths = owners.get(ptr)
            if paths is not None:
                found = paths if found is None else found & paths
        if found is not None and len(found) == 1:
            (path,) = found
            if path:
                out[i] = path
    return out


def _input_storages(result: Any) -> dict[int, tuple[int, ...]]:
    """CPU op correlation id → storage addresses of its tensor inputs (torch's event tree, which
    keeps them when shapes are recorded)."""
    out: dict[int, tuple[int, ...]] = {}
    todo = list(result.experimental_event_tree())
    while todo:
        ev = todo.pop()
        todo.extend(ev.children)
        inputs = getattr(ev.extra_fields, "inputs", None)
        if not inputs:
            continue
        ptrs = tuple(p for p in (getattr(t, "storage_data_ptr", None) for t in inputs)
                     if isinstance(p, int) and p)
        if ptrs:
            out[int(ev.correlation_id)] = ptrs
    return out


def from_kineto(result: Any, marker: str, *, inputs: bool = True,
                pause: Callable[[], object] = lambda: None) -> list[RawEvent]:
    """torch's kineto events as plain records (profiler clock, nanoseconds).

    Each event is read only through methods every accepted torch offers (:func:`_event_kind`),
    never the private ``activity_type()`` (torch 2.11 has none). ``inputs``: also the
    storage addresses of each CPU op's tensor inputs (for :func:`analyze`'s ``module`` labels);
    none when torch's event tree cannot say. ``pause``: called between the two passes (the
    worker hands the GIL back there).
    """
    out: list[RawEvent] = []
    try:
        storages = _input_storages(result) if inputs else {}
    except Exception:  # an older or different profiler result: no labels, same spans
        storages = {}
    pause()
    annotations: set[str] = set()
    for ev in result.events():
        has = _methods(ev)
        name = ev.name()
        device = _device_name(ev)
        if name == "[memory]":
            out.append(RawEvent(name, KIND_MEMORY, device, ev.start_ns(),
                                         ev.start_ns(), int(ev.nbytes())))
            continue
        kind = _event_kind(ev, name, device == "cpu", has)
        if kind == _ANNOTATION:
            annotations.add(name)
            kind = KIND_MARKER if name == marker and device == "cpu" else KIND_OTHER
        if kind == KIND_OTHER:
            continue
        shapes = ""
        thread = 0
        if kind == KIND_CPU_OP:
            if has.shapes:
                try:
                    # one compact string: Jaeger draws a JSON-looking list as a tree many lines
                    # tall
                    shapes = " ".join("[" + ",".join(map(str, s)) + "]"
                                      for s in ev.shapes() if s)[:256]
                except Exception:
                    shapes = ""
            if has.start_thread_id:
                try:
                    thread = int(ev.start_thread_id())
                except Exception:  # one thread then: the profiler records the calling thread only
                    thread = 0
        op_id = _op_id(ev, kind, has)
        out.append(RawEvent(name, kind, device, ev.start_ns(), ev.end_ns(), 0, shapes,
                            op_id, thread, storages.get(op_id, ()) if op_id else ()))
    # A record_function range's copy on the GPU timeline (kineto's gpu_user_annotation) has a
    # device type and the range's name; not every torch flags it as a user annotation.
    return [e for e in out if not (e.kind in DEVICE_KINDS and e.name in annotations)]


# kineto's own kinds are not read (``activity_type()`` is private, and torch 2.11 has none): each
# event's kind is told from what every accepted torch offers.
_ANNOTATION = "annotation"  # a record_function range: the marker, else dropped
# Methods read only where the event class has them: is_python_function is not in torch 2.11,
# is_user_annotation not in every accepted torch (scope stands in); made-up events lack others.
_OPTIONAL = ("is_user_annotation", "scope", "is_python_function", "correlation_id",
             "linked_correlation_id", "start_thread_id", "shapes")
_USER_SCOPE = 7  # at::RecordScope::USER_SCOPE: record_function's ranges
# CUDA runtime and driver calls (cudaLaunchKernel, cuLaunchKernelEx, cudaDeviceSynchronize) and
# HIP's: torch's ops are named aten::*, namespace::op or a class name, never so.
_RUNTIME_NAME = re.compile(r"(?:cuda|cu|hip)[A-Z]")
# CUPTI's synchronisation records (recorded only when asked for): device-side, not kernels.
_DEVICE_SYNCS = frozenset(("Stream Sync", "Event Sync", "Context Sync", "Stream Wait Event",
                           "Unknown Sync"))


class _Methods(NamedTuple):
    """Which of :data:`_OPTIONAL` the profiler's event class has, in that order."""

    is_user_annotation: bool
    scope: bool
    is_python_function: bool
    correlation_id: bool
    linked_correlation_id: bool
    start_thread_id: bool
    shapes: bool


# Per event class, looked up on its first event: one class per process (torch's), a few in tests.
_FOUND: dict[type, _Methods] = {}


def _methods(ev: Any) -> _Methods:
    cls = type(ev)
    found = _FOUND.get(cls)
    if found is None:
        if len(_FOUND) >= 16:  # bound: only made-up event classes come and go
            _FOUND.clear()
        # on the instance, not the class: a wrapper that forwards attributes answers there only
        found = _FOUND[cls] = _Methods(*(callable(getattr(ev, m, None)) for m in _OPTIONAL))
    return found


def _event_kind(ev: Any, name: str, on_cpu: bool, has: _Methods) -> str:
    """What one profiler event is, from its device type, user-annotation flag (or record scope),
    correlation links and name; the same kinds that kineto's activity type gives.

    - a record_function range (on the CPU, or its copy on a device's timeline) → annotation;
    - on a device: ``Memcpy …`` / ``Memset …`` activities, CUPTI's sync records (dropped), else a
      kernel;
    - on the CPU: a runtime/driver call (by name: a sync → :data:`KIND_RUNTIME`, else dropped);
      a Python function, one of torch's instant events (``[OutOfMemory]``), an event without a
      correlation id (kineto's overhead records) or one linked to an op (another runtime's call)
      is not an op (dropped); the rest are torch's ops.
    """
    if (has.is_user_annotation and ev.is_user_annotation()) or (
            has.scope and on_cpu and ev.scope() == _USER_SCOPE):
        return _ANNOTATION
    if not on_cpu:
        if name.startswith("Memcpy"):
            return KIND_MEMCPY
        if name.startswith("Memset"):
            return KIND_MEMSET
        return KIND_OTHER if name in _DEVICE_SYNCS else KIND_CUDA_KERNEL
    if _RUNTIME_NAME.match(name):
        return KIND_RUNTIME if name in opstats.SYNC_RUNTIME else KIND_OTHER
    if name.startswith("[") or (has.is_python_function and ev.is_python_function()):
        return KIND_OTHER
    # torch gives every op a correlation id and links none (it links runtime calls and device
    # activities to the op that launched them)
    if has.correlation_id and not ev.correlation_id():
        return KIND_OTHER
    if has.linked_correlation_id and ev.linked_correlation_id():
        return KIND_OTHER
    return KIND_CPU_OP


def _op_id(ev: Any, kind: str, has: _Methods) -> int:
    """A CPU op's correlation id; for a GPU activity, the id of the CPU op that launched it."""
    try:
        if kind == KIND_CPU_OP and has.correlation_id:
            return int(ev.correlation_id())
        if kind in DEVICE_KINDS and has.linked_correlation_id:
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
