"""attnscope's OTLP encoder writes what the OpenTelemetry SDK's encoder writes, byte for byte,
and the OTLP exporters attnscope builds send exactly that (checked against the SDK's own
``encode_spans`` of the same spans, the independent computation)."""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import (
    Link,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
)

import attnscope
from attnscope._export import destinations, kept, otlp_encode, otlp_exporters
from attnscope._export.otlp_encode import Encoder
from tests.e2e.otlp_fakes import GRPCCollector, HTTPCollector


def installed() -> Encoder:
    """A new encoder of the variant that matches the installed SDK (its releases differ)."""
    found = otlp_exporters.encoder()
    assert found is not None
    return Encoder(found.flags, found.scope_schema)


def _sdk(spans: Sequence[Any]) -> bytes:
    return bytes(encode_spans(spans).SerializeToString())


# ---- random spans: every field the encoder writes, every value type --------------------------

_TEXT = ["", "a", "attnscope.summary", "ünïcødé · µs", "x" * 200, "\u2603\U0001f600"]
_INTS = [0, 1, -1, 127, 128, 300, -300, 1 << 31, (1 << 63) - 1, -(1 << 63), 2 ** 40 + 7]
_FLOATS = [0.0, -0.0, 1.5, -2.25, 1e-300, 1e300, math.inf, -math.inf, math.nan, 0.1]


def _value(rng: random.Random) -> Any:
    """A value of a type OpenTelemetry's attributes allow: str, int, bool, float, or a sequence
    of one of them (what the encoders write; anything else is left to the SDK: below)."""
    kind = rng.randrange(5)
    if kind == 0:
        return rng.choice(_TEXT)
    if kind == 1:
        return rng.choice(_INTS)
    if kind == 2:
        return rng.choice((True, False))
    if kind == 3:
        return rng.choice(_FLOATS)
    make = rng.choice((lambda: rng.choice(_TEXT), lambda: rng.choice(_INTS),
                       lambda: rng.choice((True, False)), lambda: rng.choice(_FLOATS)))
    seq = [make() for _ in range(rng.randrange(4))]
    return tuple(seq) if rng.random() < 0.5 else seq


def _attributes(rng: random.Random, n: int) -> dict[str, Any]:
    # keys shared across spans, so kept encodings are looked up again with other values
    return {rng.choice(["a", "b", "attnscope.seq", "é", "", f"k{rng.randrange(5)}"]):
            _value(rng) for _ in range(n)}


def _context(rng: random.Random, remote: bool = False) -> SpanContext:
    state = rng.choice((None, TraceState([("k", "v")]), TraceState([("a", "1"), ("b", "2")])))
    return SpanContext(rng.getrandbits(128) or 1, rng.getrandbits(64) or 1, is_remote=remote,
                       trace_flags=TraceFlags(rng.choice((0, 1))), trace_state=state)


def _random_spans(seed: int, count: int) -> list[ReadableSpan]:
    rng = random.Random(seed)
    # equal resources as distinct objects, interleaved: grouped by equality, as the SDK groups
    resources = [Resource({"service.name": "a"}), Resource({"service.name": "a"}),
                 Resource({"service.name": "b", "n": 2}, "https://schema/1"), Resource({})]
    scopes = [None, InstrumentationScope("attnscope", "1.0"),
              InstrumentationScope("attnscope", "1.0"), InstrumentationScope("other", None,
                                                                                "https://s")]
    spans = []
    for _ in range(count):
        parent = rng.choice((None, _context(rng), _context(rng, remote=True)))
        # events' and links' attributes held as the SDK's spans hold them (an SDK before 1.26
        # reads their dropped count there)
        events = tuple(Event(rng.choice(("exception", "e", "")),
                             BoundedAttributes(attributes=_attributes(rng, 2)),
                             timestamp=rng.choice((0, 5, 1 << 60)))
                       for _ in range(rng.choice((0, 0, 1, 2))))
        links = tuple(Link(_context(rng, remote=rng.random() < 0.5),
                           BoundedAttributes(attributes=_attributes(rng, 1)))
                      for _ in range(rng.choice((0, 0, 1))))
        status = rng.choice((Status(), Status(StatusCode.OK),
                             Status(StatusCode.ERROR, rng.choice(("", "RuntimeError: x", "é")))))
        spans.append(ReadableSpan(
            name=rng.choice(("attnscope.call", "", "ünï", "n" * 128)), context=_context(rng),
            parent=parent, resource=rng.choice(resources), attributes=_attributes(
                rng, rng.randrange(12)), events=events, links=links,
            kind=rng.choice(list(SpanKind)), status=status,
            start_time=rng.choice((0, 1, 1 << 62)), end_time=rng.choice((0, 2, (1 << 63) + 5)),
            instrumentation_scope=rng.choice(scopes)))
    return spans


