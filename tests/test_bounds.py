"""Every per-process table and every exported string is bounded; a capture never holds a call's
tensors through its exception (issue 10 items 6 and 9)."""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

import attnscope
from attnscope._capture import retain
from attnscope._runtime import runtime
from attnscope.testing import capture_spans


@contextmanager
def own_provider() -> Iterator[list[ReadableSpan]]:
    """Spans through the provider attnscope creates (the direct emitter), not an injected one."""
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, profile_rate=0.0,
                        overhead_budget=1.0, metrics=False)
    spans: list[ReadableSpan] = []
    yield spans
    assert attnscope.flush(10)
    spans.extend(exporter.get_finished_spans())


PATHS = {"app_provider": capture_spans, "own_provider": own_provider}


def test_runtime_decorations_leave_nothing_behind() -> None:
    """A trace(fn) per request (Dynamo not imported) kept every wrapper: +142 MB per 100k."""
    gc.collect()
    before = len(runtime.dynamo.pending)
    for i in range(2000):
        attnscope.trace(lambda x, i=i: x + i)(1)
    gc.collect()
    assert len(runtime.dynamo.pending) <= before


def test_span_names_are_capped_where_they_are_kept() -> None:
    huge = "n" * 1_000_000
    with capture_spans() as spans:
        for i in range(20):
            with attnscope.span(f"{i}-{huge}"):
                pass
        traced = attnscope.trace(name=huge)(lambda: None)
        traced()
    assert all(len(name) <= 128 for name in runtime.span_sites.by_name)
    assert len(spans) == 21 and all(len(s.name) <= 128 for s in spans)


@pytest.mark.parametrize("path", PATHS)
def test_exception_text_is_capped(path: str) -> None:
    def deep(n: int) -> None:
        if n == 0:
            raise ValueError("m" * 10_000_000)
        other(n - 1)

    def other(n: int) -> None:  # alternating frames: Python does not fold them into one line
        deep(n)

    traced = attnscope.trace(name="fails")(deep)
    with PATHS[path]() as spans:
        with pytest.raises(ValueError) as raised:
            traced(200)
    assert len(str(raised.value)) == 10_000_000  # the caller's exception is untouched
    (span,) = spans
    assert span.status.status_code is StatusCode.ERROR
    assert len(span.status.description or "") <= 256
    (event,) = span.events
    ev = dict(event.attributes or {})
    assert ev["exception.type"] == "ValueError"
    assert len(ev["exception.message"]) == 4096
    trace = ev["exception.stacktrace"]
    assert 1000 < len(trace) <= 4096 and "in deep" in trace and trace.endswith("m\n")


@pytest.mark.parametrize("path", PATHS)
def test_exception_chain_type_and_module(path: str) -> None:
    class Mine(RuntimeError):
        pass

    @attnscope.trace
    def fails() -> None:
        raise Mine("x")

    with PATHS[path]() as spans:
        with pytest.raises(Mine):
            fails()
    ev = dict(spans[0].events[0].attributes or {})
    assert ev["exception.type"].endswith("test_exception_chain_type_and_module.<locals>.Mine")
    assert ev["exception.escaped"] == "True" and ev["exception.message"] == "x"


def test_a_failed_call_does_not_keep_its_tensors_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[Any] = []
    monkeypatch.setattr(runtime.worker, "submit", lambda cap: held.append(cap) or True)
    refs: list[weakref.ref[torch.Tensor]] = []

    @attnscope.trace(sample_rate=1.0)
    def fails(x: torch.Tensor) -> None:
        big = torch.zeros(1000) + x.sum()
        refs.append(weakref.ref(big))
        raise RuntimeError("boom")

    for _ in range(5):
        with pytest.raises(RuntimeError):
            fails(torch.ones(4))
    gc.collect()
    assert len(held) == 5 and all(cap.error is not None for cap in held)
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("code", [0, None])
def test_sys_exit_0_is_not_an_error(path: str, code: int | None) -> None:
    @attnscope.trace
    def leaves() -> None:
        sys.exit(code)

    with PATHS[path]() as spans:
        with pytest.raises(SystemExit):
            leaves()
    (span,) = spans
    assert span.status.status_code is StatusCode.UNSET and not span.events


def test_sys_exit_1_is_an_error() -> None:
    @attnscope.trace
    def leaves() -> None:
        sys.exit(1)

    with capture_spans() as spans:
        with pytest.raises(SystemExit):
            leaves()
    assert spans[0].status.status_code is StatusCode.ERROR


def test_span_attributes_keep_their_names_and_are_bounded() -> None:
    many = {f"k{i}": i for i in range(100)}
    with capture_spans() as spans:
        with attnscope.span("block", tokens=7, attributes={"task": 1, "team.name": "x"}) as blk:
            blk.set(step=3, tokens=9)
        with attnscope.span("many", attributes=many):
            pass
        attnscope.trace(name="site", attributes=many)(lambda: None)()
    by_name = {s.name: dict(s.attributes or {}) for s in spans}
    block = by_name["block"]
    assert block["task"] == 1 and block["team.name"] == "x" and block["attnscope.step"] == 3
    assert block["attnscope.tokens"] == 9 and "attnscope.task" not in block
    assert sum(k.startswith("k") for k in by_name["many"]) == 64
    assert sum(k.startswith("k") for k in by_name["site"]) == 64


