"""Fallback verdicts against torch's own choice on CPU, and the CUDA path through fakes."""

from __future__ import annotations

import logging
import warnings
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import profile

from attnscope._derive import fallback
from attnscope._derive.fallback import Inputs, Verdict, assess, from_summary
from attnscope._record.capture import TensorMeta


def _ran(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> str:
    """The backend torch chose, independently of attnscope: the profiler's op names."""
    with profile() as prof:
        F.scaled_dot_product_attention(q, k, v, **kw)
    names = {e.name for e in prof.events()}
    if "aten::_scaled_dot_product_flash_attention_for_cpu" in names:
        return "flash"
    assert "aten::_scaled_dot_product_attention_math" in names
    return "math"


def _inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kw: Any) -> Inputs:
    return Inputs("cpu", (q.shape, k.shape, v.shape), q.dtype,
                  (q.stride(-1), k.stride(-1), v.stride(-1)), **kw)


CASES = [
    ("plain", (1, 2, 8, 16), {}, False),
    ("dropout", (1, 2, 8, 16), {"dropout_p": 0.1}, True),
    ("causal", (1, 2, 8, 16), {"is_causal": True}, False),
]


@pytest.mark.parametrize(("name", "shape", "kw", "falls_back"), CASES)
def test_cpu_verdict_matches_torch_choice(name: str, shape: tuple[int, ...], kw: dict[str, Any],
                                          falls_back: bool) -> None:
    q = torch.randn(shape)
    ran = _ran(q, q, q, **kw)
    assert (ran == "math") is falls_back
    verdict = assess(ran, _inputs(q, q, q, **kw))
    assert verdict is not None
    assert verdict.fallback is falls_back
    assert verdict.expected == ("" if falls_back else "flash")


def test_noncontiguous_last_dim_falls_back_with_reason() -> None:
    q = torch.randn(1, 2, 16, 8).transpose(-1, -2)
    assert _ran(q, q, q) == "math"
    verdict = assess("math", _inputs(q, q, q))
    assert verdict is not None and verdict.fallback and verdict.expected == ""
    assert "stride" in verdict.reason


def test_forced_math_on_flash_shape_is_a_fallback() -> None:
    q = torch.randn(1, 2, 8, 16)
    with sdpa_kernel(SDPBackend.MATH):
        ran = _ran(q, q, q)
    assert ran == "math"
    verdict = assess(ran, _inputs(q, q, q, allowed=frozenset({"math"})))
    assert verdict is not None and verdict.fallback and verdict.expected == "flash"
    assert "sdpa_kernel" in verdict.reason
    unknown_context = assess(ran, _inputs(q, q, q))
    assert unknown_context is not None and "sdpa_kernel" not in unknown_context.reason


def test_unrecorded_strides_leave_a_math_call_unjudged_unless_dropout_decides() -> None:
    q = torch.randn(1, 2, 8, 16)
    plain = Inputs("cpu", (q.shape,) * 3, q.dtype)
    assert assess("math", plain) is None  # a transposed input would also run math: no guess
    assert assess("flash", plain) == Verdict(False, "flash", "")
    dropped = Inputs("cpu", (q.shape,) * 3, q.dtype, dropout_p=0.1)
    verdict = assess("math", dropped)
    assert verdict is not None and verdict.fallback and "dropout" in verdict.reason


def test_from_summary_reads_meta_only() -> None:
    meta = TensorMeta((1, 4, 8, 16), torch.float32, torch.device("cpu"))
    kv = TensorMeta((1, 2, 8, 16), torch.float32, torch.device("cpu"))
    mask = torch.zeros(8, 8, dtype=torch.bool)
    inputs = from_summary([("query", meta), ("key", kv), ("value", kv), ("attn_mask", mask),
                           ("dropout_p", 0.25), ("is_causal", False), ("enable_gqa", True)])
    assert inputs == Inputs("cpu", ((1, 4, 8, 16), (1, 2, 8, 16), (1, 2, 8, 16)), torch.float32,
                            mask_shape=(8, 8), mask_dtype=torch.bool, dropout_p=0.25,
                            enable_gqa=True)
    assert from_summary([("x", 1.0)]) is None


def test_unknown_backend_or_device_says_nothing() -> None:
    q = torch.randn(1, 2, 8, 16)
    assert assess("unknown", _inputs(q, q, q)) is None
    assert assess("math", Inputs("mps", (q.shape,) * 3, q.dtype)) is None


def test_cuda_path_uses_torch_checks_and_their_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    def no(name: str) -> Any:
        def check(params: Any, debug: bool) -> bool:
            assert debug and isinstance(params, torch.backends.cuda.SDPAParams)
            warnings.warn(f"{name} says attn_mask is float32", UserWarning, stacklevel=1)
            return False
        return check

    def yes(params: Any, debug: bool) -> bool:
        return True

    checks = {"flash": no("flash"), "cudnn": no("cudnn"), "efficient": yes}
    monkeypatch.setattr(fallback, "_cuda_checks", lambda: checks)
    shape = (1, 2, 8, 64)
    inputs = Inputs("cuda", (shape,) * 3, torch.float16, mask_shape=(8, 8),
                    mask_dtype=torch.float32)
    verdict = assess("math", inputs)
    assert verdict == Verdict(True, "efficient", "efficient was eligible but the math kernel ran")
    assert assess("efficient", inputs) == Verdict(False, "efficient", "")
    checks["efficient"] = no("efficient")
    none = assess("math", inputs)
    assert none is not None and none.fallback and none.expected == ""
    assert none.reason.startswith("flash: flash says attn_mask is float32 | cudnn:")
    assert len(none.reason) <= 240
    assert assess("flash", inputs) == Verdict(False, "", none.reason)