@pytest.mark.parametrize("seed", range(12))
def test_random_spans_are_written_exactly_as_the_sdk_writes_them(seed: int) -> None:
    spans = _random_spans(seed, 60)
    encoder = installed()
    first = encoder.encode(spans)
    assert first == _sdk(spans)
    # again, from the kept attribute encodings, in another order
    shuffled = spans[::-1]
    assert encoder.encode(shuffled) == _sdk(shuffled)


def equal_values_of_other_types() -> list[list[ReadableSpan]]:
    """``True == 1 == 1.0`` and ``0.0 == -0.0`` in Python: batches of spans whose attribute ``v``
    holds them in turn, in two orders (one kept encoding must never serve another type)."""
    return [[ReadableSpan(name="s", context=SpanContext(1, i + 1, False), attributes={"v": v},
                          resource=Resource({})) for i, v in enumerate(values)]
            for values in ([True, 1, 1.0, False, 0, 0.0, -0.0],
                           [-0.0, 0.0, 0, False, 1.0, 1, True])]


def test_equal_values_of_other_types_are_never_taken_for_each_other() -> None:
    encoder = installed()
    for spans in equal_values_of_other_types():
        assert encoder.encode(spans) == _sdk(spans)


def test_kept_encodings_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kept, "MAX", 50)
    encoder = installed()
    spans = [ReadableSpan(name="s", context=SpanContext(1, i + 1, False),
                          attributes={"i": i, "s": str(i)}, resource=Resource({}))
             for i in range(200)]
    assert encoder.encode(spans) == _sdk(spans)
    assert len(encoder._kept.entries) <= 50


@pytest.mark.parametrize("value", [None, b"\x00bytes", {"k": 1}, ((1, 2),), (1, None), [b"x"]],
                         ids=["none", "bytes", "mapping", "nested", "none-in-sequence",
                              "bytes-in-sequence"])
def test_values_outside_the_attribute_types_leave_the_request_to_the_sdk(value: Any) -> None:
    """The SDK's releases write these differently (or drop them, or fail): never guessed."""
    span = ReadableSpan(name="s", context=SpanContext(1, 2, False), attributes={"v": value,
                                                                              "ok": 1},
                        resource=Resource({}))
    assert installed().encode([span]) is None
    try:
        expected = encode_spans([span])
    except Exception:  # noqa: BLE001  (an SDK that cannot encode it: nothing to compare)
        return
    assert otlp_exporters.encode_request([span]) == expected


def test_a_span_it_cannot_write_exactly_leaves_the_request_to_the_sdk(
        caplog: pytest.LogCaptureFixture) -> None:
    huge = ReadableSpan(name="s", context=SpanContext(1, 2, False),
                        attributes={"big": 1 << 64, "ok": 1}, resource=Resource({}))
    assert installed().encode([huge]) is None
    assert installed().encode([ReadableSpan(name="s", context=SpanContext(1, 2, False),
                                          attributes={"o": object()})]) is None
    # the SDK drops the attribute it cannot encode, and says so
    with caplog.at_level(logging.ERROR):
        assert otlp_exporters.encode_request([huge]) == encode_spans([huge])


