"""Profile tier: torch.profiler around one sampled call → kernel child spans (CPU)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnscope
from attnscope._capture import profiler_session as _profile
from attnscope._profiles import kernels as _kernels
from attnscope._profiles import session as _session
from attnscope._profiles.kernels import RawEvent
from attnscope._record.capture import PROFILE_MARKER, Capture
from attnscope._runtime import runtime
from attnscope.testing import capture_spans

from .support.helpers import attrs, naive, sdpa
from .support.helpers import children_of as _children
from .support.helpers import descendants_of as _descendants
from .support.helpers import traced_spans as _parents

PROFILE = {"profile_rate": 1.0, "profile_max_per_minute": 1000.0}
Q = torch.randn(2, 4, 64, 32)


@pytest.fixture(autouse=True)
def _warm() -> Iterator[None]:
    assert _profile.warm_up(), "the profiler must warm up on CPU"
    yield
    assert runtime.profiler.active is None and not runtime.profiler.session_lock.locked(), \
        "a session leaked"


def _skips() -> dict[str, int]:
    return {k: v for k, v in _profile.stats().items() if k.startswith("skipped_")}


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in after if after[k] != before[k]}


# ---- end to end on CPU ---------------------------------------------------------------------------

def test_children_exist_inside_parent_and_ordered() -> None:
    with capture_spans(**PROFILE) as spans:
        sdpa(Q, Q, Q)
    (parent,) = _parents(spans)
    a = attrs(parent)
    assert a["attnscope.tier"] == "profile"
    kids = _descendants(spans, parent)  # op spans nest: aten::scaled_dot_product_attention > ...
    assert kids and len(kids) <= a["attnscope.kernel.count"]
    starts = [k.start_time for k in _children(spans, parent)]
    assert starts == sorted(starts)
    for kid in kids:
        assert parent.start_time <= kid.start_time <= kid.end_time <= parent.end_time
        ka = attrs(kid)
        assert ka["attnscope.kernel.kind"] == "cpu_op"
        assert ka["attnscope.kernel.device"] == "cpu"
        assert len(kid.name) <= 128
    names = [k.name for k in kids] + [n for k in kids
                                      for n in attrs(k).get("attnscope.kernel.inner", ())]
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names
    assert a["attnscope.kernel.total_ns"] > 0
    assert a["attnscope.kernel.total_ns"] <= parent.end_time - parent.start_time
    assert (list(a["attnscope.kernel.top_names"])[0]
            == "aten::_scaled_dot_product_flash_attention_for_cpu")
    assert len(a["attnscope.kernel.top_names"]) == len(a["attnscope.kernel.top_ns"])
    assert list(a["attnscope.kernel.top_ns"]) == sorted(a["attnscope.kernel.top_ns"], reverse=True)
    assert "attnscope.launch_overhead_ns" not in a  # GPU only


def test_output_identical_with_and_without_profiling() -> None:
    expected = F.scaled_dot_product_attention(Q, Q, Q)
    with capture_spans(**PROFILE) as spans:
        got = sdpa(Q, Q, Q)
    assert _parents(spans)[0].attributes["attnscope.tier"] == "profile"
    assert torch.equal(got, expected)


def test_kernel_span_cap_keeps_longest_and_sums_the_rest() -> None:
    with capture_spans(max_kernel_spans=2, **PROFILE) as spans:
        naive(Q, Q, Q)
    (parent,) = _parents(spans)
    a = attrs(parent)
    kids = _descendants(spans, parent)
    assert len(kids) == 2  # QK matmul, softmax, PV matmul: more than 2 after folding
    assert a["attnscope.kernel.count"] > 2
    (other,) = [k for k in kids if k.name == "other"]
    oa = attrs(other)
    # ops folded before the cap (views, tiny ops) are in the count neither of `other` nor of spans
    folded = sum(attrs(k).get("attnscope.kernel.folded", 0) for k in [parent, *kids])
    folded += sum(len(attrs(k).get("attnscope.kernel.inner", ())) for k in kids)  # wrapped ops
    assert oa["attnscope.kernel.count"] + folded == a["attnscope.kernel.count"] - 1
    kept_self = [attrs(k)["attnscope.kernel.self_ns"] for k in kids if k.name != "other"]
    assert sum(kept_self) <= a["attnscope.kernel.total_ns"]
    assert oa["attnscope.kernel.total_ns"] <= a["attnscope.kernel.total_ns"]
    assert parent.start_time <= other.start_time <= other.end_time <= parent.end_time


@pytest.mark.parametrize(
    ("fn", "backend_ctx", "expected"),
    [
        (sdpa, None, "flash"),  # default CPU path: _scaled_dot_product_flash_attention_for_cpu
        (sdpa, SDPBackend.MATH, "math"),
        (naive, None, "math"),
    ],
    ids=["sdpa-default", "sdpa-math", "matmul-softmax-matmul"],
)
def test_backend_detection_on_cpu(fn: Any, backend_ctx: Any, expected: str) -> None:
    with capture_spans(**PROFILE) as spans:
        if backend_ctx is None:
            fn(Q, Q, Q)
        else:
            with sdpa_kernel(backend_ctx):
                fn(Q, Q, Q)
    (parent,) = _parents(spans)
    assert attrs(parent)["attnscope.backend"] == expected


def test_profile_dir_writes_chrome_trace(tmp_path: Any) -> None:
    import json

    with capture_spans(profile_dir=str(tmp_path / "traces"), **PROFILE) as spans:
        sdpa(Q, Q, Q)
    (parent,) = _parents(spans)
    path = attrs(parent)["attnscope.profile.path"]
    with open(path) as fh:
        trace = json.load(fh)
    names = {ev.get("name") for ev in trace["traceEvents"]}
    assert "aten::scaled_dot_product_attention" in names
    assert os.listdir(tmp_path / "traces") == [os.path.basename(path)]


def test_profile_dir_traces_keep_no_argument_values(tmp_path: Any) -> None:
    """The profiler records scalar arguments ("Concrete Inputs"): attnscope keeps only shapes."""
    @attnscope.trace
    def scaled(q: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, q, q, scale=0.0123456789, dropout_p=0.0)

    with capture_spans(profile_dir=str(tmp_path), **PROFILE) as spans:
        scaled(Q)
    (parent,) = _parents(spans)
    with open(attrs(parent)["attnscope.profile.path"]) as fh:
        text = fh.read()
    assert "Input Dims" in text  # shapes are kept
    assert "Concrete Inputs" not in text and "0.0123456789" not in text


def test_profile_dir_set_while_the_worker_runs_applies_at_once(tmp_path: Any) -> None:
    with capture_spans(**PROFILE) as spans:
        sdpa(Q, Q, Q)
        assert attnscope.flush(timeout_s=10)
        attnscope.configure(profile_dir=str(tmp_path))  # not a pipeline setting: no restart
        sdpa(Q, Q, Q)
    first, second = _parents(spans)
    assert "attnscope.profile.path" not in attrs(first)
    assert attrs(second)["attnscope.profile.path"].startswith(str(tmp_path))


@pytest.mark.internal_errors("profile-parse")
def test_parse_failure_still_emits_the_span(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(result: Any, marker: str, **kw: Any) -> list[RawEvent]:
        raise RuntimeError("unexpected event layout")

    monkeypatch.setattr(_kernels, "from_kineto", broken)
    with capture_spans(**PROFILE) as spans:
        sdpa(Q, Q, Q)
    (parent,) = _parents(spans)
    assert attrs(parent)["attnscope.tier"] == "timing"
    assert "attnscope.kernel.count" not in attrs(parent)


def test_calling_thread_does_not_parse(monkeypatch: pytest.MonkeyPatch) -> None:
    parsed_on: list[int] = []
    real = _kernels.from_kineto

    def spy(result: Any, marker: str, **kw: Any) -> list[RawEvent]:
        parsed_on.append(threading.get_ident())
        return real(result, marker, **kw)

    monkeypatch.setattr(_kernels, "from_kineto", spy)
    with capture_spans(**PROFILE) as spans:
        sdpa(Q, Q, Q)
    assert _parents(spans)[0].attributes["attnscope.tier"] == "profile"
    assert parsed_on and threading.get_ident() not in parsed_on


# ---- one profiler per process ------------------------------------------------------------------

def test_users_profiler_active_skips_gracefully() -> None:
    before = _skips()
    with capture_spans(**PROFILE) as spans:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as user:
            out = sdpa(Q, Q, Q)
        sdpa(Q, Q, Q)  # after the user's profiler: profiled again
    tiers = [attrs(p)["attnscope.tier"] for p in _parents(spans)]
    assert tiers == ["timing", "profile"]
    assert _delta(before, _skips()) == {"skipped_user_profiler": 1}
    names = {e.name for e in user.events()}
    assert "aten::scaled_dot_product_attention" in names  # the user's profile is intact
    assert PROFILE_MARKER not in names
    assert torch.equal(out, F.scaled_dot_product_attention(Q, Q, Q))


def test_users_scheduled_profiler_in_warmup_phase_is_respected() -> None:
    # A second kineto session while a user's schedule is between prepare and start crashes the
    # process; the hooks must see the prepared session.
    got: list[int] = []
    schedule = torch.profiler.schedule(wait=1, warmup=1, active=1, repeat=1)
    with capture_spans(**PROFILE) as spans:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                    schedule=schedule,
                                    on_trace_ready=lambda p: got.append(len(p.events()))) as user:
            for _ in range(4):
                sdpa(Q, Q, Q)
                user.step()
        sdpa(Q, Q, Q)
    tiers = [attrs(p)["attnscope.tier"] for p in _parents(spans)]
    # wait: nothing prepared yet; warmup (prepared) and active: the user's; then done
    assert tiers == ["profile", "timing", "timing", "profile", "profile"]
    assert got and got[0] > 0


def test_users_profiler_started_inside_a_traced_call() -> None:
    holder: list[Any] = []

    @attnscope.trace
    def starts_profiler(q: torch.Tensor) -> torch.Tensor:
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
        prof.__enter__()
        holder.append(prof)
        return q * 2

    with capture_spans(**PROFILE) as spans:
        starts_profiler(Q)
        torch.mm(torch.ones(3, 3), torch.ones(3, 3))
        holder[0].__exit__(None, None, None)
    assert "aten::mm" in {e.name for e in holder[0].events()}
    (parent,) = _parents(spans)
    assert "attnscope.kernel.count" not in attrs(parent)  # aborted: no kernel data claimed
    assert attrs(parent)["attnscope.tier"] == "timing"


def test_two_threads_one_profiles_the_other_times() -> None:
    barrier = threading.Barrier(2, timeout=10)

    @attnscope.trace
    def meet(q: torch.Tensor) -> torch.Tensor:
        barrier.wait()  # both calls are inside their captures at the same time
        out = torch.softmax(q @ q.transpose(-1, -2), dim=-1) @ q
        barrier.wait()
        return out

    def run() -> None:
        with attnscope.sampling(force=True, profile=True):
            meet(Q)

    before = _skips()
    with capture_spans(**PROFILE) as spans:
        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
    tiers = sorted(attrs(p)["attnscope.tier"] for p in _parents(spans))
    assert tiers == ["profile", "timing"]
    assert _delta(before, _skips()) == {"skipped_busy": 1}
    (profiled,) = [p for p in _parents(spans) if attrs(p)["attnscope.tier"] == "profile"]
    # ops are recorded on the profiling thread only: one matmul-softmax-matmul, not two
    names = [k.name for k in _descendants(spans, profiled)]
    assert names.count("aten::_softmax") <= 1 and names.count("aten::softmax") <= 1


@pytest.mark.internal_errors("profile-start")
def test_kineto_refusal_falls_back_to_timing(monkeypatch: pytest.MonkeyPatch) -> None:
    # refused once: the session prepared before the refusal is finished by enabling it then (on
    # torch 2.11 a prepared session left behind makes every later prepare fail)
    enable, refused = runtime.profiler.entry_points["enable"], []

    def refuse(*args: Any) -> Any:
        if not refused:
            refused.append(True)
            raise RuntimeError("kineto says no")
        return enable(*args)

    monkeypatch.setitem(runtime.profiler.entry_points, "enable", refuse)
    before = _skips()
    with capture_spans(**PROFILE) as spans:
        out = sdpa(Q, Q, Q)
    monkeypatch.undo()
    assert [attrs(p)["attnscope.tier"] for p in _parents(spans)] == ["timing"]
    assert _delta(before, _skips()) == {"skipped_error": 1}
    assert torch.equal(out, F.scaled_dot_product_attention(Q, Q, Q))
    assert not torch._C._autograd._profiler_enabled()
    with capture_spans(**PROFILE) as spans:
        sdpa(Q, Q, Q)
    assert [attrs(p)["attnscope.tier"] for p in _parents(spans)] == ["profile"]


def test_cuda_refusal_at_warm_up_leaves_cpu_profiling_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(runtime.profiler.broken, True, "RuntimeError('no CUPTI')")
    monkeypatch.setattr(runtime.profiler, "warm_cuda", True)
    before = _skips()
    cap = Capture()
    assert _profile.start(cap, torch.device("cuda", 0)) is False and cap.profile is None
    assert _delta(before, _skips()) == {"skipped_error": 1}
    with capture_spans(**PROFILE) as spans:
        sdpa(Q, Q, Q)
    assert [attrs(p)["attnscope.tier"] for p in _parents(spans)] == ["profile"]


def test_cold_profiler_times_the_call_and_warms_up_elsewhere(
        monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[Any] = []
    monkeypatch.setattr(runtime.profiler, "warm_cpu", False)
    monkeypatch.setattr(_profile, "warm_up_async", lambda cuda=None: asked.append(cuda))
    before = _skips()
    with capture_spans(**PROFILE) as spans:
        sdpa(Q, Q, Q)
    assert [attrs(p)["attnscope.tier"] for p in _parents(spans)] == ["timing"]
    assert _delta(before, _skips()) == {"skipped_warming": 1}
    assert asked == [False]


def test_warm_up_runs_on_the_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []
    monkeypatch.setattr(_profile, "warm_up",
                        lambda cuda=None: seen.append(threading.current_thread().name) or True)
    with capture_spans(**PROFILE):
        sdpa(Q, Q, Q)
    assert seen == ["attnscope-worker"]


def test_user_exception_propagates_and_session_closes() -> None:
    @attnscope.trace
    def boom(q: torch.Tensor) -> torch.Tensor:
        torch.relu(q.repeat(64, 1, 1, 1))  # long enough not to be folded
        raise ValueError("user error")

    with capture_spans(**PROFILE) as spans:
        with pytest.raises(ValueError, match="user error"):
            boom(Q)
    (parent,) = _parents(spans)
    assert attrs(parent)["attnscope.tier"] == "profile"
    assert "aten::relu" in [k.name for k in _descendants(spans, parent)]


@attnscope.trace
def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           attn_mask: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def _interrupted_then_profiled(with_mask: bool = False) -> None:
    """A profiled call the (patched) interrupt ends: it propagates, the lock is free and kineto
    off; the next call is profiled again. ``with_mask``: a call whose capture keeps a tensor (a
    call of shapes alone has nothing for ``keep_summary`` to weigh, and skips it)."""
    def call() -> Any:
        if with_mask:
            return masked(Q, Q, Q, torch.ones(Q.shape[-2], Q.shape[-2], dtype=torch.bool))
        return sdpa(Q, Q, Q)

    with capture_spans(**PROFILE) as spans:
        with pytest.raises(KeyboardInterrupt):
            call()
        assert not runtime.profiler.session_lock.locked()
        assert not torch._C._autograd._profiler_enabled()
        call()
    assert [attrs(p)["attnscope.tier"] for p in _parents(spans)][-1] == "profile"


@pytest.mark.parametrize("entry_point", ["enable", "disable"])
def test_ctrl_c_inside_start_or_stop_releases_the_profiler(
    entry_point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt landing while attnscope starts or stops a session propagates, and
    leaves neither the lock held nor kineto running: the next call is profiled again."""
    real = runtime.profiler.entry_points[entry_point]
    fired: list[bool] = []

    def interrupted(*args: Any) -> Any:
        result = real(*args)  # the signal lands right after torch's call returned
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt
        return result

    monkeypatch.setitem(runtime.profiler.entry_points, entry_point, interrupted)
    _interrupted_then_profiled()


