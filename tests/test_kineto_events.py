"""Profiler events read on every accepted torch (issue 36 §1): no private ``activity_type()``.

torch 2.11's ``_KinetoEvent`` has no ``activity_type()``; every profiled CUDA call logged an
internal error there and lost its kernels, ops, backend, memory peak and host syncs. The event
doubles below expose exactly torch 2.11's methods and mimic what a CUDA profile holds on an H200
(runtime calls on the CPU with a linked correlation id, kernels and memsets on the device); a real
CPU profile (this machine's torch) is read with the methods torch 2.11 lacks hidden.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

import pytest
import torch
import torch.nn.functional as F
from torch._C._autograd import DeviceType

import attnscope
from attnscope._capture import profiler_session as _profile
from attnscope._profiles import kernels as _kernels
from attnscope._profiles import opstats
from attnscope._profiles.kernels import RawEvent
from attnscope._record.capture import PROFILE_MARKER
from attnscope.testing import capture_spans

from .support.helpers import attrs, traced_spans

# torch 2.11's _KinetoEvent, as read on the H200 that found the bug
TORCH_2_11 = frozenset((
    "concrete_inputs", "correlation_id", "cuda_elapsed_us", "device_index", "device_resource_id",
    "device_type", "dtypes", "duration_ns", "end_ns", "end_thread_id", "flops", "fwd_thread_id",
    "is_async", "is_hidden_event", "is_user_annotation", "kwinputs", "linked_correlation_id",
    "metadata_json", "name", "nbytes", "overload_name", "privateuse1_elapsed_us", "scope",
    "sequence_nr", "shapes", "stack", "start_ns", "start_thread_id",
))
# what this machine's torch adds that the parser could use
FULL = TORCH_2_11 | {"activity_type", "is_python_function"}

CUDNN_FWD = ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128_"
             "4x1x1_kernel0_0")
ELEMENTWISE = ("void at::native::vectorized_elementwise_kernel<4, "
               "at::native::FillFunctor<c10::Half>, std::array<char*, 1ul> >(int, "
               "at::native::FillFunctor<c10::Half>, "
               "std::array<char*, 1ul>)")


class Ev(NamedTuple):
    """What one event double answers."""

    name: str
    activity: str  # kineto's activity type, for the full API only
    device: str  # "cpu" or "cuda"
    start: int
    end: int
    corr: int = 0
    linked: int = 0
    scope: int = 0
    user: bool = False  # is_user_annotation()
    python: bool = False  # is_python_function()
    nbytes: int = 0
    shapes: tuple[tuple[int, ...], ...] = ()


_ANSWERS: dict[str, Callable[[Ev], Any]] = {
    "name": lambda f: f.name,
    "activity_type": lambda f: f.activity,
    "device_type": lambda f: DeviceType.CUDA if f.device == "cuda" else DeviceType.CPU,
    # CPU events: the process id; allocations on the CPU: -1
    "device_index": lambda f: 0 if f.device == "cuda" else (-1 if f.name == "[memory]" else 4242),
    "start_ns": lambda f: f.start,
    "end_ns": lambda f: f.end,
    "duration_ns": lambda f: f.end - f.start,
    "correlation_id": lambda f: f.corr,
    "linked_correlation_id": lambda f: f.linked,
    "scope": lambda f: f.scope,
    "is_user_annotation": lambda f: f.user,
    "is_python_function": lambda f: f.python,
    "nbytes": lambda f: f.nbytes,
    "shapes": lambda f: [list(s) for s in f.shapes],
    "start_thread_id": lambda f: 1,
    "end_thread_id": lambda f: 1,
    "sequence_nr": lambda f: -1,
}


def event_class(methods: Iterable[str]) -> type:
    """A class whose instances answer exactly ``methods`` (others: a plain default)."""
    ns: dict[str, Any] = {"__init__": lambda self, f: setattr(self, "f", f)}
    for m in methods:
        answer = _ANSWERS.get(m, lambda f: 0)
        ns[m] = (lambda a: lambda self: a(self.f))(answer)
    return type("KinetoEventDouble", (), ns)


class Result:
    def __init__(self, events: list[Any]) -> None:
        self._events = events

    def events(self) -> list[Any]:
        return self._events


USER = 7  # record_function's scope
# One profiled SDPA call on CUDA that zeroes a buffer, copies a tensor in, reads a value back
# and synchronises the device, with the user's own record_function around it.
CUDA_PROFILE = [
    Ev("attnscope", "user_annotation", "cpu", 1_000, 20_000, corr=1, scope=USER, user=True),
    Ev("mine", "user_annotation", "cpu", 1_050, 19_000, corr=2, scope=USER, user=True),
    Ev("torch/nn/functional.py(6000): scaled_dot_product_attention", "python_function", "cpu",
       1_090, 8_950, python=True),
    Ev("aten::scaled_dot_product_attention", "cpu_op", "cpu", 1_100, 9_000, corr=3,
       shapes=((1, 8, 128, 64),) * 3),
    Ev("aten::_scaled_dot_product_cudnn_attention", "cpu_op", "cpu", 1_200, 8_800, corr=4,
       shapes=((1, 8, 128, 64),) * 3),
    Ev("[memory]", "cpu_instant_event", "cuda", 1_250, 1_250, nbytes=4096),
    Ev("cudaLaunchKernel", "cuda_runtime", "cpu", 1_300, 1_500, corr=9001, linked=4),
    Ev("Activity Buffer Request", "overhead", "cpu", 1_400, 1_450),
    Ev("cuLaunchKernelEx", "cuda_driver", "cpu", 1_600, 1_800, corr=9002, linked=4),
    Ev(CUDNN_FWD, "kernel", "cuda", 2_000, 12_000, corr=9001, linked=4),
    Ev("attnscope", "gpu_user_annotation", "cuda", 2_000, 13_000, corr=1, user=True),
    Ev("mine", "gpu_user_annotation", "cuda", 2_000, 12_900, corr=2),  # not flagged on some torch
    Ev("[memory]", "cpu_instant_event", "cuda", 8_000, 8_000, nbytes=-4096),
    Ev("aten::zero_", "cpu_op", "cpu", 9_100, 9_900, corr=5, shapes=((256,),)),
    Ev("aten::fill_", "cpu_op", "cpu", 9_150, 9_850, corr=6, shapes=((256,), ())),
    Ev("[memory]", "cpu_instant_event", "cpu", 9_160, 9_160, nbytes=64),
    Ev("cudaMemsetAsync", "cuda_runtime", "cpu", 9_200, 9_300, corr=9003, linked=6),
    Ev(ELEMENTWISE, "kernel", "cuda", 12_100, 12_500, corr=9002, linked=4),
    Ev("Memset (Device)", "gpu_memset", "cuda", 12_600, 12_700, corr=9003, linked=6),
    Ev("aten::copy_", "cpu_op", "cpu", 10_000, 10_800, corr=7, shapes=((256,), (256,))),
    Ev("cudaMemcpyAsync", "cuda_runtime", "cpu", 10_100, 10_700, corr=9004, linked=7),
    Ev("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", "cuda", 12_800, 13_000, corr=9004,
       linked=7),
    Ev("cudaDeviceSynchronize", "cuda_runtime", "cpu", 13_000, 15_000, corr=9005, linked=1),
    Ev("aten::item", "cpu_op", "cpu", 15_100, 16_000, corr=8),
    Ev("aten::_local_scalar_dense", "cpu_op", "cpu", 15_200, 15_900, corr=9),
    Ev("cudaMemcpyAsync", "cuda_runtime", "cpu", 15_300, 15_400, corr=9006, linked=9),
    Ev("cudaStreamSynchronize", "cuda_runtime", "cpu", 15_400, 15_800, corr=9007, linked=9),
    Ev("Memcpy DtoH (Device -> Pageable)", "gpu_memcpy", "cuda", 15_350, 15_390, corr=9006,
       linked=9),
]
# (name, kind, device, op id) of each event the parser keeps
EXPECTED = [
    ("attnscope", "marker", "cpu", 0),
    ("aten::scaled_dot_product_attention", "cpu_op", "cpu", 3),
    ("aten::_scaled_dot_product_cudnn_attention", "cpu_op", "cpu", 4),
    ("[memory]", "memory", "cuda:0", 0),
    (CUDNN_FWD, "cuda_kernel", "cuda:0", 4),
    ("[memory]", "memory", "cuda:0", 0),
    ("aten::zero_", "cpu_op", "cpu", 5),
    ("aten::fill_", "cpu_op", "cpu", 6),
    ("[memory]", "memory", "cpu", 0),
    (ELEMENTWISE, "cuda_kernel", "cuda:0", 4),
    ("Memset (Device)", "memset", "cuda:0", 6),
    ("aten::copy_", "cpu_op", "cpu", 7),
    ("Memcpy HtoD (Pageable -> Device)", "memcpy", "cuda:0", 7),
    ("cudaDeviceSynchronize", "runtime", "cpu", 0),
    ("aten::item", "cpu_op", "cpu", 8),
    ("aten::_local_scalar_dense", "cpu_op", "cpu", 9),
    ("cudaStreamSynchronize", "runtime", "cpu", 0),
    ("Memcpy DtoH (Device -> Pageable)", "memcpy", "cuda:0", 9),
]


def activity_kinds(events: Iterable[Any], marker: str) -> list[tuple[str, str]]:
    """(name, kind) of the kept events as kineto's activity type says (the parser before issue
    36 read ``activity_type()``): the reference the portable reading must match."""
    table = {"cpu_op": "cpu_op", "kernel": "cuda_kernel", "gpu_memcpy": "memcpy",
             "gpu_memset": "memset"}
    out = []
    for ev in events:
        name, activity = ev.name(), ev.activity_type()
        if name == "[memory]":
            kind = "memory"
        elif activity == "user_annotation" and name == marker:
            kind = "marker"
        elif activity in ("cuda_runtime", "cuda_driver") and name in opstats.SYNC_RUNTIME:
            kind = "runtime"
        else:
            kind = table.get(activity, "other")
        if kind != "other":
            out.append((name, kind))
    return out


def parse(methods: Iterable[str], profile: list[Ev] = CUDA_PROFILE) -> list[RawEvent]:
    cls = event_class(methods)
    return _kernels.from_kineto(Result([cls(f) for f in profile]), "attnscope")


def report(events: list[RawEvent]) -> _kernels.KernelReport:
    return _kernels.analyze(events, span_start_ns=1_000, span_end_ns=20_000, max_spans=64,
                            on_device=True)


# ---- event doubles: a CUDA profile --------------------------------------------------------------

def test_a_cuda_profile_with_the_full_event_api() -> None:
    events = parse(FULL)
    assert [(e.name, e.kind, e.device, e.op_id) for e in events] == EXPECTED
    cls = event_class(FULL)
    assert [(e.name, e.kind) for e in events] == activity_kinds(
        [cls(f) for f in CUDA_PROFILE], "attnscope")
    a = report(events).attributes
    assert a["backend"] == "cudnn"
    assert a["host_syncs"] == 2
    assert a["host_sync_ops"] == ["aten::item", "cudaDeviceSynchronize"]
    assert a["kernel.count"] == 5  # 2 kernels, a memset, 2 memcpys
    assert a["memory.peak_bytes"] == 4096 and a["memory.host_peak_bytes"] == 64


@pytest.mark.parametrize("missing", [
    ("activity_type",),
    ("is_python_function",),
    ("is_user_annotation",),
    ("scope",),
    ("activity_type", "is_python_function"),  # torch 2.11
    ("activity_type", "is_python_function", "is_user_annotation"),
], ids="-".join)
def test_the_same_spans_without_each_optional_method(missing: tuple[str, ...]) -> None:
    full = parse(FULL)
    events = parse(FULL - set(missing))
    assert events == full
    got, want = report(events), report(full)
    assert got.attributes == want.attributes
    assert got.children == want.children
    assert [c.name for c in got.children if c.name == CUDNN_FWD]


def test_torch_2_11_events_give_the_profile_tier_its_kernels() -> None:
    # what the H200 logged as an internal error for every profiled call: now the call's kernels,
    # backend, host syncs and memory peak
    a = report(parse(TORCH_2_11)).attributes
    assert a["backend"] == "cudnn" and a["kernel.count"] == 5
    assert a["kernel.top_names"][0] == CUDNN_FWD
    assert a["host_sync_ops"] == ["aten::item", "cudaDeviceSynchronize"]
    assert a["memory.peak_bytes"] == 4096


def test_a_device_copy_of_the_marker_is_never_the_marker() -> None:
    # a torch that flags the GPU timeline's copy of a record_function range as a user annotation:
    # the range on the device must not set the call's window
    events = parse(TORCH_2_11 - {"scope"})
    assert [e.device for e in events if e.kind == "marker"] == ["cpu"]
    assert not [e for e in events if e.name in ("attnscope", "mine") and e.kind != "marker"]


def test_without_links_kernels_still_parse() -> None:
    # an event class without linked_correlation_id: the kernels are kept, unlinked (they hang
    # under the call's span); the ops still name the backend
    events = parse(TORCH_2_11 - {"linked_correlation_id"})
    kernels = [e for e in events if e.kind == "cuda_kernel"]
    assert [e.name for e in kernels] == [CUDNN_FWD, ELEMENTWISE]
    assert all(e.op_id == 0 for e in kernels)
    assert report(events).attributes["backend"] == "cudnn"


def test_methods_are_looked_up_once_per_event_class(monkeypatch: pytest.MonkeyPatch) -> None:
    cls = event_class(TORCH_2_11)
    first = _kernels.from_kineto(Result([cls(f) for f in CUDA_PROFILE]), "attnscope")

    def again(*found: bool) -> Any:
        raise AssertionError("looked up again")

    monkeypatch.setattr(_kernels, "_Methods", again)
    assert _kernels.from_kineto(Result([cls(f) for f in CUDA_PROFILE]), "attnscope") == first


# ---- a real CPU profile, read as torch 2.11 would offer it --------------------------------------

def view(allowed: frozenset[str]) -> type:
    """A class that shows a real kineto event through ``allowed`` methods only."""

    def getattr_(self: Any, name: str) -> Any:
        if name not in allowed:
            raise AttributeError(name)
        return getattr(self._ev, name)

    return type("KinetoEventView", (), {"__init__": lambda self, ev: setattr(self, "_ev", ev),
                                       "__getattr__": getattr_})


class ViewResult:
    def __init__(self, result: Any, allowed: frozenset[str]) -> None:
        self._result, self._cls = result, view(allowed)

    def events(self) -> list[Any]:
        return [self._cls(ev) for ev in self._result.events()]

    def experimental_event_tree(self) -> Any:
        return self._result.experimental_event_tree()


def _profiled_results(device: str = "cpu") -> tuple[list[Any], list[Any]]:
    """Kineto results and spans of profiled calls: SDPA, eager attention with a value read back
    and a nonzero, under the user's own record_function."""
    assert _profile.warm_up()
    results: list[Any] = []
    real = _kernels.from_kineto

    def keep(result: Any, marker: str, **kw: Any) -> list[RawEvent]:
        results.append(result)
        return real(result, marker, **kw)

    @attnscope.trace
    def eager(q: torch.Tensor) -> torch.Tensor:
        with torch.profiler.record_function("mine"):
            w = torch.softmax(q @ q.transpose(-1, -2), dim=-1)
            if (w > 0.5).nonzero().numel() and w.sum().item() > 0:
                w = w * 1.0
            return w @ q

    @attnscope.trace
    def fused(q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, is_causal=True)

    q = torch.randn(1, 2, 16, 8, device=device)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_kernels, "from_kineto", keep)
        with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
            eager(q)
            fused(q)
    return results, traced_spans(spans)


