"""attnscope never breaks the host program: failures injected into every internal stage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import structlog
import torch
import torch.nn.functional as F
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import attnscope
from attnscope import _hotpath, _inspect, _safety, _spans, _worker
from attnscope.testing import capture_spans


def attention_impl(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fail: bool = False) -> torch.Tensor:
    if fail:
        raise ValueError("user error")
    return F.scaled_dot_product_attention(q, k, v)



def _boom(*_: Any, **__: Any) -> Any:
    raise RuntimeError("injected")


STAGES: dict[str, Callable[[pytest.MonkeyPatch], None]] = {
    "inspection": lambda mp: mp.setattr(_inspect, "summarize", _boom),
    "capture": lambda mp: mp.setattr(_hotpath, "begin", _boom),
    "capture-end": lambda mp: mp.setattr(_worker, "submit", _boom),
    "worker-derive": lambda mp: mp.setattr(_inspect, "derive", _boom),
    "worker-build": lambda mp: mp.setattr(_spans.SpanBuilder, "add", _boom),
    "sampler": lambda mp: mp.setattr(attnscope._sampling.Sampler, "decide", _boom),
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


@pytest.mark.parametrize("stage", sorted(STAGES))
def test_internal_failure_leaves_outputs_and_exceptions_identical(
    stage: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    STAGES[stage](monkeypatch)
    with capture_spans():
        with structlog.testing.capture_logs() as logs:
            (plain_out, plain_err), (traced_out, traced_err) = _run_all()
            attnscope.flush(timeout_s=5)
    assert torch.equal(plain_out, traced_out)
    assert plain_err == traced_err
    assert any(entry.get("stage") for entry in logs), logs
    assert len([e for e in logs if e["log_level"] == "warning"]) <= 3  # logged once per stage


class FailingExporter(SpanExporter):
    def __init__(self) -> None:
        self.calls = 0

    def export(self, spans: Any) -> SpanExportResult:
        self.calls += 1
        raise RuntimeError("collector exploded")

    def shutdown(self) -> None:
        pass


def test_exporter_that_raises() -> None:
    exporter = FailingExporter()
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0)
    (plain_out, plain_err), (traced_out, traced_err) = _run_all()
    attnscope.flush(timeout_s=5)
    assert torch.equal(plain_out, traced_out) and plain_err == traced_err
    assert exporter.calls >= 1
    assert attnscope.shutdown(timeout_s=5)


def test_site_switches_itself_off_after_repeated_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hotpath, "begin", _boom)

    @attnscope.trace
    def f(x: int) -> int:
        return x + 1

    with capture_spans():
        with structlog.testing.capture_logs() as logs:
            assert [f(i) for i in range(50)] == list(range(1, 51))
        assert _safety.error_count("capture") == 5
    site = f.__attnscope_site__  # type: ignore[attr-defined]
    assert site.disabled
    assert site.errors == 5
    off = [e for e in logs if "no longer traced" in e["event"]]
    assert len(off) == 1


def test_keyboard_interrupt_is_not_swallowed_by_the_guard() -> None:
    with pytest.raises(KeyboardInterrupt):
        with _safety.Guard("x"):
            raise KeyboardInterrupt
    with _safety.Guard("x"):
        raise RuntimeError("swallowed")
    assert _safety.error_count("x") == 1
