"""Issue 37 goal 4: a span's work per call on the worker, with the same texts and ids."""

from __future__ import annotations

import random
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator

from attnscope._export.ids import Ids
from attnscope._runtime import runtime
from attnscope._spans import summary as readable
from attnscope._spans.emit import DirectEmitter
from attnscope._spans.summary import Summaries

_SHAPE = {"attnscope.flops": 4096, "attnscope.batch_size": 1, "attnscope.num_heads": 2,
          "attnscope.seq_len_q": 4, "attnscope.head_dim": 8}
_SITE = {"attnscope.module": "m"}


def call_summary(attrs: dict[str, Any]) -> str:
    """A summary built afresh: :meth:`Summaries.call` without kept texts."""
    return Summaries().call(attrs)


def _attrs(wall: int, rss: Any) -> dict[str, Any]:
    return {**_SITE, "attnscope.tier": "timing", **_SHAPE, "attnscope.wall_ns": wall,
            "attnscope.memory.host_rss_bytes": rss, "attnscope.tflops": 4096 / wall / 1e3}


def test_kept_summary_texts_outlive_a_new_rss_reading(monkeypatch: pytest.MonkeyPatch) -> None:
    """A new RSS reading (every 250 ms) no longer rebuilds the kept texts of every shape (9
    spans in 10 rebuilt them in a traced generate()); each summary is the one built afresh."""
    built: list[int] = []
    static_parts = readable._static_parts
    monkeypatch.setattr(readable, "_static_parts",
                        lambda attrs: built.append(1) or static_parts(attrs))
    summaries = Summaries()
    readings = [3 << 20, 3 << 20, 5 << 20, 7 << 30, None, 3 << 20, True]
    for i, rss in enumerate(readings):
        attrs = _attrs(2_000 + i, rss)
        assert summaries.call(attrs, (_SHAPE, _SITE)) == call_summary(attrs)
    assert len(built) == 1 + len(readings)  # one kept text, then one per fresh summary compared


def test_layers_of_one_shape_share_its_texts_unless_their_site_says_otherwise(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The layers of a forward (one site each) share a shape's kept texts, as long as the site's
    attributes hold no part of them; a site that does gets its own, built from its values."""
    built: list[int] = []
    static_parts = readable._static_parts
    monkeypatch.setattr(readable, "_static_parts",
                        lambda attrs: built.append(1) or static_parts(attrs))
    summaries = Summaries()
    sites = [{"attnscope.module": f"layers.{i}.self_attn", "attnscope.layer_index": i}
             for i in range(4)]
    for site in sites:
        attrs = {**_attrs(2_000, 3 << 20), **site}
        assert summaries.call(attrs, (_SHAPE, site)) == call_summary(attrs)
    assert len(built) == 1 + len(sites)  # one kept text, then the fresh ones compared
    for own in ({"attnscope.phase": "decode"}, {"attnscope.flops": 8192},
                {"attnscope.dtype": "bfloat16"}):
        site = {**_SITE, **own}
        attrs = {**_attrs(2_000, 3 << 20), **site}
        got = summaries.call(attrs, (_SHAPE, site))
        assert got == call_summary(attrs) and got != call_summary(_attrs(2_000, 3 << 20))


def test_rss_is_the_summarys_last_part() -> None:
    text = call_summary(_attrs(2_000, 5 << 20))
    assert text.endswith(" · RSS 5 MiB")
    assert "RSS" not in call_summary(_attrs(2_000, None))


def test_the_flop_rate_is_rounded_once_from_the_exact_figures() -> None:
    """103,468 FLOP/s: the span keeps tflops to 4 digits (1.035e-7), which read to 3 again
    would say 104 k; the summary says 103 k, from FLOPs ÷ time."""
    from attnscope._derive.result import sig4

    attrs = {**_SITE, "attnscope.tier": "timing", "attnscope.wall_ns": 1_000_000_000,
             "attnscope.flops": 103_468, "attnscope.tflops": sig4(103_468 / 1e9 / 1e3)}
    parts = call_summary(attrs).split(" · ")
    assert parts[:3] == ["1 s wall", "103 kFLOP", "103 kFLOP/s"], parts


def _direct(provider: TracerProvider) -> tuple[DirectEmitter, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    delivery = type("Delivery", (), {"lock": __import__("threading").Lock(), "to_export": 0})()
    return DirectEmitter(provider, processor, "attnscope", "0", delivery), exporter


def test_direct_emitter_draws_attnscopes_generators_ids_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """With attnscope's own generator (export.ids) the ids are its draws (the same values,
    seeded), made without calling the generator; any other generator, the SDK's
    RandomIdGenerator too, is asked per span."""
    ids = Ids()
    provider = TracerProvider(id_generator=ids)
    asked: list[str] = []
    monkeypatch.setattr(ids, "generate_span_id", lambda: asked.append("span") or 1)
    monkeypatch.setattr(ids, "generate_trace_id", lambda: asked.append("trace") or 1)
    emitter, exporter = _direct(provider)
    runtime.ids.rng.seed(37)  # the test's own seed: the suite's reset seeds it afresh after
    trace_id, span_id = runtime.ids.rng.getrandbits(128), runtime.ids.rng.getrandbits(64)
    runtime.ids.rng.seed(37)
    random.seed(37)  # the random module's state is not what it draws from
    sc = emitter.emit("call", None, {"a": 1}, 1, 2)
    assert sc is not None and (sc.trace_id, sc.span_id) == (trace_id, span_id)
    assert asked == []
    [span] = exporter.get_finished_spans()
    assert span.context == sc and span.context.is_valid

    class Counting(RandomIdGenerator):
        def generate_span_id(self) -> int:
            asked.append("own span")
            return 7

    other = TracerProvider(id_generator=Counting())
    emitter, _ = _direct(other)
    sc = emitter.emit("call", None, {}, 1, 2)
    assert sc is not None and sc.span_id == 7 and asked == ["own span"]


def test_a_zero_draw_is_drawn_again_by_the_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    ids = Ids()
    ids.bits = lambda bits: 0  # type: ignore[method-assign]
    provider = TracerProvider(id_generator=ids)
    emitter, _ = _direct(provider)
    monkeypatch.setattr(ids, "generate_span_id", lambda: 5)
    monkeypatch.setattr(ids, "generate_trace_id", lambda: 9)
    sc = emitter.emit("call", None, {}, 1, 2)
    assert sc is not None and (sc.trace_id, sc.span_id) == (9, 5)


def test_attnscopes_generator_never_gives_zero() -> None:
    ids = Ids()
    draws = iter([0, 0, 3, 0, 4])
    ids.bits = lambda bits: next(draws)  # type: ignore[method-assign]
    assert (ids.generate_span_id(), ids.generate_trace_id()) == (3, 4)