@pytest.mark.parametrize("where", ["keep_summary", "current.set"])
def test_ctrl_c_between_the_sessions_start_and_the_call_releases_the_profiler(
    where: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A KeyboardInterrupt landing in attnscope's own code after the session started and before
    the user's call ran (CI: 1 of 5 SIGINTs in a profiled loop left the lock held and kineto on)
    propagates and stops the session."""
    from attnscope._capture import retain, wrapper

    fired: list[bool] = []

    def once() -> None:
        if not fired:
            fired.append(True)
            raise KeyboardInterrupt

    if where == "keep_summary":
        kept = retain.keep_summary

        def keep(cap: Any) -> None:
            kept(cap)
            once()

        monkeypatch.setattr(retain, "keep_summary", keep)
    else:
        real = wrapper.current

        class Current:
            def set(self, value: Any) -> Any:
                once()
                return real.set(value)

            def __getattr__(self, name: str) -> Any:
                return getattr(real, name)

        monkeypatch.setattr(wrapper, "current", Current())
    _interrupted_then_profiled(with_mask=where == "keep_summary")
    assert fired


# ---- parsing on made-up events (what a GPU run produces) -----------------------------------------

def _ev(name: str, kind: str, start: int, end: int, device: str = "cpu",
        nbytes: int = 0) -> RawEvent:
    return RawEvent(name, kind, device, start, end, nbytes)


def _gpu_events() -> list[RawEvent]:
    base = 5_000_000  # the profiler's own clock
    return [
        _ev("attnscope", "marker", base, base + 100),
        _ev("aten::scaled_dot_product_attention", "cpu_op", base + 5, base + 90),
        _ev("aten::_scaled_dot_product_flash_attention", "cpu_op", base + 10, base + 80),
        _ev("cudaLaunchKernel", "other", base + 20, base + 30),
        _ev("Memset (Device)", "memset", base + 40, base + 45, "cuda:0"),
        _ev("void pytorch_flash::flash_fwd_kernel<...>", "cuda_kernel", base + 50, base + 250,
            "cuda:0"),
        _ev("[memory]", "memory", base + 15, base + 15, "cuda:0", 4096),
        _ev("[memory]", "memory", base + 16, base + 16, "cuda:0", 1024),
        _ev("[memory]", "memory", base + 70, base + 70, "cuda:0", -1024),
        _ev("[memory]", "memory", base + 17, base + 17, "cpu", 64),
    ]


def test_gpu_kernels_keep_their_device_time() -> None:
    report = _kernels.analyze(_gpu_events(), span_start_ns=10**18, span_end_ns=10**18 + 100,
                              max_spans=64, on_device=True)
    a = report.attributes
    assert a["backend"] == "flash"
    assert a["kernel.count"] == 2  # memset + kernel; CPU ops are launches on a GPU call
    assert a["kernel.total_ns"] == 205
    assert a["kernel.top_names"][0].startswith("void pytorch_flash::flash_fwd_kernel")
    # CPU window [0, 100) of the marker; device busy [40, 45) and [50, 100) inside it
    assert a["launch_overhead_ns"] == 100 - 5 - 50
    assert a["memory.peak_bytes"] == 5120
    assert a["memory.host_peak_bytes"] == 64
    kernel = next(c for c in report.children if c[3]["attnscope.kernel.kind"] == "cuda_kernel")
    # the marker maps to the span start; the kernel ends after the call returned, as it ran
    assert (kernel[1], kernel[2]) == (10**18 + 50, 10**18 + 250)
    assert kernel[3]["attnscope.kernel.device"] == "cuda:0"
    assert all(c[0] != "cudaLaunchKernel" for c in report.children)


def test_cap_prefers_device_work_and_sums_into_other() -> None:
    events = [_ev("attnscope", "marker", 0, 1000)]
    events += [_ev(f"op{i}", "cpu_op", 10 * i, 10 * i + 9) for i in range(20)]
    events += [_ev(f"k{i}", "cuda_kernel", 500 + 10 * i, 500 + 10 * i + 1 + i, "cuda:0")
               for i in range(5)]
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=1000, max_spans=4,
                              on_device=True, fold_ns=0)
    names = [c[0] for c in report.children]
    assert len(names) == 4 and "other" in names
    assert {"k0", "k1", "k2"} == set(names) - {"other"}  # device work first, in launch order
    other = next(c for c in report.children if c[0] == "other")
    assert other[3]["attnscope.kernel.count"] == 22
    # the longest left out: 9 ns ops (ties by name), before the 4 ns and 5 ns kernels
    assert other[3]["attnscope.kernel.top"] == [f"op{i}: 9 ns" for i in (0, 1, 10, 11, 12)]
    assert [c[1] for c in report.children] == sorted(c[1] for c in report.children)


def _kept(own: list[int]) -> tuple[set[str], dict[str, Any]]:
    events = [_ev(f"op{i}", "cpu_op", 100 * i, 100 * i + ns) for i, ns in enumerate(own)]
    events.append(_ev("inner", "cpu_op", 1, 2))  # inside op0: deeper than every other op
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=1000, max_spans=4,
                              on_device=False, fold_ns=0)
    (other,) = [c for c in report.children if c[0] == "other"]
    return {c[0] for c in report.children if c[0] != "other"}, other[3]


def test_cap_keeps_ops_by_their_place_never_by_their_time() -> None:
    own = [5, 50, 7, 90, 1, 60, 3, 2, 40, 8]
    kept, other = _kept(own)
    assert kept == {"op0", "op1", "op2"}  # the outermost, in the order they ran
    # the same code with other durations keeps the same spans (issue 24: one shape per operator)
    assert _kept(list(reversed(own)))[0] == kept
    assert _kept([1000 // len(own) - 1] * len(own))[0] == kept
    assert other["attnscope.kernel.count"] == 8  # op3..op9 and the nested op
    assert other["attnscope.kernel.total_ns"] == sum(own[3:]) + 1  # the nested op inside op0
    # what it left out that took longest is named, with its time
    assert other["attnscope.kernel.top"] == ["op3: 90 ns", "op5: 60 ns", "op8: 40 ns",
                                             "op9: 8 ns", "op6: 3 ns"]


def test_cpu_ops_are_clamped_into_the_parent() -> None:
    events = [_ev("attnscope", "marker", 100, 200), _ev("aten::mm", "cpu_op", 90, 230)]
    report = _kernels.analyze(events, span_start_ns=1000, span_end_ns=1090, max_spans=8,
                              on_device=False, fold_ns=0)
    ((_, start, end, _, _),) = report.children
    assert 1000 <= start <= end <= 1090


def test_self_time_of_nested_ops() -> None:
    events = [
        _ev("outer", "cpu_op", 0, 100),
        _ev("inner", "cpu_op", 10, 40),
        _ev("leaf", "cpu_op", 15, 20),
        _ev("inner2", "cpu_op", 50, 60),
    ]
    report = _kernels.analyze(events, span_start_ns=0, span_end_ns=100, max_spans=8,
                              on_device=False, fold_ns=0)
    own = {c[0]: c[3]["attnscope.kernel.self_ns"] for c in report.children}
    assert own == {"outer": 60, "inner": 25, "leaf": 5, "inner2": 10}
    assert report.attributes["kernel.total_ns"] == 100


@pytest.mark.parametrize(
    ("names", "expected"),
    [
        (["aten::_scaled_dot_product_flash_attention_for_cpu"], "flash"),
        (["aten::_scaled_dot_product_efficient_attention",
          "fmha_cutlassF_f16_aligned_64x64_rf_sm80"], "efficient"),
        (["aten::_scaled_dot_product_cudnn_attention", "cudnn_generated_fort_native_sdpa"],
         "cudnn"),
        (["aten::_scaled_dot_product_attention_math", "aten::bmm", "aten::_softmax"], "math"),
        (["aten::matmul", "aten::softmax"], "math"),
        (["void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128>>"], "flash"),
        (["ampere_bf16_s16816gemm_bf16_128x64", "void at::native::softmax_warp_forward<>"], "math"),
        (["aten::add"], "unknown"),
        ([], "unknown"),
    ],
)
def test_detect_backend(names: list[str], expected: str) -> None:
    ops = [n for n in names if n.startswith("aten::")]  # the rest are kernels of these ops
    assert _kernels.detect_backend(ops, [n for n in names if n not in ops]) == expected


def test_memory_peaks_and_coverage() -> None:
    mem = [_ev("[memory]", "memory", t, t, "cpu", n)
           for t, n in [(1, 100), (2, 50), (3, -100), (4, 30), (5, -80)]]
    assert _kernels.memory_peaks(mem) == {"cpu": 150}
    assert _kernels.memory_peaks([_ev("[memory]", "memory", 1, 1, "cpu", -10)]) == {"cpu": 0}
    assert _kernels.covered_ns([(0, 10), (5, 20), (30, 40)], 0, 35) == 25
    assert _kernels.covered_ns([], 0, 35) == 0


# ---- a user's profiler that predates attnscope ---------------------------------------------------

def test_hooks_are_installed_at_import() -> None:
    import torch.autograd.profiler as ap

    for name in ("_prepare_profiler", "_enable_profiler", "_disable_profiler"):
        assert getattr(getattr(ap, name), "__attnscope_hook__", False), name


def test_open_session_scan() -> None:
    import torch.autograd.profiler as ap

    prof = ap.profile(use_kineto=True)
    assert not _profile._open_session_exists(ap.profile)
    prof.entered = True  # as after _prepare_trace()
    assert _profile._open_session_exists(ap.profile)
    prof.kineto_results = object()  # as after __exit__
    assert not _profile._open_session_exists(ap.profile)


_PREDATES = """
import sys, torch
got = []
schedule = torch.profiler.schedule(wait=0, warmup=2, active=1, repeat=1)
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], schedule=schedule,
                            on_trace_ready=lambda p: got.append(len(p.events()))) as user:
    import attnscope
    from attnscope._capture import profiler_session as _profile
    from attnscope.testing import capture_spans
    assert _profile.warm_up() is False  # the user's prepared session is seen
    f = attnscope.trace(lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    q = torch.randn(1, 2, 8, 4)
    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans:
        for _ in range(3):
            f(q)
            user.step()
    tiers = [s.attributes["attnscope.tier"] for s in spans]
print("tiers", tiers, "user", got, "stats", _profile.stats()["skipped_user_profiler"])
assert tiers == ["timing"] * 3 and got and got[0] > 0
assert _profile.warm_up() is True  # the user's session ended through the hook
"""


def test_users_profiler_prepared_before_attnscope_import() -> None:
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", _PREDATES], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]
    assert "tiers ['timing', 'timing', 'timing']" in proc.stdout


def test_a_users_profiler_waiting_for_the_warm_up_is_told_so(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The warm-up holds the session for seconds on CUDA (no call is being profiled then)."""
    import logging
    import time

    from attnscope._record.capture import ProfileSession

    monkeypatch.setattr(_profile, "_USER_WAIT_S", 0.05)
    p = runtime.profiler
    p.session_lock.acquire()
    p.active = ProfileSession(None, True)  # warm_up()'s: no capture

    def end_warm_up() -> None:
        time.sleep(0.3)
        p.active = None
        p.session_lock.release()

    threading.Thread(target=end_warm_up).start()
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        _profile._claim_for_user()
    try:
        (line,) = [r.getMessage() for r in caplog.records if "your profiler waits" in
                   r.getMessage()]
        assert "profiler warm-up" in line and "traced call" not in line
    finally:
        p.foreign = False


def test_a_users_profiler_waits_for_a_long_profiled_call_on_another_thread(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """It used to start beside attnscope's session after 5 s: two kineto sessions crash."""
    import logging
    import time

    monkeypatch.setattr(_profile, "_USER_WAIT_S", 0.1)
    p = runtime.profiler
    p.session_lock.acquire()  # attnscope's session of a long call, on another thread
    released_at: list[float] = []

    def end_call() -> None:
        time.sleep(0.6)
        released_at.append(time.monotonic())
        p.session_lock.release()

    threading.Thread(target=end_call).start()
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        _profile._claim_for_user()
    claimed_at = time.monotonic()
    try:
        assert released_at and claimed_at >= released_at[0]  # waited past _USER_WAIT_S
        assert p.foreign
        assert any("waits for a traced call" in r.getMessage() for r in caplog.records)
        assert not p.session_lock.locked()
    finally:
        p.foreign = False


def test_the_worker_hands_the_gil_back_between_a_profiles_steps(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # Reading a profile is milliseconds of Python: in one piece, the application's thread
    # waited for all of it whenever it needed the GIL (bench_worker_stall.py: 2.8-5.5 ms at a
    # time, 0.5-0.7 ms with the hand-backs)
    steps: list[str] = []
    real_storages, real_analyze = _kernels._input_storages, _kernels.analyze

    def storages(result: Any) -> Any:
        steps.append("storages")
        return real_storages(result)

    def analyze(*args: Any, **kwargs: Any) -> Any:
        steps.append("analyze")
        return real_analyze(*args, **kwargs)

    monkeypatch.setattr(_kernels, "_input_storages", storages)
    monkeypatch.setattr(_kernels, "analyze", analyze)
    monkeypatch.setattr(_session, "hand_back", lambda: steps.append("hand back"))
    with capture_spans(**PROFILE) as spans:
        sdpa(Q, Q, Q)
    assert _parents(spans)[0].attributes["attnscope.tier"] == "profile"
    assert steps == ["storages", "hand back", "hand back", "analyze", "hand back"]
