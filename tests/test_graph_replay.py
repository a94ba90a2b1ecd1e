"""CUDA graphs on CPU: a fake graph class and fake events drive capture, replay and the worker.

The fake GPU records an event at once outside a capture; during a capture an event's record is a
node of the graph, which every replay records again (as ``external=True`` events are in CUDA).
What needs a real GPU (the events' timestamps, the graph's output) is in
tests/gpu/test_graph_replay.py.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import device, graphs
from attnscope._capture.device import CudaEventPool
from attnscope._record import graphs as record_graphs
from attnscope._record.capture import DeviceMemory
from attnscope._runtime import runtime
from attnscope._worker import cuda as worker_cuda
from attnscope.testing import capture_spans

from .support.helpers import attrs, calls_on

STEP_MS = 1.5  # device time between two consecutive events the fake GPU passes


class FakeGpu:
    """A device whose work completes when the test says so; ``capture``: the graph capturing."""

    def __init__(self) -> None:
        self.clock_ms = 0.0
        self.recorded = 0
        self.done_until = -1
        self.capture: list[FakeEvent] | None = None

    def finish_all(self) -> None:
        self.done_until = self.recorded


class FakeEvent:
    def __init__(self, gpu: FakeGpu) -> None:
        self.gpu = gpu
        self.index = -1
        self.at_ms = 0.0

    def record(self, stream: Any = None) -> None:
        if self.gpu.capture is not None:  # a node of the graph: recorded by each replay
            self.gpu.capture.append(self)
            return
        self.fire()

    def fire(self) -> None:
        gpu = self.gpu
        gpu.recorded += 1
        gpu.clock_ms += STEP_MS
        self.index, self.at_ms = gpu.recorded, gpu.clock_ms

    def query(self) -> bool:
        return 0 <= self.index <= self.gpu.done_until

    def elapsed_time(self, end_event: FakeEvent) -> float:
        assert self.query() and end_event.query(), "elapsed_time before both events passed"
        return end_event.at_ms - self.at_ms

    def synchronize(self) -> None:
        raise AssertionError("attnscope must never wait on the device")


def _graph_class(gpu: FakeGpu, end_error: Exception | None = None) -> type:
    class FakeGraph:
        """capture_begin / capture_end / replay as torch.cuda.CUDAGraph has them."""

        def __init__(self) -> None:
            self.nodes: list[FakeEvent] = []
            self.replays = 0

        def capture_begin(self, pool: Any = None, capture_error_mode: str = "global") -> None:
            gpu.capture = self.nodes = []

        def capture_end(self) -> None:
            gpu.capture = None
            if end_error is not None:
                raise end_error

        def replay(self) -> None:
            self.replays += 1
            for node in self.nodes:
                node.fire()

    return FakeGraph


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeGpu]:
    """Traced calls look like CUDA calls; the fake graph class is patched as CUDAGraph is."""
    fake = FakeGpu()
    cuda0 = torch.device("cuda", 0)
    # a call with a tensor is on "cuda:0"; one without, on none
    calls_on(monkeypatch, lambda real: cuda0 if real is not None else None)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: fake.capture is not None)
    monkeypatch.setattr(runtime.device, "event_pool",
                        CudaEventPool(make_event=lambda: FakeEvent(fake)))

    def before(dev: Any, reset: bool) -> DeviceMemory:
        assert fake.capture is None, "no allocator reading during a capture"
        return DeviceMemory(dev, 1000, 1000, reset)

    def after(mem: DeviceMemory) -> None:
        mem.allocated_after, mem.peak_after = 1000, 1000

    monkeypatch.setattr(device, "memory_before", before)
    monkeypatch.setattr(device, "memory_after", after)
    monkeypatch.setattr(torch.cuda, "synchronize", _no_sync, raising=False)
    monkeypatch.setattr(worker_cuda.DeviceAccess, "prepare", lambda self, dev: None)
    monkeypatch.setattr(worker_cuda.DeviceAccess, "reading",
                        lambda self, dev: contextlib.nullcontext())
    cls = _graph_class(fake)
    assert graphs.install(cls)
    fake.graph_class = cls  # type: ignore[attr-defined]
    yield fake
    graphs.uninstall(cls)


def _cache_arg(model: Any, cache: Any) -> dict[str, Any]:
    """The cache keyword of this transformers release (``cache`` from 5.x, ``past_key_values``
    before; the old name warns where the new one exists)."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def _no_sync(*a: Any) -> None:
    raise AssertionError("attnscope must never synchronize the device")


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


