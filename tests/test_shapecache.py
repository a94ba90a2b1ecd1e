"""What the worker keeps between spans to be cheap changes no span: same attributes, same order.

The worker keeps derive's attributes per argument summary (``worker.shapecache``), decides the
SDK's fixed samplers once (``worker.emit``), keeps metric labels per label values
(``export.metrics``) and remembers the last call site's latency estimates (``worker.latency``).
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    ParentBased,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import INVALID_SPAN_CONTEXT, SpanContext, TraceFlags, TraceState

import attnscope
from attnscope._export import metrics as _metrics
from attnscope._record.capture import (
    NO_FACTS,
    TIER_TIMING,
    AttentionFacts,
    Capture,
    Facts,
    HostCopy,
    HostKind,
    TensorMeta,
)
from attnscope._runtime import runtime
from attnscope._spans import emit
from attnscope._worker import engine, shapecache
from attnscope._worker.latency import Escalator

SETTINGS: dict[str, Any] = {"sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0,
                            "profile_rate": 0.0, "metrics": False}
_PER_CALL = ("_ns", "tflops", "tokens_per_s", "host_rss_bytes", "summary")
_MODEL_NUMBER = ("attnscope.model", "attnscope.model.instance")


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: Any = False,
              attn_mask: Any = None) -> torch.Tensor:
    return q


class Layer:
    is_causal = True

    @attnscope.trace
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return q


def _workload() -> None:
    q, k = torch.ones(2, 4, 8, 16), torch.ones(2, 2, 8, 16)
    mask = torch.ones(2, 1, 8, 8, dtype=torch.bool).tril()
    layer = Layer()
    for _ in range(2):  # the second round of each shape comes from what the worker kept
        attention(q, k, k)
        attention(q, k, k, is_causal=True)
        attention(q, k, k, is_causal=1)  # an int is not causality: a key of its own
        attention(q, k, k, is_causal=1.0)
        attention(q[:1], k[:1], k[:1], is_causal=True)
        attention(q, k, k, attn_mask=mask)  # a kept mask: named by its value
        attention(torch.ones(3, 5), torch.ones(3, 5), torch.ones(3, 5))
        layer.forward(q, k, k)  # an instance: read per call
        with attnscope.span("block", tokens=3, attributes={"attnscope.flops": 7}):
            attention(q, k, k, is_causal=True)
        with attnscope.sampling(force=True):
            attention(q, k, "not a tensor")  # left out of the summary


def _llama() -> Any:
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa", pad_token_id=0, eos_token_id=None, bos_token_id=None)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).eval()


def _models() -> None:
    """Instrumented layers: their facts are kept too (a mask named by its value)."""
    mha = torch.nn.MultiheadAttention(16, 4, batch_first=True).eval()
    llama = _llama()
    attnscope.instrument(mha)
    attnscope.instrument(llama)
    x = torch.ones(2, 5, 16)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    ids = torch.tensor([[1, 2, 3, 4], [0, 0, 5, 6]])
    with torch.inference_mode():
        for _ in range(2):
            mha(x, x, x, need_weights=False)
            mha(x, x, x, key_padding_mask=pad, need_weights=False)
            llama.generate(ids[:1], max_new_tokens=3, do_sample=False)
            llama.generate(ids, attention_mask=(ids != 0).long(), max_new_tokens=2,
                           do_sample=False)


def _spans(monkeypatch: pytest.MonkeyPatch, keep: bool) -> list[ReadableSpan]:
    with monkeypatch.context() as patch:
        if not keep:  # every capture derived on its own, as before there was a cache
            patch.setattr(engine, "summary_key", lambda *args: None)
        exporter = InMemorySpanExporter()
        attnscope.configure(exporter=exporter, **SETTINGS)
        _workload()
        _models()
        assert attnscope.flush(timeout_s=10)
        if keep:
            assert runtime.worker.current.engine._shapes.hits > 0
        spans = list(exporter.get_finished_spans())
        attnscope.shutdown()
    return spans


def _seen(span: ReadableSpan) -> tuple[Any, ...]:
    # the models of the second pass are new ones, numbered after the first pass's
    attrs = {k: v for k, v in (span.attributes or {}).items() if k not in _MODEL_NUMBER}
    values = [(k, v) for k, v in attrs.items() if not k.endswith(_PER_CALL)]
    return span.name, list(attrs), values, span.status.status_code.name


def test_kept_attributes_are_those_derived_per_call(monkeypatch: pytest.MonkeyPatch) -> None:
    per_call = _spans(monkeypatch, keep=False)
    kept = _spans(monkeypatch, keep=True)
    assert len(kept) == len(per_call) > 22
    assert [_seen(s) for s in kept] == [_seen(s) for s in per_call]  # names, order, values
    causal = [dict(s.attributes or {}).get("attnscope.causal") for s in kept[:4]]
    assert causal == [None, True, None, None]  # True, not 1 or 1.0, says causal
    assert kept[1].attributes == {**kept[1].attributes}
    assert "attnscope.tflops" in (kept[1].attributes or {})


def test_worker_keeps_plain_summaries_only_and_reuses_them() -> None:
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    _workload()
    assert attnscope.flush(timeout_s=10)
    kept = runtime.worker.current.engine._shapes
    # the summaries of one round: all but the instance's (the block's inner call has the summary
    # of the one before it; the masked call's is named by its mask's value)
    assert len(kept) == 9
    assert kept.misses == 9 and kept.hits == 11


def test_summary_key_refuses_what_derive_reads_per_call() -> None:
    meta = TensorMeta((1, 2, 3, 4), torch.float32, torch.device("cpu"))
    assert shapecache.summary_key([("q", meta), ("is_causal", True)], None) is not None
    assert shapecache.summary_key([("q", meta)], object()) is None
    assert shapecache.summary_key([("mask", torch.ones(2))], None) is None
    assert shapecache.summary_key([("mask", HostCopy(torch.ones(1), HostKind.INT))], None) is None
    facts = AttentionFacts(1, 2)
    layer = object()  # an instrumented layer's facts say all derive reads: its instance is not
    assert shapecache.summary_key([], layer, Facts(facts)) is not None
    for field, value in (("mask", torch.ones(1, 2)),
                         ("past", HostCopy(torch.ones(1), HostKind.INT)),
                         ("past", torch.tensor(3))):
        odd = AttentionFacts(1, 2)
        setattr(odd, field, value)
        assert shapecache.summary_key([], layer, Facts(odd)) is None
    one, true = AttentionFacts(1, 2), AttentionFacts(1, 2)
    one.past, true.past = 1, True  # True is no cache length (derive reads it as unknown)
    assert shapecache.summary_key([], None, Facts(one)) != shapecache.summary_key(
        [], None, Facts(true))
    keys = {shapecache.summary_key([("is_causal", v)], None) for v in (True, 1, 1.0)}
    assert len(keys) == 3  # equal values, hashed alike, read differently


def test_a_mask_is_named_by_its_value_or_its_copys_numbers() -> None:
    from attnscope._runtime.masks import MAX_BYTES, MaskMemo

    memo, layer = MaskMemo(), object()

    def key(mask: Any, device_reads: bool = True) -> Any:
        facts = AttentionFacts(2, 3)
        facts.mask = mask
        return shapecache.summary_key([], layer, Facts(facts), memo, device_reads)

    mask = torch.ones(2, 1, 3, 3, dtype=torch.bool).tril()
    assert key(mask) is not None and key(mask.clone()) == key(mask)
    changed = mask.clone()
    changed[0, 0, 2, 0] = False
    assert key(changed) not in (key(mask), None)
    assert key(mask, device_reads=False) == key(mask)  # a host tensor is no device read
    assert key(torch.ones(MAX_BYTES + 1, dtype=torch.bool)) is None  # no copy kept: no name
    assert key(mask.as_subclass(_Sub)) is None
    plan = (True, 1, 1)
    numbers = HostCopy(torch.tensor([3, 12, 1, 0, -2, 0, 0, 1, 0]), HostKind.MASK, plan)
    same = HostCopy(torch.tensor([3, 12, 1, 0, -2, 0, 0, 1, 0]), HostKind.MASK, plan)
    assert key(numbers) is not None and key(numbers) == key(same)
    assert key(numbers) != key(HostCopy(numbers.values, HostKind.MASK, (True, 2, 1)))
    assert key(numbers, device_reads=False) is None  # its events timed out: derive reads none
    assert key(HostCopy(torch.tensor([1, 2]), HostKind.INT)) is None
    positions = HostCopy(torch.tensor([1, 2]), HostKind.POSITIONS, (2, 3))
    assert key(positions) not in (None, key(HostCopy(torch.tensor([2, 2]), HostKind.POSITIONS,
                                                     (2, 3))))
    meta = TensorMeta((2, 4, 3, 8), torch.float32, torch.device("cpu"))
    args = [("q", meta), ("k", meta), ("v", meta)]
    traced = shapecache.summary_key([*args, ("attn_mask", mask)], None, NO_FACTS, memo)
    assert traced is not None and traced == shapecache.summary_key(
        [*args, ("attn_mask", mask.clone())], None, NO_FACTS, memo)
    assert shapecache.summary_key([*args, ("attn_mask", changed)], None, NO_FACTS, memo) \
        not in (traced, None)
    assert shapecache.summary_key([*args, ("other", mask)], None, NO_FACTS, memo) is None
    assert shapecache.summary_key([*args, ("attn_mask", numbers)], None, NO_FACTS, memo,
                                  False) is None
    assert shapecache.summary_key([], layer, Facts(AttentionFacts(2, 3)), memo) == \
        shapecache.summary_key([], layer, Facts(AttentionFacts(2, 3)))  # no mask: as before
    odd = AttentionFacts(2, 3)
    odd.mask, odd.past = mask, torch.tensor(3)  # another field not plain: never kept
    assert shapecache.summary_key([], layer, Facts(odd), memo) is None


class _Sub(torch.Tensor):
    pass


def test_shape_cache_is_bounded_and_skips_unhashable_keys() -> None:
    cache = shapecache.ShapeCache(max_entries=3)
    for i in range(5):
        cache.put((i,), ({}, {}))
    assert len(cache) == 3 and cache.get((0,)) is None and cache.get((4,)) is not None
    odd = (("q", TensorMeta(([1],), None, None)),)  # type: ignore[arg-type]
    cache.put(odd, ({}, {}))
    assert cache.get(odd) is None and len(cache) == 3


_PARENTS = [
    None,
    INVALID_SPAN_CONTEXT,
    SpanContext(5, 6, is_remote=True, trace_flags=TraceFlags(1),
                trace_state=TraceState([("k", "v")])),
    SpanContext(5, 6, is_remote=True, trace_flags=TraceFlags(0)),
    SpanContext(5, 6, is_remote=False, trace_flags=TraceFlags(1),
                trace_state=TraceState([("a", "b")])),
    SpanContext(5, 6, is_remote=False, trace_flags=TraceFlags(0)),
]
_FIXED = [ALWAYS_ON, ALWAYS_OFF, DEFAULT_ON, DEFAULT_OFF,
          ParentBased(ALWAYS_OFF, remote_parent_sampled=ALWAYS_OFF,
                      remote_parent_not_sampled=ALWAYS_ON, local_parent_sampled=ALWAYS_OFF,
                      local_parent_not_sampled=ALWAYS_ON)]


@pytest.mark.parametrize("sampler", _FIXED, ids=lambda s: s.get_description()[:40])
@pytest.mark.parametrize("parent", _PARENTS, ids=range(len(_PARENTS)))
def test_fixed_decisions_are_what_the_sampler_says(sampler: Any, parent: Any) -> None:
    fixed = emit._fixed_decisions(sampler)
    assert fixed is not None
    result = sampler.should_sample(emit._parent_context(parent), 1234, "n", emit._INTERNAL, {})
    assert emit._decide(fixed, parent) == (result.decision.is_sampled(),
                                          result.decision.is_recording(), result.trace_state)


class _OwnSampler(StaticSampler):
    pass


@pytest.mark.parametrize("sampler", [TraceIdRatioBased(0.5), ParentBased(TraceIdRatioBased(0.5)),
                                     _OwnSampler(ALWAYS_ON._decision)])
def test_other_samplers_are_asked_per_span(sampler: Any) -> None:
    assert emit._fixed_decisions(sampler) is None


def test_labels_are_kept_per_label_values_and_bounded() -> None:
    reader = InMemoryMetricReader()
    instruments = _metrics._Instruments(MeterProvider(metric_readers=[reader]))
    attrs = {"attnscope.wall_ns": 1000, "attnscope.device": "cpu", "attnscope.tokens": 4}
    first = instruments._labels_of(attrs, "attention")
    assert first == _metrics._labels(attrs, "attention")
    assert instruments._labels_of(dict(attrs), "attention") is first
    listed = {**attrs, "attnscope.module_class": ["not", "a", "label"]}
    assert instruments._labels_of(listed, "x") == ({"attnscope.module_class": "x",
                                                    "attnscope.device": "cpu"},
                                                   (("attnscope.device", "cpu"),
                                                    ("attnscope.module_class", "x")))
    for i in range(_metrics._MAX_LABEL_SETS + 10):
        instruments._labels_of(attrs, f"site{i}")
    assert len(instruments._labels) == _metrics._MAX_LABEL_SETS


class _Site:
    pass


def test_escalator_remembers_the_last_site_without_keeping_it() -> None:
    escalator = Escalator()
    site, other = _Site(), _Site()
    for s in (site, other, site):
        cap = Capture()
        cap.site, cap.tier, cap.end_perf_ns = s, TIER_TIMING, 5_000
        escalator.observe(cap, {}, 0.99)
    assert escalator._sites[site][""].added == 2 and escalator._sites[other][""].added == 1
    gone = weakref.ref(site)
    del site, cap, s
    gc.collect()
    assert gone() is None