def _sdpa_with_mask(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    attn_mask: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def test_a_large_mask_is_not_kept_alive(monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampled call kept the caller's mask until the worker ran (0.5-1 GB on a GPU)."""
    held: list[Any] = []
    monkeypatch.setattr(runtime.worker, "submit", lambda cap: held.append(cap) or True)
    traced = attnscope.trace(sample_rate=1.0)(_sdpa_with_mask)
    q = torch.randn(1, 1, 2100, 8)
    refs = []
    for _ in range(3):
        mask = torch.ones(1, 1, 2100, 2100, dtype=torch.bool)  # 4.4 MB
        big = torch.zeros(1, 1, 2100, 2100)  # 17.6 MB: over the per-tensor budget
        refs.append(weakref.ref(big))
        traced(q, q, q, attn_mask=big)
        del big
        traced(q, q, q, attn_mask=mask)
    gc.collect()
    assert all(r() is None for r in refs)
    kept = [dict(cap.summary)["attn_mask"] for cap in held]
    assert [isinstance(m, torch.Tensor) for m in kept] == [False, True] * 3
    assert runtime.retention.kept_bytes == 3 * 2100 * 2100


def test_masks_kept_at_once_stay_within_the_total_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    held: list[Any] = []
    monkeypatch.setattr(runtime.worker, "submit", lambda cap: held.append(cap) or True)
    traced = attnscope.trace(sample_rate=1.0)(_sdpa_with_mask)
    q = torch.randn(1, 1, 3238, 8)
    for _ in range(10):  # 10.5 MB each: 6 fit in 64 MiB
        traced(q, q, q, attn_mask=torch.ones(1, 1, 3238, 3238, dtype=torch.bool))
    kept = [isinstance(dict(cap.summary)["attn_mask"], torch.Tensor) for cap in held]
    assert kept == [True] * 6 + [False] * 4
    # a view of a large mask would keep the large one alive: a small one is copied (its own
    # bytes, not the buffer's), a larger one counts as the large one and is not kept
    static = torch.ones(1, 1, 64, 5000 * 64, dtype=torch.bool)  # 20 MB
    traced(q[..., :64, :], q[..., :64, :], q[..., :64, :], attn_mask=static[..., :64])
    copied = dict(held[-1].summary)["attn_mask"]
    assert isinstance(copied, torch.Tensor) and copied.untyped_storage().nbytes() == 64 * 64
    assert copied.data_ptr() != static.data_ptr()
    wide = retain.COPY_MASK_ELEMENTS // 64 + 64
    k = torch.randn(1, 1, wide, 8)
    traced(q[..., :64, :], k, k, attn_mask=static[..., :wide])
    assert not isinstance(dict(held[-1].summary)["attn_mask"], torch.Tensor)
    for cap in held:
        retain.release(cap)
    assert runtime.retention.kept_bytes == 0


def test_kept_bytes_come_back_once_spans_are_built() -> None:
    with capture_spans() as spans:
        traced = attnscope.trace(_sdpa_with_mask)
        q = torch.randn(2, 1, 8, 8)
        mask = torch.ones(2, 1, 8, 8, dtype=torch.bool)
        mask[1, ..., 4:] = False
        for _ in range(20):
            traced(q, q, q, attn_mask=mask)
    assert len(spans) == 20 and runtime.retention.kept_bytes == 0
    assert all(s.attributes["attnscope.tokens"] == 12 for s in spans)


def test_a_mask_over_budget_gives_no_token_count() -> None:
    with capture_spans() as spans:
        q = torch.randn(1, 1, 2100, 8)
        attnscope.trace(_sdpa_with_mask)(q, q, q, attn_mask=torch.zeros(1, 1, 2100, 2100))
    (span,) = spans
    assert "attnscope.tokens" not in span.attributes and span.attributes["attnscope.flops"] > 0
    assert runtime.retention.kept_bytes == 0


def test_a_tensor_attribute_is_recorded_as_its_shape_and_dtype() -> None:
    secret = torch.full((2, 3), 1234567.25)
    with capture_spans() as spans:
        with attnscope.span("block", attributes={"t": secret, "ts": [secret, 1]}) as blk:
            blk.set(later=secret)
        attnscope.trace(name="site", attributes={"t": secret})(lambda: None)()
    for span in spans:
        text = repr(dict(span.attributes or {}))
        assert "1234567" not in text and "Tensor(shape=(2, 3), dtype=float32)" in text


def test_derived_rates_have_four_significant_digits() -> None:
    @attnscope.trace
    def attn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)

    q = torch.randn(1, 2, 16, 8)
    with capture_spans(sample_rate=1.0) as spans:
        attn(q, q, q)
    a = dict(spans[0].attributes or {})
    for key in ("attnscope.tflops", "attnscope.tokens_per_s"):
        assert a[key] > 0 and float(f"{a[key]:.4g}") == a[key], (key, a[key])


def test_runtime_decorations_leave_nothing_behind_once_dynamo_is_loaded() -> None:
    import torch._dynamo  # noqa: F401  (what a program using torch.compile has loaded)

    refs = []
    for i in range(500):
        wrapped = attnscope.trace(lambda x, i=i: x + i)
        assert wrapped(1) == 1 + i
        refs.append(weakref.ref(wrapped))
        del wrapped
    gc.collect()
    assert sum(r() is not None for r in refs) == 0
