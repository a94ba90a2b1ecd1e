"""The direct path (a provider attnscope owns) gives the same spans as the SDK's tracer path."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

import attnscope
from attnscope._runtime import runtime
from attnscope._spans.emit import DirectEmitter, SdkEmitter

SETTINGS: dict[str, Any] = {"sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0,
                            "profile_rate": 0.0, "metrics": False}


@attnscope.trace
def inner(q: torch.Tensor, fail: bool = False) -> torch.Tensor:
    if fail:
        raise ValueError("bad shapes")
    return q * 2


@attnscope.trace
def outer(q: torch.Tensor) -> torch.Tensor:
    return inner(q) + inner(q)


def _workload() -> None:
    q = torch.ones(1, 2, 4, 8)
    outer(q)
    with pytest.raises(ValueError):
        inner(q, fail=True)
    with attnscope.span("block", tokens=3):
        inner(q)


def _shape(spans: list[ReadableSpan]) -> list[tuple[Any, ...]]:
    """What a backend sees, ids replaced by names: comparable across runs."""
    by_id = {s.context.span_id: s.name for s in spans}
    out = []
    for s in spans:
        attrs = {k: v for k, v in (s.attributes or {}).items()
                 if not k.endswith(("_ns", "tflops", "tokens_per_s", "host_rss_bytes", "summary"))}
        events = [(e.name, sorted((e.attributes or {}).keys())) for e in s.events]
        parent = by_id.get(s.parent.span_id) if s.parent is not None else None
        out.append((s.name, parent, sorted(attrs.items()), s.status.status_code.name,
                    s.status.description, events, s.kind.name, s.instrumentation_scope.name
                    if s.instrumentation_scope else None))
    return sorted(out, key=repr)


def _run_owned() -> tuple[list[ReadableSpan], Any]:
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    _workload()
    assert attnscope.flush(timeout_s=10)
    emitter = runtime.worker.current.builder.emitter
    return list(exporter.get_finished_spans()), emitter


def _run_app_provider() -> tuple[list[ReadableSpan], Any]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    attnscope.configure(tracer_provider=provider, **SETTINGS)
    _workload()
    assert attnscope.flush(timeout_s=10)
    emitter = runtime.worker.current.builder.emitter
    return list(exporter.get_finished_spans()), emitter


def test_owned_provider_takes_the_direct_path_with_identical_spans() -> None:
    direct, direct_emitter = _run_owned()
    attnscope.shutdown()
    via_sdk, sdk_emitter = _run_app_provider()
    assert isinstance(direct_emitter, DirectEmitter) and isinstance(sdk_emitter, SdkEmitter)
    assert len(direct) == len(via_sdk) == 6
    assert _shape(direct) == _shape(via_sdk)
    [failed] = [s for s in direct if s.status.status_code.name == "ERROR"]
    [event] = failed.events
    assert event.attributes["exception.type"] == "ValueError"
    assert "bad shapes" in event.attributes["exception.stacktrace"]
    assert direct[0].resource.attributes["service.name"] == "attnscope"


def test_direct_path_nests_under_the_app_span_and_links_an_unrecorded_one() -> None:
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    app = TracerProvider()
    q = torch.ones(1, 2, 4, 8)
    with app.get_tracer("app").start_as_current_span("request") as request:
        inner(q)
    unrecorded = TracerProvider(sampler=ALWAYS_OFF).get_tracer("app")
    with unrecorded.start_as_current_span("dropped") as dropped:
        with attnscope.sampling(force=True):
            inner(q)
    assert attnscope.flush(timeout_s=10)
    first, second = exporter.get_finished_spans()
    assert first.parent.span_id == request.get_span_context().span_id
    assert first.context.trace_id == request.get_span_context().trace_id
    assert second.parent is None
    assert [link.context.span_id for link in second.links] == [
        dropped.get_span_context().span_id]


def test_direct_path_asks_the_providers_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    _workload()
    assert attnscope.flush(timeout_s=10)
    assert isinstance(runtime.worker.current.builder.emitter, DirectEmitter)
    assert exporter.get_finished_spans() == ()
    assert otel_trace.get_tracer_provider() is not None  # the global provider was left alone


def test_rates_keep_four_significant_digits_and_never_overflow() -> None:
    import sys

    from attnscope._derive.result import sig4

    for x in (1234567.0, 0.000123456, -98765.4321, 3.0, 9.99951):
        assert sig4(x) == float(f"{x:.4g}")
    # the largest float rounds up past itself: kept as it is, never an OverflowError
    assert sig4(sys.float_info.max) == sys.float_info.max
    assert sig4(0.0) == 0.0 and sig4(float("inf")) == float("inf")


# ---- what a person reads: the summary's numbers, calls inside a profiled call (issue 24 §4) ----

@pytest.mark.parametrize("kind", ["time", "FLOP", "FLOP/s", "bytes"])
def test_summary_numbers_read_back_exactly_enough_and_never_in_exponent_form(kind: str) -> None:
    from attnscope._spans import summary as readable
    from tests.support.helpers import near, quantity

    write = {"time": readable.duration, "FLOP": lambda v: readable.si(v, "FLOP"),
             "FLOP/s": lambda v: readable.flop_rate(v / 1e12), "bytes": readable.binary_bytes}[kind]
    edges = [999.4, 999.5, 999.7, 1000, 999_499, 999_500, 999_700, 1023 * 1024, 1024 ** 2 - 1]
    values = [int(1.37 ** e) for e in range(1, 120)] + edges
    for value in values:
        if kind == "bytes" and value >= 1 << 40:
            continue
        text = write(value)
        assert "e+" not in text and "e-" not in text, (value, text)
        if kind == "time" and value < 999.5:
            assert text == f"{value:.0f} ns"
        elif kind == "bytes" and value < 1024:
            assert text == f"{value:.0f} B"
        else:
            assert near(quantity(text, kind), value), (value, text)
    # a value just under a unit that rounds up is written in the next one: 999.7 µs is 1 ms
    assert readable.duration(999_700) == "1 ms" and readable.duration(999_400) == "999 µs"
    assert readable.duration(12_345 * 10 ** 9) == "12345 s"


class _GroupedAttention(torch.nn.Module):
    """4 query heads over 2 K/V heads, repeated before a traced kernel (as eager code does)."""

    def __init__(self) -> None:
        super().__init__()
        self.num_heads, self.num_key_value_heads, self.head_dim = 4, 2, 8
        self.is_causal = True
        self.qkv = torch.nn.Linear(32, 64)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, _ = hidden_states.shape
        h = self.qkv(hidden_states).view(b, s, 8, 8).transpose(1, 2)
        q, k, v = h.split([4, 2, 2], dim=1)
        k, v = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        return _kernel(q, k, v).transpose(1, 2).reshape(b, s, 32)


@attnscope.trace(name="kernel")
def _kernel(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            is_causal: bool = True) -> torch.Tensor:
    out: torch.Tensor = torch.nn.functional.scaled_dot_product_attention(q, k, v,
                                                                          is_causal=is_causal)
    return out


class _Stack(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList([_GroupedAttention()])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.layers[0](x)
        return out


@pytest.mark.parametrize("fmt", ["jaeger-json", "otlp-json"])
def test_a_call_inside_a_profiled_call_says_so_and_is_counted_as_nested(
        fmt: str, tmp_path: Any) -> None:
    from tests.support.helpers import call_summary_facts, traced_to_file

    model = attnscope.instrument(_Stack())
    x = torch.randn(2, 6, 32)

    def run() -> None:
        with torch.no_grad(), attnscope.sampling(force=True, profile=True):
            model(x)
            model(x)

    rows = traced_to_file(tmp_path / "t", fmt, run, profile_max_per_minute=1000)
    attnscope.uninstrument(model)
    stats = attnscope.stats()
    layers = [r for r in rows if r.attributes.get("attnscope.module") == "layers.0"]
    kernels = [r for r in rows if r.name == "kernel"]
    assert len(layers) == len(kernels) == 2
    assert all(r.attributes["attnscope.tier"] == "profile" for r in layers)
    for kernel in kernels:
        a = kernel.attributes
        # its profile was its layer's: timed, said so, counted apart from a user's profiler
        assert kernel.parent_id in {r.span_id for r in layers}
        assert a["attnscope.tier"] == "timing" and a["attnscope.profiled_by"] == "enclosing"
        # the model's K/V heads and the kernel's, named apart
        assert a["attnscope.num_kv_heads"] == 4 and a["attnscope.kv_repeated_from"] == 2
        assert a["attnscope.num_heads"] == 4
        facts = call_summary_facts(a)
        assert facts["shapes"] == "q[2,4,6,8] k[2,4,6,8] fp32"
        # the backend its ops (handed down from the layer's profile) name
        assert a["attnscope.backend"] == "flash"
        assert facts["words"] == ("flash · K/V repeated from 2 heads · timed inside an enclosing "
                                  "call's profile")
        # the kernel's ops came from the layer's profile
        assert any(r.parent_id == kernel.span_id for r in rows)
    for layer in layers:
        a = layer.attributes
        assert a["attnscope.num_kv_heads"] == 2 and "attnscope.kv_repeated_from" not in a
        assert "attnscope.profiled_by" not in a
    assert stats["profile_skipped_nested"] == len(kernels)
    assert stats["profile_skipped_user_profiler"] == 0 and stats["profile_skipped_busy"] == 0
    assert stats["profiled"] == len(layers)


def test_a_users_profiler_is_still_counted_as_the_users() -> None:
    from attnscope.testing import capture_spans

    with capture_spans(sample_rate=1.0, warmup_calls=0, profile_rate=1.0,
                       profile_max_per_minute=1000):
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
            outer(torch.ones(1, 2, 4, 8))
        stats = attnscope.stats()
    assert stats["profile_skipped_user_profiler"] == 3 and stats["profile_skipped_nested"] == 0


def test_kept_summary_texts_follow_what_changes_between_calls_of_one_shape() -> None:
    """The builder keeps a summary's texts per (shape, site): a call of the same shape with
    another implementation, RSS or mark gets its own, and the time and rate are always its own."""
    from attnscope._spans.summary import Summaries
    from tests.support.helpers import call_summary_facts

    shape = {"attnscope.flops": 4096, "attnscope.batch_size": 1, "attnscope.num_heads": 2,
             "attnscope.seq_len_q": 4, "attnscope.head_dim": 8}
    site = {"attnscope.module": "m"}
    summaries = Summaries()

    def span(wall: int, **more: Any) -> dict[str, Any]:
        a = {**site, "attnscope.tier": "timing", **shape, "attnscope.wall_ns": wall,
             "attnscope.memory.host_rss_bytes": 3 << 20, **more}
        a["attnscope.tflops"] = round(4096 / wall / 1e3, 6)
        a["attnscope.summary"] = summaries.call(a, (shape, site))
        return a

    first = span(2_000, **{"attnscope.implementation": "eager"})
    again = span(7_000, **{"attnscope.implementation": "eager"})
    other = span(2_000, **{"attnscope.implementation": "sdpa"})
    bigger = span(2_000, **{"attnscope.implementation": "sdpa",
                            "attnscope.memory.host_rss_bytes": 5 << 20})
    slow = span(2_000, **{"attnscope.implementation": "sdpa", "attnscope.slow": True})
    facts = [call_summary_facts(a) for a in (first, again, other, bigger, slow)]
    assert [f["words"] for f in facts] == ["eager", "eager", "sdpa", "sdpa", "sdpa · slow"]
    assert [f["rss"] for f in facts] == ["RSS 3 MiB"] * 3 + ["RSS 5 MiB", "RSS 3 MiB"]
    assert first["attnscope.summary"] != again["attnscope.summary"]  # its own time and rate
    assert all(f["shapes"] == "q[1,2,4,8]" for f in facts)