@attnscope.trace
def masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           attn_mask: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


@attnscope.trace
def layer(q: torch.Tensor) -> torch.Tensor:
    return attention(q, q, q)


Q = torch.randn(1, 2, 16, 8)


def _capture(gpu: FakeGpu, calls: int = 3, fn: Any = attention) -> Any:
    graph = gpu.graph_class()  # type: ignore[attr-defined]
    graph.capture_begin()
    try:
        for _ in range(calls):
            fn(Q, Q, Q) if fn is attention else fn(Q)
    finally:
        graph.capture_end()
    return graph


def _by_name(spans: list[Any]) -> tuple[Any, list[Any]]:
    (replay,) = [s for s in spans if s.name == record_graphs.REPLAY_NAME]
    return replay, [s for s in spans if s is not replay]


def test_a_sampled_replay_has_one_span_per_captured_call(gpu: FakeGpu) -> None:
    with capture_spans() as spans:
        graph = _capture(gpu)
        assert spans == [] and gpu.recorded == 0  # nothing ran on the device during the capture
        graph.replay()
        gpu.finish_all()
    replay, calls = _by_name(spans)
    r = attrs(replay)
    # the replay's pair around 6 graph nodes: 7 steps of the fake GPU
    assert r["attnscope.device_ns"] == int(7 * STEP_MS * 1e6)
    assert r["attnscope.graph.calls"] == 3 and r["attnscope.graph.replay"] == 1
    assert r["attnscope.graph.attention_ns"] == int(3 * STEP_MS * 1e6)
    assert r["attnscope.graph.attention_share"] == pytest.approx(3 / 7, abs=1e-4)
    assert "attnscope.graph.calls_lost" not in r
    assert len(calls) == 3
    for span in calls:
        a = attrs(span)
        assert span.name == "attention"
        assert span.parent.span_id == replay.context.span_id
        assert a["attnscope.replayed"] is True
        assert a["attnscope.device_ns"] == int(STEP_MS * 1e6)
        assert a["attnscope.flops"] == 4 * 1 * 2 * 16 * 16 * 8
        assert a["attnscope.tflops"] == pytest.approx(a["attnscope.flops"] / 1.5e6 / 1e3, rel=1e-3)
    # placed in capture order at their offsets in the replay: 1.5, 4.5, 7.5 ms after its start
    starts = sorted(s.start_time - replay.start_time for s in calls)
    assert starts == [int(x * 1e6) for x in (1.5, 4.5, 7.5)]
    stats = attnscope.stats()
    assert stats["graph_replays_sampled"] == 1 and stats["graph_replays_lost"] == 0
    assert stats["captured"] == stats["emitted"] == 4


def test_every_replay_is_sampled_like_a_call(gpu: FakeGpu) -> None:
    with capture_spans(sample_rate=0.0) as spans:  # nothing is sampled: not the replays either
        graph = _capture(gpu)
        for _ in range(5):
            graph.replay()
        gpu.finish_all()
    assert spans == []
    assert graph.replays == 5
    assert gpu.recorded == 5 * 6  # the graph's own nodes only: no event around an unsampled replay
    rec = graphs.record_of(graph)
    assert rec is not None and rec.generation == 5


def test_a_replay_launched_before_the_reading_makes_the_earlier_one_lost(gpu: FakeGpu) -> None:
    with capture_spans() as spans:
        graph = _capture(gpu)
        graph.replay()
        graph.replay()  # overwrites the first replay's timestamps before the worker read them
        gpu.finish_all()
    replays = sorted((s for s in spans if s.name == record_graphs.REPLAY_NAME),
                     key=lambda s: attrs(s)["attnscope.graph.replay"])
    first, second = (attrs(s) for s in replays)
    assert first["attnscope.graph.calls_lost"] == 3 and "attnscope.graph.attention_ns" not in first
    assert first["attnscope.device_ns"] == int(7 * STEP_MS * 1e6)  # its own pair is its own
    assert "attnscope.graph.calls_lost" not in second
    children = [s for s in spans if s.name == "attention"]
    assert len(children) == 3
    assert {c.parent.span_id for c in children if c.parent} == {replays[1].context.span_id}
    stats = attnscope.stats()
    assert stats["graph_replays_lost"] == 1 and stats["graph_replays_sampled"] == 2
    assert stats["captured"] == stats["emitted"] == 5