def test_a_real_cpu_profile_reads_the_same_without_activity_type() -> None:
    results, spans = _profiled_results()
    assert len(results) == 2 and len(spans) == 2
    for result, span in zip(results, spans, strict=True):
        events = _kernels.from_kineto(result, PROFILE_MARKER)
        if hasattr(torch._C._autograd._KinetoEvent, "activity_type"):
            # the portable reading is kineto's own activity type, event by event
            assert [(e.name, e.kind) for e in events] == activity_kinds(result.events(),
                                                                        PROFILE_MARKER)
        assert {"marker", "cpu_op", "memory"} <= {e.kind for e in events}
        want = _kernels.analyze(events, span_start_ns=span.start_time, span_end_ns=span.end_time,
                                max_spans=64, on_device=False)
        for allowed in (TORCH_2_11, TORCH_2_11 - {"is_user_annotation"}):
            seen = _kernels.from_kineto(ViewResult(result, allowed), PROFILE_MARKER)
            assert seen == events
            got = _kernels.analyze(seen, span_start_ns=span.start_time,
                                   span_end_ns=span.end_time, max_spans=64, on_device=False)
            assert got == want
    eager_events = _kernels.from_kineto(results[0], PROFILE_MARKER)
    # the user's record_function is neither an op nor the marker
    assert "mine" not in {e.name for e in eager_events}


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not hasattr(torch._C._autograd._KinetoEvent, "activity_type"),
                    reason="needs a torch whose events have activity_type()")