def test_the_installed_sdk_is_matched_and_the_fast_path_is_used() -> None:
    """If a release of the SDK changes its encoding, the encoder steps aside; this says when that
    happens to the version CI installs, so the speed is not lost unseen."""
    assert otlp_exporters.encoder() is not None
    assert otlp_exporters.http_exporter_class() is not HTTPExporter
    ours = otlp_exporters.http_exporter_class()
    assert any(getattr(ours, name) is not getattr(HTTPExporter, name)
               for name in ("export", "_serialize_spans") if hasattr(HTTPExporter, name))


def test_an_encoding_that_differs_from_the_sdk_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    spans = otlp_encode.probe_spans()
    # the probe tells the variants apart: exactly one is the installed SDK's
    assert sum(otlp_encode.matches_sdk(Encoder(*v)) for v in otlp_encode.VARIANTS) == 1
    monkeypatch.setattr(otlp_encode.Encoder, "_status", lambda self, status: b"")
    otlp_exporters.encoder.cache_clear()
    try:
        assert otlp_exporters.encoder() is None
        assert otlp_exporters.encode_request(spans) == encode_spans(spans)
    finally:
        otlp_exporters.encoder.cache_clear()


def test_a_function_not_reading_the_global_is_not_copied() -> None:
    def export(self: Any, spans: Any) -> Any:
        return spans

    assert otlp_exporters._with_global(export, "encode_spans", len) is None
    assert otlp_exporters._with_global(print, "encode_spans", len) is None


# ---- attnscope's real spans, through the exporters it builds, to a receiver ---------------------


class _Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def _model_spans() -> list[ReadableSpan]:
    """The spans of an instrumented Llama's generate(), every call traced (the kept encodings
    meet the repeats and the variety of real spans), and an error span."""
    from transformers import LlamaConfig, LlamaForCausalLM

    keep = _Keep()
    attnscope.configure(exporter=keep, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, vocab_size=100)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model)
    with torch.inference_mode():
        model.generate(torch.randint(0, 100, (2, 8)), max_new_tokens=4, do_sample=False,
                       pad_token_id=0)

    @attnscope.trace
    def broken(q: torch.Tensor) -> None:
        raise ValueError("no")

    with pytest.raises(ValueError):
        broken(torch.ones(2, 3))
    assert attnscope.flush(timeout_s=30)
    attnscope.shutdown()
    assert len(keep.spans) >= 9 and any(s.events for s in keep.spans)
    return keep.spans


def test_attnscope_spans_are_written_exactly_as_the_sdk_writes_them() -> None:
    spans = _model_spans()
    assert installed().encode(spans) == _sdk(spans)


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_the_built_exporter_sends_what_the_sdk_would(monkeypatch: pytest.MonkeyPatch,
                                                    protocol: str) -> None:
    spans = _model_spans()
    collector = (GRPCCollector if protocol == "grpc" else HTTPCollector)("ok").start()
    try:
        endpoint = collector.endpoint if protocol == "grpc" else collector.endpoint + "/v1/traces"
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", protocol)
        exporter = destinations.make_exporter("otlp")
        assert type(exporter) is (otlp_exporters.grpc_exporter_class() if protocol == "grpc"
                                  else otlp_exporters.http_exporter_class())
        assert exporter is not None
        try:
            assert exporter.export(spans) is SpanExportResult.SUCCESS
        finally:
            exporter.shutdown()
        assert len(collector.trace_requests) == 1
        assert collector.trace_requests[0] == ExportTraceServiceRequest.FromString(_sdk(spans))
    finally:
        collector.stop()


