"""attnscope never breaks the host program: failures injected into every internal stage."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import attnscope
from attnscope import _log
from attnscope._capture import args, sampling, wrapper
from attnscope._derive import call as derive
from attnscope._runtime import runtime
from attnscope._spans import spans
from attnscope.testing import capture_spans


def attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   fail: bool = False) -> torch.Tensor:
    if fail:
        raise ValueError("user error")
    return F.scaled_dot_product_attention(q, k, v)



def _boom(*_: Any, **__: Any) -> Any:
    raise RuntimeError("injected")


STAGES: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "inspection": lambda mp: mp.setattr(args, "summarize_flat", _boom),
    "capture": lambda mp: mp.setattr(wrapper, "_open", _boom),
    "capture-end": lambda mp: mp.setattr(runtime.worker, "submit", _boom),
    "worker-derive": lambda mp: mp.setattr(derive, "derive", _boom),
    "worker-build": lambda mp: mp.setattr(spans.SpanBuilder, "add", _boom),
    "sampler": lambda mp: mp.setattr(sampling, "decide", _boom),
}


def _run_all() -> list[Any]:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, 4, 8, generator=g)
    results: list[Any] = []
    # A fresh wrapper per run: a site that failed 5 times switches itself off for good.
    for fn in (attention_impl, attnscope.trace(attention_impl)):
        out = fn(q, q, q)
        try:
            fn(q, q, q, fail=True)
        except ValueError as exc:
            err = (type(exc), str(exc), exc.__traceback__ is not None)
        results.append((out, err))
    return results


@pytest.mark.internal_errors("capture", "capture-end", "worker")
@pytest.mark.parametrize("stage", sorted(STAGES))
def test_internal_failure_leaves_outputs_and_exceptions_identical(
    stage: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    STAGES[stage](monkeypatch)
    caplog.set_level(logging.WARNING, logger="attnscope")
    with capture_spans():
        (plain_out, plain_err), (traced_out, traced_err) = _run_all()
        attnscope.flush(timeout_s=5)
    assert torch.equal(plain_out, traced_out)
    assert plain_err == traced_err
    ours = [r for r in caplog.records if r.name == "attnscope"]
    assert any(r.attnscope.get("stage") for r in ours), ours  # type: ignore[attr-defined]
    assert len([r for r in ours if r.levelno == logging.WARNING]) <= 3  # logged once per stage


class FailingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.calls += 1
        raise RuntimeError("collector exploded")

    def shutdown(self) -> None:
        pass


@pytest.mark.internal_errors("exporter")
def test_exporter_that_raises() -> None:
    exporter = FailingExporter()
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0)
    (plain_out, plain_err), (traced_out, traced_err) = _run_all()
    attnscope.flush(timeout_s=5)
    assert torch.equal(plain_out, traced_out) and plain_err == traced_err
    assert exporter.calls >= 1
    assert attnscope.shutdown(timeout_s=5)


@pytest.mark.internal_errors("capture")
def test_site_switches_itself_off_after_repeated_failures(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(wrapper, "_open", _boom)
    caplog.set_level(logging.WARNING, logger="attnscope")

    @attnscope.trace
    def f(x: int) -> int:
        return x + 1

    with capture_spans():
        assert [f(i) for i in range(50)] == list(range(1, 51))
        assert _log.error_count("capture") == 5
    site = f.__attnscope_site__  # type: ignore[attr-defined]
    assert site.disabled
    assert site.errors == 5
    off = [r for r in caplog.records if "no longer traced" in r.getMessage()]
    assert len(off) == 1


def test_keyboard_interrupt_in_the_users_call_passes_through_and_is_recorded() -> None:
    @attnscope.trace
    def interrupted() -> None:
        raise KeyboardInterrupt

    with capture_spans() as got:
        with pytest.raises(KeyboardInterrupt):
            interrupted()
    [span] = got
    assert span.status.status_code.name == "ERROR"
    assert _log.error_count() == 0


# ---- misuse of the public API: the documented error, never an AttributeError (issue 20) --------


class _BrokenText:
    """A key or value whose own text raises: user code's error, met inside attnscope."""

    def __str__(self) -> str:
        raise RuntimeError("broken __str__")

    def __repr__(self) -> str:
        raise RuntimeError("broken __repr__")


@pytest.mark.parametrize("attributes", [[("a", 1)], "a=1", 3, ["a"]])
def test_attributes_that_are_not_a_dict_raise_type_error(attributes: Any) -> None:
    with pytest.raises(TypeError, match=r"attnscope\.span needs attributes as a dict"):
        attnscope.span("w", attributes=attributes)
    with pytest.raises(TypeError, match=r"attnscope\.trace needs attributes as a dict"):
        attnscope.trace(attributes=attributes)
    with pytest.raises(TypeError, match=r"attnscope\.trace needs attributes as a dict"):
        attnscope.trace(attributes=attributes)(lambda: None)


def test_a_mapping_that_is_not_a_dict_is_accepted() -> None:
    from types import MappingProxyType

    @attnscope.trace(attributes=MappingProxyType({"team": "a"}))
    def f() -> int:
        return 1

    with capture_spans() as got, attnscope.span("w", attributes=MappingProxyType({"phase": "x"})):
        assert f() == 1
    by_name = {s.name.rsplit(".", 1)[-1]: dict(s.attributes or {}) for s in got}
    assert by_name["w"]["phase"] == "x" and by_name["f"]["team"] == "a"


@pytest.mark.internal_errors("attributes")
def test_a_key_or_value_whose_own_code_raises_is_an_internal_error(
        caplog: pytest.LogCaptureFixture) -> None:
    class Shaped:  # looks like a tensor, but reading its shape raises
        dtype = "float32"

        @property
        def shape(self) -> Any:
            raise RuntimeError("broken shape")

    caplog.set_level(logging.WARNING, logger="attnscope")
    broken = {_BrokenText(): 1, "kept": 2, "shaped": Shaped()}

    @attnscope.trace(attributes=broken)
    def f() -> int:
        return 1

    with capture_spans() as got, attnscope.span("w", attributes=broken) as block:
        block.set(also=Shaped(), fine=3)
        assert f() == 1
    by_name = {s.name.rsplit(".", 1)[-1]: dict(s.attributes or {}) for s in got}
    assert by_name["w"]["kept"] == 2 and by_name["w"]["attnscope.fine"] == 3
    assert "shaped" not in by_name["w"] and "attnscope.also" not in by_name["w"]
    assert by_name["f"]["kept"] == 2 and "shaped" not in by_name["f"]
    assert _log.error_count("attributes") == 5
    assert any(getattr(r, "attnscope", {}).get("stage") == "attributes" for r in caplog.records)


def test_a_name_or_function_whose_repr_raises_still_gets_the_type_error() -> None:
    with pytest.raises(TypeError, match=r"non-empty str name, got <_BrokenText object"):
        attnscope.span(_BrokenText())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"non-empty str name, got <_BrokenText object"):
        attnscope.trace(name=_BrokenText())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"expects a callable, got <_BrokenText object"):
        attnscope.trace(_BrokenText())  # type: ignore[call-overload]