def test_a_real_cuda_profile_reads_as_kineto_says() -> None:
    # on a GPU: the portable reading gives, event by event, kineto's own kinds, and kernels
    results, _ = _profiled_results("cuda")
    for result in results:
        events = _kernels.from_kineto(result, PROFILE_MARKER)
        assert [(e.name, e.kind) for e in events] == activity_kinds(result.events(),
                                                                    PROFILE_MARKER)
        assert "cuda_kernel" in {e.kind for e in events}


def test_the_profile_tier_works_on_a_torch_without_activity_type(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # the worker reads the profile through torch 2.11's methods only: before the fix, an internal
    # error ('profile-parse', no attribute 'activity_type') and a timing-tier span
    real = _kernels.from_kineto

    def as_torch_2_11(result: Any, marker: str, **kw: Any) -> list[RawEvent]:
        return real(ViewResult(result, TORCH_2_11), marker, **kw)

    assert _profile.warm_up()
    monkeypatch.setattr(_kernels, "from_kineto", as_torch_2_11)
    q = torch.randn(1, 2, 16, 8)

    @attnscope.trace
    def eager(q: torch.Tensor) -> torch.Tensor:
        w = torch.softmax(q @ q.transpose(-1, -2), dim=-1)
        w.sum().item()
        return w @ q

    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
        eager(q)
    (span,) = traced_spans(spans)
    a = attrs(span)
    assert a["attnscope.tier"] == "profile"
    assert a["attnscope.backend"] == "math"
    assert list(a["attnscope.host_sync_ops"]) == ["aten::item"]
    assert a["attnscope.kernel.count"] > 0
    assert len(spans) > 1  # op child spans