def test_the_encoding_benchmark_runs_and_compares_equal_requests(
        capsys: pytest.CaptureFixture[str]) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    try:
        import bench_encode

        bench_encode.main(["--rounds", "1", "--batches", "1"])
    finally:
        sys.path.pop(0)
    out = capsys.readouterr().out
    assert "attnscope / SDK:" in out and "512 spans" in out


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_an_applications_provider_can_use_the_exporter(protocol: str) -> None:
    """``attnscope.exporters.otlp_span_exporter`` in the application's own provider: its spans
    and attnscope's arrive as the SDK would have sent each of them."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from attnscope.exporters import otlp_span_exporter

    collector = (GRPCCollector if protocol == "grpc" else HTTPCollector)("ok").start()
    try:
        endpoint = collector.endpoint if protocol == "grpc" else collector.endpoint + "/v1/traces"
        extra = {"insecure": True} if protocol == "grpc" else {}
        exporter = otlp_span_exporter(protocol, endpoint=endpoint, **extra)
        kept = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        provider.add_span_processor(SimpleSpanProcessor(kept))
        attnscope.configure(tracer_provider=provider, sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0, profile_rate=0.0)

        @attnscope.trace
        def attention(q: torch.Tensor) -> torch.Tensor:
            return q * 2

        with provider.get_tracer("app").start_as_current_span("request", attributes={"n": 3}):
            attention(torch.ones(2, 4, 8, 16))
        assert attnscope.flush(timeout_s=30)
        attnscope.shutdown()
        provider.shutdown()
        sent = {s.span_id: s for req in collector.trace_requests for rs in req.resource_spans
                for ss in rs.scope_spans for s in ss.spans}
        finished = kept.get_finished_spans()
        assert len(finished) == 2 and len(sent) == 2
        for span in finished:
            [expected] = encode_spans([span]).resource_spans[0].scope_spans[0].spans
            assert sent[expected.span_id] == expected
    finally:
        collector.stop()


def test_the_exporter_factory_names_the_protocols_it_knows() -> None:
    from attnscope.exporters import otlp_span_exporter

    with pytest.raises(ValueError, match="http/protobuf"):
        otlp_span_exporter("http/json")


def test_attnscope_holds_event_and_link_attributes_as_the_sdks_spans_do() -> None:
    """The SDK's own spans hold an event's and a link's attributes bounded; its OTLP encoder
    before 1.26 read their dropped count there, and a plain dict failed the whole batch."""
    from attnscope._spans import emit

    error = next(s for s in _model_spans() if s.events)
    assert all(isinstance(e.attributes, BoundedAttributes) for e in error.events)
    links = emit._bounded_links([Link(SpanContext(1, 2, False)),
                                 Link(SpanContext(1, 3, False), {"attnscope.link": "slow_call"}),
                                 Link(SpanContext(1, 4, False), BoundedAttributes(attributes={}))])
    assert all(isinstance(link.attributes, BoundedAttributes) for link in links)
    assert [dict(link.attributes) for link in links] == [{}, {"attnscope.link": "slow_call"}, {}]
    assert [link.context.span_id for link in links] == [2, 3, 4]


def test_a_serialized_request_is_its_bytes_and_else_the_message() -> None:
    """What the HTTP exporter gets: the bytes when it serializes, the parsed message for anything
    else a release might ask of it."""
    spans = _random_spans(5, 20)
    request = otlp_exporters.encode_serialized(spans)
    assert isinstance(request, otlp_exporters.Serialized)
    assert request.SerializePartialToString() == request.SerializeToString() == _sdk(spans)
    assert request.ByteSize() == len(_sdk(spans))
    assert request.SerializeToString(deterministic=True) == _sdk(spans)
    expected = encode_spans(spans)
    # compared as bytes: a NaN attribute makes equal messages unequal in some protobuf releases
    assert [rs.SerializeToString() for rs in request.resource_spans] == \
        [rs.SerializeToString() for rs in expected.resource_spans]
    huge = ReadableSpan(name="s", context=SpanContext(1, 2, False), attributes={"big": 1 << 64},
                        resource=Resource({}))
    # a request it cannot write: the SDK's message (which drops the attribute, and says so)
    assert otlp_exporters.encode_serialized([huge]) == encode_spans([huge])