def test_one_warning_per_site(caplog: pytest.LogCaptureFixture) -> None:
    verdict = Verdict(True, "", "flash (CPU) does not support dropout (dropout_p=0.1)")
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        for _ in range(3):
            fallback.warn("layers.3.self_attn", verdict)
        fallback.warn("layers.4.self_attn", Verdict(False, "flash", ""))
    lines = [r.getMessage() for r in caplog.records if "ran the math kernel" in r.getMessage()]
    assert len(lines) == 1
    assert ("layers.3.self_attn ran the math kernel: no fused kernel was eligible because"
            in lines[0])
    assert "dropout" in lines[0]


def test_profiled_sdpa_with_dropout_is_named_a_fallback_on_its_span(
        caplog: pytest.LogCaptureFixture) -> None:
    import attnscope
    from attnscope.testing import capture_spans

    q = torch.randn(1, 2, 8, 16)
    attnscope.instrument_sdpa()
    try:
        with caplog.at_level(logging.WARNING, logger="attnscope"), \
                capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans, \
                attnscope.sampling(profile=True):
            F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
            F.scaled_dot_product_attention(q, q, q)
    finally:
        attnscope.uninstrument_sdpa()
    calls = [dict(s.attributes or {}) for s in spans if s.name == "scaled_dot_product_attention"]
    assert [a.get("attnscope.backend") for a in calls] == ["math", "flash"]
    dropped, fused = calls
    assert dropped["attnscope.backend.fallback"] is True
    assert dropped["attnscope.backend.expected"] == "none"  # no fused kernel was eligible
    assert "dropout" in str(dropped["attnscope.backend.reason"])
    assert fused["attnscope.backend.fallback"] is False
    assert "attnscope.backend.reason" not in fused
    warned = [r.getMessage() for r in caplog.records if "ran the math kernel" in r.getMessage()]
    assert len(warned) == 1 and "dropout" in warned[0]


def test_fallbacks_are_counted_per_series() -> None:
    from types import SimpleNamespace

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    from attnscope._export import metrics as _metrics

    reader = InMemoryMetricReader()
    record = _metrics._instruments_for(MeterProvider(metric_readers=[reader])).record
    base = {"attnscope.wall_ns": 1000, "attnscope.backend": "math", "attnscope.tier": "profile"}
    for fell in (True, True, False):
        record(SimpleNamespace(name="sdpa", attrs={**base, "attnscope.backend.fallback": fell}))
    record(SimpleNamespace(name="sdpa", attrs={"attnscope.wall_ns": 1000,
                                               "attnscope.backend": "flash"}))  # no verdict
    data = reader.get_metrics_data()
    points = [p for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
              if m.name == "attnscope.attention.backend_fallbacks" for p in m.data.data_points]
    (point,) = points
    assert point.value == 2
    assert dict(point.attributes)["attnscope.backend"] == "math"


def test_a_profiled_sdpa_call_records_strides_and_the_sdpa_kernel_context() -> None:
    """The two inputs the CPU flash verdict hangs on, recorded for profiled calls only: a
    forced-math call on a shape flash takes, and a transposed key (last-dimension stride != 1),
    are named fallbacks on their spans; a timed call records neither."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import attnscope
    from attnscope.testing import capture_spans

    q = torch.randn(1, 2, 8, 16)
    k_t = torch.randn(1, 2, 16, 8).transpose(-1, -2)  # (1, 2, 8, 16), last-dim stride 8
    attnscope.instrument_sdpa()
    try:
        with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans, \
                attnscope.sampling(profile=True):
            with sdpa_kernel(SDPBackend.MATH):
                F.scaled_dot_product_attention(q, q, q)
            F.scaled_dot_product_attention(q, k_t, q)
            F.scaled_dot_product_attention(q, q, q)
        site = F.scaled_dot_product_attention.__attnscope_site__  # type: ignore[attr-defined]
        assert site.on_profile is not None
        call = site.on_profile((q, k_t, q), {})
        assert call is not None and call.context is not None and call.inner is None
        strides, allowed = call.context
        assert strides == (1, 8, 1) and "flash" in allowed
    finally:
        attnscope.uninstrument_sdpa()
    calls = [dict(s.attributes or {}) for s in spans if s.name == "scaled_dot_product_attention"]
    assert [a.get("attnscope.backend") for a in calls] == ["math", "math", "flash"]
    forced, strided, fused = calls
    assert forced["attnscope.backend.fallback"] is True
    assert forced["attnscope.backend.expected"] == "flash"
    assert "excluded by an sdpa_kernel context" in forced["attnscope.backend.reason"]
    assert strided["attnscope.backend.fallback"] is True
    assert strided["attnscope.backend.expected"] == "none"
    assert "last-dimension stride 1, got [1, 8, 1]" in strided["attnscope.backend.reason"]
    assert fused["attnscope.backend.fallback"] is False
