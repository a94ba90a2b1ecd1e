"""One fallback WARNING per call site and fallback, not per span name; bounded in memory."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import attnscope
from attnscope._derive import fallback
from attnscope._derive.fallback import Verdict
from attnscope._record.capture import TensorMeta
from attnscope.testing import capture_spans


def _warned(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "ran the math kernel" in r.getMessage()]


def test_three_fallbacks_of_instrument_sdpa_are_three_warnings_each_said_once(
        caplog: pytest.LogCaptureFixture) -> None:
    """Forced math, a transposed key and dropout, from three source lines, twice each: every
    span is named a fallback, and each of the three is said in its own WARNING, once, on the
    worker thread."""
    q = torch.randn(1, 2, 8, 16)
    k_t = torch.randn(1, 2, 16, 8).transpose(-1, -2)
    attnscope.instrument_sdpa()
    try:
        with caplog.at_level(logging.WARNING, logger="attnscope"), \
                capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans, \
                attnscope.sampling(profile=True):
            for _ in range(2):
                with sdpa_kernel(SDPBackend.MATH):
                    F.scaled_dot_product_attention(q, q, q)
                F.scaled_dot_product_attention(q, k_t, q)
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.5)
    finally:
        attnscope.uninstrument_sdpa()
    calls = [dict(s.attributes or {}) for s in spans if s.name == "scaled_dot_product_attention"]
    assert [a.get("attnscope.backend.fallback") for a in calls] == [True] * 6
    reasons = {str(a["attnscope.backend.reason"]) for a in calls}
    assert len(reasons) == 3
    warned = _warned(caplog)
    assert len(warned) == 3, [r.getMessage() for r in warned]
    texts = [r.getMessage() for r in warned]
    assert all(t.startswith("scaled_dot_product_attention ran the math kernel: ") for t in texts)
    assert sum("excluded by an sdpa_kernel context" in t for t in texts) == 1
    assert sum("last-dimension stride 1, got [1, 8, 1]" in t for t in texts) == 1
    assert sum("does not support dropout" in t for t in texts) == 1
    assert all(r.threadName != threading.main_thread().name for r in warned)


def test_two_functions_traced_under_one_name_are_two_sites(
        caplog: pytest.LogCaptureFixture) -> None:
    @attnscope.trace(name="attention")
    def first(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               dropout_p: float) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    @attnscope.trace(name="attention")
    def second(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               dropout_p: float) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p)

    q = torch.randn(1, 2, 8, 16)
    with caplog.at_level(logging.WARNING, logger="attnscope"), \
            capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0) as spans, \
            attnscope.sampling(profile=True):
        for fn in (first, second, first, second):
            fn(q, q, q, dropout_p=0.5)  # an argument: in the call's summary
    fell = [s for s in spans if s.name == "attention"
            and (s.attributes or {}).get("attnscope.backend.fallback") is True]
    assert len(fell) == 4
    texts = sorted(r.getMessage() for r in _warned(caplog))
    assert len(texts) == 2, texts
    assert ".first) ran the math kernel: no fused kernel was eligible because" in texts[0]
    assert ".second) ran the math kernel: no fused kernel was eligible because" in texts[1]


def test_the_sites_warned_are_bounded_and_the_overflow_said_once(
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fallback, "_warned", fallback._Warned(2))
    verdict = Verdict(True, "", "flash (CPU) does not support dropout (dropout_p=0.1)")
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        for n in range(5):
            fallback.warn(f"layers.{n}.self_attn", verdict)
        fallback.warn("layers.0.self_attn", verdict)  # known: still its own key (rate-limited)
    texts = [r.getMessage() for r in caplog.records]
    assert [t.split(" ", 1)[0] for t in texts if "ran the math kernel" in t] == [
        "layers.0.self_attn", "layers.1.self_attn"]
    assert sum("more than 2 call sites fell back" in t for t in texts) == 1
    assert len(fallback._warned.keys) == 2


def test_the_bound_follows_logs_own_reset() -> None:
    from attnscope._runtime import runtime

    warned = fallback._Warned(1)
    assert warned.admit("a") and warned.admit("a") and not warned.admit("b")
    runtime.reset()  # a new rate-limit memory: the keys handed to the old one are forgotten
    assert warned.admit("b") and not warned.admit("a")


def test_a_site_is_named_by_its_module_path_else_its_name_and_function(
        caplog: pytest.LogCaptureFixture) -> None:
    attrs: dict[str, Any] = {"attnscope.backend": "math", "attnscope.module": "layers.3.attn",
                             "code.function.name": "Attention.forward"}
    q = TensorMeta((1, 2, 8, 16), torch.float32, torch.device("cpu"))
    summary: list[tuple[str, Any]] = [("query", q), ("key", q), ("value", q),
                                      ("dropout_p", 0.2)]
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        fallback.annotate(dict(attrs), summary, "layers.3.attn")
        del attrs["attnscope.module"]
        fallback.annotate(dict(attrs), summary, "attention")
        attrs["code.function.name"] = "attention"
        fallback.annotate(dict(attrs), summary, "attention")
    heads = [r.getMessage().split(" ran the math kernel")[0] for r in _warned(caplog)]
    assert heads == ["layers.3.attn", "attention (Attention.forward)", "attention"]
