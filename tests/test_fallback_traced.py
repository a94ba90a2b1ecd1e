"""Every profiled call that runs SDPA inside gets the fallback verdict (issue 36 §2).

A ``@attnscope.trace`` function or a ``span()`` block sees its own arguments, not the SDPA call it
makes: before, a profiled traced function that called ``F.scaled_dot_product_attention(q, q, q,
dropout_p=0.1)`` on CPU got ``backend=math`` and no verdict, while the same call through
``instrument_sdpa()`` got one. Now every profile-tier session arms the recorder of
``capture.inner_sdpa``; unprofiled and timing-tier calls never do.
"""

from __future__ import annotations

import linecache
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._capture import inner_sdpa
from attnscope._derive import fallback
from attnscope.testing import capture_spans

PROFILED = {"profile_rate": 1.0, "profile_max_per_minute": 1e6}
_ROOT = str(Path(__file__).parent.parent)
DROPOUT = "flash (CPU) does not support dropout (dropout_p=0.1)"


@pytest.fixture(autouse=True)
def _fresh_verdicts() -> Iterator[None]:
    fallback._cached.cache_clear()
    yield
    fallback._cached.cache_clear()


def _verdicts(spans: Any, name: str) -> list[dict[str, Any]]:
    return [{k: v for k, v in (s.attributes or {}).items()
             if k.startswith("attnscope.backend") or k == "attnscope.tier"}
            for s in spans if s.name == name]


