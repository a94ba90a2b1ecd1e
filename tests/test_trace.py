"""@attnscope.trace and attnscope.span(): what a sampled call records (docs/attributes.md)."""

from __future__ import annotations

import asyncio
import inspect
import logging

import pytest
import torch
import torch.nn.functional as F
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import StatusCode

import attnscope
from attnscope.testing import capture_spans
from tests.support.helpers import attrs, brute_force_flops


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
              is_causal: bool = False) -> torch.Tensor:
    """Plain SDPA."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def _qkv(b: int = 2, h: int = 4, sq: int = 8, skv: int = 8, d: int = 16, hkv: int | None = None):
    g = torch.Generator().manual_seed(0)
    hkv = hkv or h
    return (torch.randn(b, h, sq, d, generator=g), torch.randn(b, hkv, skv, d, generator=g),
            torch.randn(b, hkv, skv, d, generator=g))


def test_sampled_call_records_the_schema() -> None:
    q, k, v = _qkv()
    with capture_spans() as spans:
        out = attention(q, k, v, is_causal=True)
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v, is_causal=True))
    (span,) = spans
    a = attrs(span)
    assert span.name == "attention"
    assert a["attnscope.tier"] == "timing"
    assert a["attnscope.sample_rate"] == 1.0
    assert a["attnscope.device"] == "cpu"
    assert a["attnscope.dtype"] == "float32"
    assert (a["attnscope.batch_size"], a["attnscope.num_heads"],
            a["attnscope.num_kv_heads"]) == (2, 4, 4)
    assert (a["attnscope.head_dim"], a["attnscope.seq_len_q"],
            a["attnscope.seq_len_kv"]) == (16, 8, 8)
    assert a["attnscope.causal"] is True
    assert a["attnscope.tokens"] == 16
    assert a["attnscope.flops"] == brute_force_flops(2, 4, 8, 8, 16, 16, True)
    assert a["attnscope.wall_ns"] > 0
    assert a["attnscope.wall_ns"] == span.end_time - span.start_time
    assert a["attnscope.tflops"] == pytest.approx(
        a["attnscope.flops"] / a["attnscope.wall_ns"] / 1e3, rel=1e-3)
    assert a["attnscope.tokens_per_s"] == pytest.approx(16 * 1e9 / a["attnscope.wall_ns"], rel=1e-3)
    assert a["attnscope.memory.host_rss_bytes"] > 1_000_000
    assert a["code.function.name"] == "attention"
    assert span.kind == otel_trace.SpanKind.INTERNAL


def test_keyword_inputs_and_custom_name_and_attributes() -> None:
    @attnscope.trace(name="llama.attn", sample_rate=1.0, attributes={"layer": 3})
    def attn(query, key, value):  # type: ignore[no-untyped-def]
        return F.scaled_dot_product_attention(query, key, value)

    q, k, v = _qkv(sq=4, skv=12)
    with capture_spans(sample_rate=0.0) as spans:  # the decorator's rate wins over the config
        attn(query=q, key=k, value=v)
    (span,) = spans
    a = attrs(span)
    assert span.name == "llama.attn"
    assert a["layer"] == 3
    assert a["attnscope.seq_len_q"] == 4 and a["attnscope.seq_len_kv"] == 12
    assert a["attnscope.flops"] == brute_force_flops(2, 4, 4, 12, 16, 16, False)
    assert "attnscope.causal" not in a or a["attnscope.causal"] is False


def test_wrapper_preserves_identity_of_the_function() -> None:
    def original(q, k, v, is_causal=False):  # type: ignore[no-untyped-def]
        """Plain SDPA."""

    assert attention.__name__ == "attention"
    assert attention.__doc__ == "Plain SDPA."
    assert str(inspect.signature(attention)) == str(inspect.signature(attention.__wrapped__))
    assert (list(inspect.signature(attention).parameters)
            == list(inspect.signature(original).parameters))


class Block(torch.nn.Module):
    def __init__(self, hidden: int = 32, heads: int = 4) -> None:
        super().__init__()
        self.num_heads = heads
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)

    @attnscope.trace
    def forward(self, hidden_states: torch.Tensor,
                attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        b, s, h = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(b, s, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        mask = None if attention_mask is None else attention_mask[:, None, None, :].bool()
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return out.transpose(1, 2).reshape(b, s, h)


def test_module_forward_with_hidden_states_and_padding_mask() -> None:
    block = Block()
    x = torch.randn(3, 5, 32)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 0, 0, 0]])
    expected = Block.forward.__wrapped__(block, x, mask)  # type: ignore[attr-defined]
    with capture_spans() as spans:
        out = block(x, attention_mask=mask)
    assert torch.equal(out, expected)
    (span,) = spans
    a = attrs(span)
    assert span.name == "Block.forward"
    assert a["attnscope.batch_size"] == 3 and a["attnscope.seq_len_q"] == 5
    assert a["attnscope.num_heads"] == 4 and a["attnscope.head_dim"] == 8
    assert a["attnscope.tokens"] == 9  # padding excluded


def test_bound_method_can_be_traced() -> None:
    block = Block()
    traced = attnscope.trace(block.qkv.forward)
    with capture_spans() as spans:
        traced(torch.randn(2, 32))
    assert [s.name for s in spans] == ["Linear.forward"]


def test_nesting_under_the_app_span_and_under_attnscope_spans() -> None:
    app_provider = TracerProvider()
    tracer = app_provider.get_tracer("app")
    q, k, v = _qkv()

    @attnscope.trace
    def layer(q, k, v):  # type: ignore[no-untyped-def]
        return attention(q, k, v)

    with capture_spans() as spans:
        with tracer.start_as_current_span("request") as request:
            with attnscope.span("decode-step", tokens=128):
                layer(q, k, v)
                layer(q, k, v)
    by_name: dict[str, list] = {}
    for s in spans:
        by_name.setdefault(s.name, []).append(s)
    (step,) = by_name["decode-step"]
    request_ctx = request.get_span_context()
    assert step.parent.span_id == request_ctx.span_id
    assert step.context.trace_id == request_ctx.trace_id
    assert attrs(step)["attnscope.tokens"] == 128
    assert len(by_name["test_nesting_under_the_app_span_and_under_attnscope_spans."
                       "<locals>.layer"]) == 2
    for lay in by_name["test_nesting_under_the_app_span_and_under_attnscope_spans.<locals>.layer"]:
        assert lay.parent.span_id == step.context.span_id
        assert step.start_time <= lay.start_time <= lay.end_time <= step.end_time
    inner = by_name["attention"]
    assert len(inner) == 2
    layer_ids = {s.context.span_id for s in by_name[
        "test_nesting_under_the_app_span_and_under_attnscope_spans.<locals>.layer"]}
    assert {s.parent.span_id for s in inner} == layer_ids
    assert all(s.context.trace_id == request_ctx.trace_id for s in spans)


def test_user_exception_propagates_unchanged_and_span_records_it() -> None:
    class Boom(RuntimeError):
        pass

    err = Boom("bad shapes")

    @attnscope.trace
    def failing(q):  # type: ignore[no-untyped-def]
        raise err

    with capture_spans() as spans:
        with pytest.raises(Boom) as info:
            failing(torch.zeros(1))
    assert info.value is err
    assert info.traceback[-1].name == "failing"  # the user's frame is still the origin
    (span,) = spans
    assert span.status.status_code == StatusCode.ERROR
    assert "Boom: bad shapes" in (span.status.description or "")
    (event,) = span.events
    assert event.name == "exception"
    assert event.attributes["exception.type"].endswith("Boom")
    assert event.attributes["exception.message"] == "bad shapes"


def test_disabled_is_a_pass_through() -> None:
    q, k, v = _qkv()
    with capture_spans(enabled=False) as spans:
        out = attention(q, k, v)
    assert spans == []
    assert torch.equal(out, F.scaled_dot_product_attention(q, k, v))


@pytest.mark.parametrize("var,value",
                         [("ATTNSCOPE_ENABLED", "false"), ("OTEL_SDK_DISABLED", "true")])
def test_disabled_by_environment(monkeypatch: pytest.MonkeyPatch, var: str, value: str) -> None:
    from attnscope import _api

    monkeypatch.setenv(var, value)
    _api.reset_defaults()
    assert _api.current().enabled is False
    with capture_spans(enabled=None) as spans:
        attention(*_qkv())
    assert spans == []


def test_parent_trace_explicitly_not_sampled_is_respected() -> None:
    tracer = TracerProvider(sampler=ALWAYS_OFF).get_tracer("app")
    with capture_spans() as spans:
        with tracer.start_as_current_span("unsampled-request"):
            attention(*_qkv())
        attention(*_qkv())  # no parent: sampled
    assert len(spans) == 1 and spans[0].parent is None


def test_async_functions_are_traced() -> None:
    @attnscope.trace
    async def attn_async(q, k, v):  # type: ignore[no-untyped-def]
        await asyncio.sleep(0)
        return F.scaled_dot_product_attention(q, k, v)

    assert inspect.iscoroutinefunction(attn_async)
    with capture_spans() as spans:
        out = asyncio.run(attn_async(*_qkv()))
    assert out.shape == (2, 4, 8, 16)
    assert [attrs(s)["attnscope.seq_len_q"] for s in spans] == [8]


def test_generators_are_refused_at_decoration() -> None:
    with pytest.raises(TypeError, match="generator"):
        @attnscope.trace
        def gen():  # type: ignore[no-untyped-def]
            yield 1


def test_bad_decorator_rate_warns_and_falls_back() -> None:
    with pytest.warns(UserWarning, match="sample_rate"):
        @attnscope.trace(sample_rate=2.0)
        def f(x):  # type: ignore[no-untyped-def]
            return x
    assert f(3) == 3


def test_tracing_twice_keeps_one_wrapper() -> None:
    assert attnscope.trace(attention) is attention


def test_span_block_sample_false_and_set() -> None:
    with capture_spans() as spans:
        with attnscope.span("never", sample=False) as blk:
            assert not blk.recording
        with attnscope.span("forced", sample=True) as blk:
            blk.set(tokens=5, phase="decode")
    (span,) = spans
    assert span.name == "forced"
    assert attrs(span)["attnscope.tokens"] == 5 and attrs(span)["attnscope.phase"] == "decode"


def test_span_records_user_exception() -> None:
    with capture_spans() as spans:
        with pytest.raises(KeyError):
            with attnscope.span("block"):
                raise KeyError("x")
    assert spans[0].status.status_code == StatusCode.ERROR


def test_global_provider_and_logging_left_alone() -> None:
    before_provider = otel_trace.get_tracer_provider()
    before_handlers = list(logging.getLogger().handlers)
    before_level = logging.getLogger().level
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0)
    attention(*_qkv())
    assert attnscope.flush(timeout_s=5)
    assert otel_trace.get_tracer_provider() is before_provider
    assert logging.getLogger().handlers == before_handlers
    assert logging.getLogger().level == before_level
    assert attnscope.stats()["emitted"] == 1


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs fork()")
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_forked_child_gets_its_own_worker(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import json
    import os
    import signal
    import time

    @attnscope.trace
    def step(x: int) -> int:  # no torch compute: OpenMP in a forked child is torch's own problem
        return x + 1

    out = tmp_path / "child.json"
    attnscope.configure(exporter=f"jaeger-json:{out}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0, metrics=False)
    step(1)  # the parent's worker is running
    assert attnscope.flush(timeout_s=5)
    pid = os.fork()
    if pid == 0:  # child: trace, flush, exit without running the parent's atexit handlers
        code = 1
        try:
            step(2)
            code = 0 if attnscope.shutdown(timeout_s=10) else 2
        finally:
            os._exit(code)
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.05)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    spans = [s for trace in json.loads(out.read_text())["data"] for s in trace["spans"]]
    assert [s["operationName"] for s in spans] == [
        "test_forked_child_gets_its_own_worker.<locals>.step"]