def test_calls_past_the_graphs_event_pairs_are_counted(gpu: FakeGpu,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(record_graphs, "MAX_GRAPH_CALLS", 2)
    with capture_spans() as spans:
        graph = _capture(gpu, calls=3)
        graph.replay()
        gpu.finish_all()
    replay, calls = _by_name(spans)
    assert attrs(replay)["attnscope.graph.calls"] == 2
    assert attrs(replay)["attnscope.graph.calls_over_cap"] == 1
    assert len(calls) == 2
    assert attnscope.stats()["graph_calls_over_cap"] == 1


def test_nested_captured_calls_keep_their_nesting(gpu: FakeGpu) -> None:
    with capture_spans() as spans:
        graph = _capture(gpu, calls=1, fn=layer)
        graph.replay()
        gpu.finish_all()
    replay, calls = _by_name(spans)
    outer = next(s for s in calls if s.name == "layer")
    inner = next(s for s in calls if s.name == "attention")
    assert outer.parent.span_id == replay.context.span_id
    assert inner.parent.span_id == outer.context.span_id
    # the outer call's time holds the inner one's: attention time counts it once
    assert attrs(replay)["attnscope.graph.attention_ns"] == attrs(outer)["attnscope.device_ns"]


def test_a_mask_captured_into_a_graph_is_not_read(gpu: FakeGpu) -> None:
    mask = torch.ones(16, 16, dtype=torch.bool).tril()
    with capture_spans() as spans:
        graph = gpu.graph_class()  # type: ignore[attr-defined]
        graph.capture_begin()
        masked(Q, Q, Q, mask)
        graph.capture_end()
        mask.fill_(True)  # the graph's buffer changes between replays: no count is this replay's
        graph.replay()
        gpu.finish_all()
    _, (call,) = _by_name(spans)
    a = attrs(call)
    assert a["attnscope.exact"] is False
    assert a["attnscope.inexact_reason"] == "mask_not_kept"
    assert a["attnscope.flops"] == 4 * 1 * 2 * 16 * 16 * 8  # from the shapes: an upper bound
    assert runtime.retention.kept_bytes == 0  # the template keeps no tensor alive


def test_nothing_is_sampled_or_allocated_during_the_capture(gpu: FakeGpu) -> None:
    with capture_spans():
        graph = gpu.graph_class()  # type: ignore[attr-defined]
        graph.capture_begin()
        sampled = runtime.sampler.sampled
        attention(Q, Q, Q)
        attention(Q, Q, Q)
        assert attention.__wrapped__  # type: ignore[attr-defined]
        key = f"{attention.__module__}.attention:"  # not another test file's "attention"
        site = next(s for s in list(runtime.sampler._sites) if s.key == key)
        assert site.countdown == 1  # the capture's next call comes to the wrapper too
        graph.capture_end()
        assert runtime.sampler.sampled == sampled  # templates are not samples
        assert len(gpu.capture or graph.nodes) == 4  # two external pairs, nothing else
        assert site.countdown == 0  # every site draws afresh after the capture
        assert runtime.graphs.capturing == {}


def test_a_failed_capture_keeps_no_record(gpu: FakeGpu) -> None:
    cls = _graph_class(gpu, end_error=RuntimeError("operation not permitted when capturing"))
    graphs.install(cls)
    try:
        with capture_spans() as spans:
            graph = cls()
            graph.capture_begin()
            attention(Q, Q, Q)
            with pytest.raises(RuntimeError, match="not permitted"):  # the user's, unchanged
                graph.capture_end()
            graph.replay()
            gpu.finish_all()
    finally:
        graphs.uninstall(cls)
    assert graphs.record_of(graph) is None and runtime.graphs.capturing == {}
    assert spans == []


def test_a_call_on_another_thread_during_a_capture_is_decided_as_usual(gpu: FakeGpu) -> None:
    with capture_spans(sample_rate=0.0) as spans:
        graph = gpu.graph_class()  # type: ignore[attr-defined]
        graph.capture_begin()
        attention(Q, Q, Q)
        other = threading.Thread(target=attention, args=(Q, Q, Q))
        other.start()
        other.join()
        graph.capture_end()
    assert spans == []
    rec = graphs.record_of(graph)
    assert rec is not None and len(rec.templates) == 1  # the capturing thread's call only


def test_the_replay_returns_what_the_graph_returns_and_its_errors_pass(gpu: FakeGpu) -> None:
    cls = gpu.graph_class  # type: ignore[attr-defined]
    with capture_spans():
        graph = _capture(gpu, calls=1)
        assert graph.replay() is None
        out = attention(Q, Q, Q)  # eager again after the capture: traced as before
        assert torch.equal(out, torch.nn.functional.scaled_dot_product_attention(Q, Q, Q))
        graph.nodes = None  # the fake's replay now raises TypeError
        with pytest.raises(TypeError):
            graph.replay()
        gpu.finish_all()
    assert cls.replay.__wrapped__ is not None


def test_install_patches_torchs_cudagraph_once_and_uninstall_restores_it() -> None:
    cls = torch.cuda.CUDAGraph
    graphs.uninstall(cls)  # the suite's trace() calls installed it already
    before = {name: cls.__dict__[name] for name in ("capture_begin", "capture_end", "replay")}
    try:
        attnscope.trace(lambda x: x)  # a call site made while torch is loaded installs it
        assert cls in runtime.graphs.hooks
        for name, original in before.items():
            assert cls.__dict__[name] is not original
            assert cls.__dict__[name].__wrapped__ is original
        assert not graphs.install(cls)  # once
        assert graphs.uninstall(cls)
        assert {name: cls.__dict__[name] for name in before} == before
        # the paths replays come from call these methods on the instance, so the class's are
        # the ones they run: torch.cuda.graph() (by hand, transformers) and cudagraph trees
        import inspect

        from torch._inductor import cudagraph_trees

        assert ".capture_begin(" in inspect.getsource(torch.cuda.graph.__enter__)
        assert ".capture_end(" in inspect.getsource(torch.cuda.graph.__exit__)
        trees = inspect.getsource(cudagraph_trees)
        assert "torch.cuda.graph(" in trees and ".graph.replay()" in trees
    finally:
        graphs.install(cls)



def prefilled_llama(layers: int) -> tuple[Any, Any]:
    """A tiny sdpa Llama and its static cache, prefilled with 8 tokens (a decode step's start)."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=layers, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    cache = transformers.StaticCache(config=cfg, max_cache_len=32)
    with torch.no_grad():
        model(input_ids=torch.arange(8)[None], **_cache_arg(model, cache), use_cache=True)
    return model, cache

def _replayed(gpu: FakeGpu, call: Any) -> list[Any]:
    """The spans of one replay of a graph captured around ``call()`` (no grad)."""
    with capture_spans() as spans:
        graph = gpu.graph_class()  # type: ignore[attr-defined]
        graph.capture_begin()
        with torch.no_grad():
            call()
        graph.capture_end()
        graph.replay()
        gpu.finish_all()
    return spans


def test_a_layers_cache_length_is_not_taken_from_the_capture(gpu: FakeGpu) -> None:
    """A decode graph is replayed over advancing positions: the length the layer's cache had at
    capture is not the replay's, so the layer's figures that need it are marked, not guessed."""
    model, cache = prefilled_llama(layers=1)
    attnscope.instrument(model)
    try:
        spans = _replayed(gpu, lambda: model(input_ids=torch.tensor([[9]]),
                                             **_cache_arg(model, cache), use_cache=True,
                                             cache_position=torch.tensor([8])))
    finally:
        attnscope.uninstrument(model)
    _, calls = _by_name(spans)
    layer = next(s for s in calls if "self_attn" in s.name)
    a = attrs(layer)
    assert a["attnscope.replayed"] is True and a["attnscope.num_heads"] == 4
    assert a["attnscope.exact"] is False and a["attnscope.inexact_reason"] == "cache_unread"
    assert "attnscope.kv_cache_len" not in a and "attnscope.flops" not in a


def test_a_layers_traits_are_kept_in_its_template(gpu: FakeGpu) -> None:
    """What a layer's structure adds is the same on every replay: a differential-attention
    layer (two attention cores a call) keeps both in a graph's span, as in an eager call's."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.DiffLlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                       num_hidden_layers=1, num_attention_heads=4,
                                       num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.DiffLlamaForCausalLM(cfg).eval()
    ids = torch.arange(8)[None]
    attnscope.instrument(model)
    try:
        with capture_spans() as eager:
            with torch.no_grad():
                model(input_ids=ids, use_cache=False)
            gpu.finish_all()
        spans = _replayed(gpu, lambda: model(input_ids=ids, use_cache=False))
    finally:
        attnscope.uninstrument(model)
    _, calls = _by_name(spans)
    replayed = attrs(next(s for s in calls if "self_attn" in s.name))
    called = attrs(next(s for s in eager if "self_attn" in s.name))
    # 2 cores x 4 heads x 36 causal (query, key) pairs x 4 FLOPs a pair and head dimension (8)
    assert called["attnscope.flops"] == 2 * 4 * 36 * 4 * 8
    assert replayed["attnscope.replayed"] is True
    # the mask is not read in a graph: the count is the causal bound, marked so
    assert replayed["attnscope.flops"] == called["attnscope.flops"]
    assert replayed["attnscope.exact"] is False


def test_a_templates_compressed_entries_wait_for_a_cache_length() -> None:
    """The tokens a layer's cache had seen (DeepSeek V4's compressed entries follow them) are the
    capture's, like its length: a cached template drops them; one with no cache keeps its 0."""
    from attnscope._capture.graph_calls import _facts_shapes_only
    from attnscope._record.facts import AttentionFacts, Facts, LayerTraits

    traits = LayerTraits(compressed=(4, 2), seen=12)
    for cached, past, seen in ((True, 12, None), (False, None, 12)):
        facts = AttentionFacts(1, 1)
        facts.cached, facts.past = cached, past
        kept = _facts_shapes_only(Facts(facts, traits))
        assert kept.traits is not None and kept.traits.compressed == (4, 2)
        assert kept.traits.seen == seen


def test_a_replay_that_takes_arguments_gets_them(gpu: FakeGpu) -> None:
    class WithArgs:
        nodes: list[FakeEvent] = []
        replays = 0

        def capture_begin(self) -> None:
            gpu.capture = self.nodes = []

        def capture_end(self) -> None:
            gpu.capture = None

        def replay(self, times: int = 1, *, note: str = "") -> str:
            self.replays = times
            for _ in range(times):
                for node in self.nodes:
                    node.fire()
            return note

    graphs.install(WithArgs)
    try:
        with capture_spans() as spans:
            graph = WithArgs()
            graph.capture_begin()
            attention(Q, Q, Q)
            graph.capture_end()
            assert graph.replay(2, note="x") == "x"
            gpu.finish_all()
    finally:
        graphs.uninstall(WithArgs)
    assert graph.replays == 2
    replay, calls = _by_name(spans)
    assert attrs(replay)["attnscope.graph.replay"] == 1 and len(calls) == 1


def test_another_threads_draw_does_not_let_the_captures_next_call_by(gpu: FakeGpu) -> None:
    with capture_spans(sample_rate=0.001):  # a draw on the other thread skips many calls
        graph = gpu.graph_class()  # type: ignore[attr-defined]
        graph.capture_begin()
        attention(Q, Q, Q)
        other = threading.Thread(target=attention, args=(Q, Q, Q))
        other.start()
        other.join()
        attention(Q, Q, Q)  # the countdown is shared: still the capture's call
        graph.capture_end()
    rec = graphs.record_of(graph)
    assert rec is not None and len(rec.templates) == 2


@attnscope.trace
def host_side(x: int) -> int:
    return x + 1


@attnscope.trace
def layer_with_host_work(q: torch.Tensor) -> torch.Tensor:
    host_side(1)  # no tensor: sampled as usual during the capture, not kept for the graph
    return attention(q, q, q)


def test_a_call_sampled_inside_a_captured_one_goes_under_the_enclosing_span(
        gpu: FakeGpu) -> None:
    with capture_spans() as spans:
        with attnscope.span("warm-up"):
            graph = gpu.graph_class()  # type: ignore[attr-defined]
            graph.capture_begin()
            layer_with_host_work(Q)
            graph.capture_end()
        gpu.finish_all()
    assert attnscope.stats()["pending"] == 0  # nothing waits for a parent that never comes
    (block,) = [s for s in spans if s.name == "warm-up"]
    (host,) = [s for s in spans if s.name == "host_side"]
    assert host.parent is not None and host.parent.span_id == block.context.span_id
    rec = graphs.record_of(graph)
    assert rec is not None and [t.name for t in rec.templates] == ["attention",
                                                                   "layer_with_host_work"]