def _warned(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ran the math kernel" in r.getMessage()]


def test_a_profiled_traced_function_gets_the_verdict_and_one_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    """The issue's case: twice, so the WARNING is seen to come once per site and reason."""
    q = torch.randn(1, 2, 8, 16)

    @attnscope.trace(name="attn")
    def attn(x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(x, x, x, dropout_p=0.1)

    with caplog.at_level(logging.WARNING, logger="attnscope"), capture_spans(**PROFILED) as spans:
        attn(q)
        attn(q)
    expected = {"attnscope.tier": "profile", "attnscope.backend": "math",
                "attnscope.backend.fallback": True, "attnscope.backend.expected": "none",
                "attnscope.backend.reason": DROPOUT}
    assert _verdicts(spans, "attn") == [expected, expected]
    (line,) = _warned(caplog)
    assert line.startswith("attn (") and line.endswith(
        f"ran the math kernel: no fused kernel was eligible because {DROPOUT}")


def test_a_profiled_span_block_gets_the_verdict(caplog: pytest.LogCaptureFixture) -> None:
    """A ``span()`` block has no arguments at all: the recorded SDPA call is all it knows."""
    q = torch.randn(1, 2, 8, 16)
    with caplog.at_level(logging.WARNING, logger="attnscope"), capture_spans(**PROFILED) as spans:
        for _ in range(2):
            with attnscope.span("block"):
                F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    verdicts = _verdicts(spans, "block")
    assert len(verdicts) == 2
    assert {v["attnscope.backend.reason"] for v in verdicts} == {DROPOUT}
    assert _warned(caplog) == [f"block ran the math kernel: no fused kernel was eligible because "
                               f"{DROPOUT}"]


def test_a_profiled_traced_function_that_ran_flash_is_no_fallback_and_a_forced_math_one_is(
        ) -> None:
    """What the recorder notes besides shapes: the strides and the backends torch's flags allow,
    so a forced-math call on a shape flash takes is named, and a flash call is cleared."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q = torch.randn(1, 2, 8, 16)

    @attnscope.trace(name="attn")
    def attn(x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(x, x, x)

    with capture_spans(**PROFILED) as spans:
        attn(q)
        with sdpa_kernel(SDPBackend.MATH):
            attn(q)
    fused, forced = _verdicts(spans, "attn")
    assert fused["attnscope.backend"] == "flash" and fused["attnscope.backend.fallback"] is False
    assert forced["attnscope.backend"] == "math" and forced["attnscope.backend.fallback"] is True
    assert forced["attnscope.backend.expected"] == "flash"
    assert "excluded by an sdpa_kernel context" in forced["attnscope.backend.reason"]


def test_only_profile_tier_calls_arm_the_recorder(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unsampled and timing-tier calls never arm it nor see it; a profiled call sees it, and it
    is gone after the call, also when the call raises."""
    original = F.scaled_dot_product_attention
    armed: list[int] = []
    arm = inner_sdpa.arm

    def counting(*args: Any) -> Any:
        armed.append(1)
        return arm(*args)

    monkeypatch.setattr(inner_sdpa, "arm", counting)
    seen: list[bool] = []

    @attnscope.trace(name="attn")
    def attn(x: torch.Tensor, fail: bool = False) -> torch.Tensor:
        seen.append(F.scaled_dot_product_attention is not original)
        if fail:
            raise ValueError("the user's error")
        return F.scaled_dot_product_attention(x, x, x)

    q = torch.randn(1, 2, 8, 16)
    with capture_spans(sample_rate=0.0):
        attn(q)
    with capture_spans(sample_rate=1.0, profile_rate=0.0) as timed:
        attn(q)
    assert armed == [] and seen == [False, False]
    assert _verdicts(timed, "attn") == [{"attnscope.tier": "timing"}]
    with capture_spans(**PROFILED):
        attn(q)
        with pytest.raises(ValueError, match="the user's error"):
            attn(q, fail=True)
    assert armed == [1, 1] and seen == [False, False, True, True]
    assert F.scaled_dot_product_attention is original


def test_a_traced_function_under_instrument_sdpa_keeps_both(
        caplog: pytest.LogCaptureFixture) -> None:
    """With ``instrument_sdpa()`` on, the traced function still gets its verdict, the SDPA call
    its span, and the instrumented function is in place after."""
    q = torch.randn(1, 2, 8, 16)

    @attnscope.trace(name="attn")
    def attn(x: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(x, x, x, dropout_p=0.1)

    attnscope.instrument_sdpa()
    try:
        traced = F.scaled_dot_product_attention
        with capture_spans(**PROFILED) as spans:
            attn(q)
        assert F.scaled_dot_product_attention is traced
    finally:
        attnscope.uninstrument_sdpa()
    (verdict,) = _verdicts(spans, "attn")
    assert verdict["attnscope.backend.reason"] == DROPOUT
    assert [s for s in spans if s.name == "scaled_dot_product_attention"]


def test_instrument_and_uninstrument_sdpa_inside_a_profiled_call_hold() -> None:
    """``instrument_sdpa()`` called while a profiled call's recorder is in place instruments for
    good (it used to wrap the recorder, left in place for ever), and ``uninstrument_sdpa()``
    called there uninstruments (it used to find the recorder, warn it was someone else's, and the
    session's end put the instrumented function back)."""
    original = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 8, 16)

    @attnscope.trace(name="instrumenting")
    def instrumenting(x: torch.Tensor) -> torch.Tensor:
        attnscope.instrument_sdpa()
        return F.scaled_dot_product_attention(x, x, x)

    @attnscope.trace(name="uninstrumenting")
    def uninstrumenting(x: torch.Tensor) -> torch.Tensor:
        attnscope.uninstrument_sdpa()
        return F.scaled_dot_product_attention(x, x, x)

    try:
        with capture_spans(**PROFILED) as spans:
            instrumenting(q)
            site = getattr(F.scaled_dot_product_attention, "__attnscope_site__", None)
            assert site is not None
            uninstrumenting(q)
            assert F.scaled_dot_product_attention is original
        assert [s.name for s in spans if s.name == "scaled_dot_product_attention"]
    finally:
        attnscope.uninstrument_sdpa()
    assert F.scaled_dot_product_attention is original


class _InterruptIn:
    """``sys.settrace`` hook: a KeyboardInterrupt at the n-th line run of one function; not at
    the line event CPython gives a ``with`` line again as its block ends, where no signal can
    skip ``__exit__`` (as tests/test_interrupt_lines.py)."""

    def __init__(self, code: Any, at: int | None) -> None:
        self.code, self.at, self.seen = code, at, 0
        self.withs: set[int] = set()

    def __call__(self, frame: Any, event: str, arg: Any) -> Any:
        return self._line if frame.f_code is self.code else None

    def _line(self, frame: Any, event: str, arg: Any) -> Any:
        if event != "line":
            return self._line
        text = linecache.getline(frame.f_code.co_filename, frame.f_lineno).lstrip()
        if text.startswith("with "):
            if frame.f_lineno in self.withs:
                return self._line
            self.withs.add(frame.f_lineno)
        self.seen += 1
        if self.seen == self.at:
            raise KeyboardInterrupt
        return self._line


def _attn(x: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(x, x, x)


_traced_attn = attnscope.trace(name="attn")(_attn)


def _sweep_arming() -> None:
    """Interrupt each line of ``inner_sdpa.arm`` in turn, in a profiled traced call; print OK, or
    the first line after which something was left behind."""
    from attnscope._runtime import runtime

    original = F.scaled_dot_product_attention
    q = torch.randn(1, 2, 8, 16)

    def run(at: int | None) -> int:
        tracer = _InterruptIn(inner_sdpa.arm.__code__, at)
        sys.settrace(tracer)
        try:
            _traced_attn(q)
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(None)
        return tracer.seen

    with capture_spans(**PROFILED):
        _traced_attn(q)  # warm
        lines = run(None)
        print("lines", lines, flush=True)
        for at in range(1, lines + 1):
            run(at)
            left = [what for what, bad in (
                ("F.scaled_dot_product_attention not the original",
                 F.scaled_dot_product_attention is not original),
                ("sdpa_lock held", runtime.instrumentation.sdpa_lock.locked()),
                ("recorder armed", bool(inner_sdpa._ARMED)),
                ("profiler session open", runtime.profiler.session_lock.locked())) if bad]
            if left:
                print("BROKEN", at, left, flush=True)
                return
    print("OK", flush=True)


def test_a_ctrl_c_on_any_line_of_arming_leaves_the_function_and_its_lock_as_they_were() -> None:
    """Arming now runs on every profiled call: a Ctrl-C landing on any of its lines propagates
    (the program may catch it and go on), and leaves ``F.scaled_dot_product_attention`` the
    original, the lock free and nothing armed. (Before: one on the line releasing the lock in a
    ``finally`` left it held, and the session's end waited on it for ever.) In its own
    interpreter: a broken run hangs."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    code = "import tests.test_fallback_traced as t; t._sweep_arming()"
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                              text=True, timeout=240, cwd=_ROOT)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"hung after an interrupt: {(exc.stdout or b'')[-400:]!r}")
    out = proc.stdout.split()
    assert out[:1] == ["lines"] and int(out[1]) > 5, (proc.stdout, proc.stderr[-2000:])
    assert proc.stdout.strip().splitlines()[-1] == "OK", (proc.stdout, proc.stderr[-2000:])
