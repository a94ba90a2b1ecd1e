"""CUDA graph replays on a real GPU (issue 40; skipped without CUDA, run by scripts/gpu_check.sh).

A tiny Llama (transformers, from a config) with a static cache: its decode step captured by hand
with ``torch.cuda.graph``, then replayed. Each sampled replay must give one span per attention
layer whose ``device_ns`` is within 5% of events recorded around the same layers eagerly at steady
state, and the graph must compute bit for bit what it computes without attnscope.

"Steady state" for the eager reference: the whole decode step is queued behind a long
``torch.cuda._sleep``, so the GPU runs its kernels back to back as a replay does; without it the
tiny model's eager layers would be timed with the host's launch gaps in them.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import attnscope
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")

DEVICE = "cuda"
PROMPT, MAX_LEN = 1024, 4096  # decode attends over the whole static cache: a call of tens of µs
LAYERS = 4
REPLAYS = 20
TOLERANCE = 0.05


def _cache_arg(model: Any, cache: Any) -> dict[str, Any]:
    """The cache keyword of this transformers release (``cache`` from 5.x, ``past_key_values``
    before; the old name warns where the new one exists)."""
    import inspect

    name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
    return {name: cache}


def _llama() -> Any:
    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=1024, intermediate_size=2048,
                                   num_hidden_layers=LAYERS, num_attention_heads=16,
                                   num_key_value_heads=8, max_position_embeddings=MAX_LEN)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(cfg).to(DEVICE, torch.bfloat16).eval()


class Decode:
    """One decode step over a prefilled static cache, with static inputs (what a graph needs)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.cache = transformers.StaticCache(config=model.config, max_cache_len=MAX_LEN)
        torch.manual_seed(1)
        prompt = torch.randint(0, 512, (1, PROMPT), device=DEVICE)
        with torch.no_grad():
            model(input_ids=prompt, **_cache_arg(model, self.cache), use_cache=True,
                  cache_position=torch.arange(PROMPT, device=DEVICE))
        self.ids = torch.full((1, 1), 7, device=DEVICE)
        self.position = torch.tensor([PROMPT], device=DEVICE)

    def step(self) -> torch.Tensor:
        # eager steps move the cache's own count on (transformers 5: the logits of two steps
        # differ); a replay repeats the step as captured. So every comparison below starts from
        # a fresh Decode and runs the same steps on both sides.
        with torch.no_grad():
            out = self.model(input_ids=self.ids, **_cache_arg(self.model, self.cache),
                             use_cache=True,
                             cache_position=self.position)
        logits: torch.Tensor = out.logits
        return logits


def _capture(decode: Decode) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # warm-up on the capture stream, as torch.cuda.graph's docs ask
            decode.step()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = decode.step()
    return graph, out


def _attention_modules(model: Any) -> list[Any]:
    return [layer.self_attn for layer in model.model.layers]


def _eager_device_ns(decode: Decode) -> list[float]:
    """Per attention layer, the median device time of events recorded around it eagerly, with
    the step queued behind a sleep (no launch gaps)."""
    times: list[list[float]] = [[] for _ in range(LAYERS)]
    pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
    handles = []
    for i, module in enumerate(_attention_modules(decode.model)):
        def before(mod: Any, args: Any, kwargs: Any, i: int = i) -> None:
            start = torch.cuda.Event(enable_timing=True)
            start.record()
            pairs.append((start, start))

        def after(mod: Any, args: Any, kwargs: Any, out: Any, i: int = i) -> None:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            pairs[-1] = (pairs[-1][0], end)

        handles.append(module.register_forward_pre_hook(before, with_kwargs=True))
        handles.append(module.register_forward_hook(after, with_kwargs=True))
    try:
        for _ in range(3):
            decode.step()
        for _ in range(REPLAYS):
            pairs.clear()
            torch.cuda._sleep(50_000_000)  # the host queues the whole step before the GPU starts
            decode.step()
            torch.cuda.synchronize()
            for i, (start, end) in enumerate(pairs):
                times[i].append(start.elapsed_time(end) * 1e6)
    finally:
        for handle in handles:
            handle.remove()
    return [statistics.median(t) for t in times]


@pytest.fixture
def plain_output() -> Iterator[torch.Tensor]:
    """The captured decode step's logits without attnscope."""
    decode = Decode(_llama())
    graph, out = _capture(decode)
    graph.replay()
    torch.cuda.synchronize()
    yield out.clone()


def replayed_calls_by_layer(spans: list[Any], replays: list[Any]) -> list[list[Any]]:
    """Per layer, its replayed call spans in the order they were exported; each under one of
    ``replays`` and every replay with one call span per layer."""
    by_replay: dict[int, list[Any]] = {}
    for span in spans:
        if (span.attributes or {}).get("attnscope.replayed"):
            assert span.parent is not None
            by_replay.setdefault(span.parent.span_id, []).append(span)
    assert sorted(by_replay) == sorted(r.context.span_id for r in replays)
    per_layer: list[list[Any]] = [[] for _ in range(LAYERS)]
    for calls in by_replay.values():
        assert len(calls) == LAYERS  # one span per attention call of the step
        for i, call in enumerate(sorted(calls, key=lambda s: s.start_time)):
            per_layer[i].append(call)
    return per_layer


def test_each_sampled_replay_times_every_attention_layer(plain_output: torch.Tensor) -> None:
    model = _llama()
    eager = _eager_device_ns(Decode(model))  # its own cache: the captured one starts as plain's
    decode = Decode(model)
    attnscope.instrument(model)
    try:
        with capture_spans() as spans:
            graph, out = _capture(decode)
            for _ in range(REPLAYS):
                graph.replay()
                torch.cuda.synchronize()
                assert attnscope.flush(timeout_s=30.0)  # read before the next replay
            assert torch.equal(out, plain_output)  # what the graph computes is unchanged
    finally:
        attnscope.uninstrument(model)
    replays = [s for s in spans if s.name == "cuda_graph.replay"]
    assert len(replays) == REPLAYS
    assert attnscope.stats()["graph_replays_lost"] == 0
    per_layer_calls = replayed_calls_by_layer(spans, replays)
    for call in (c for calls in per_layer_calls for c in calls):
        # the cache length is the replay's, not the capture's: not read, and said so
        assert call.attributes["attnscope.inexact_reason"] == "cache_unread"
    per_layer = [[int(c.attributes["attnscope.device_ns"]) for c in calls]
                 for calls in per_layer_calls]
    for i, eager_ns in enumerate(eager):
        graph_ns = statistics.median(per_layer[i])
        assert abs(graph_ns - eager_ns) <= TOLERANCE * eager_ns, (i, graph_ns, eager_ns)


def test_unsampled_replays_record_nothing_and_compute_the_same(
        plain_output: torch.Tensor) -> None:
    model = _llama()
    decode = Decode(model)
    attnscope.instrument(model)
    try:
        with capture_spans(sample_rate=0.0) as spans:
            graph, out = _capture(decode)
            for _ in range(5):
                graph.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, plain_output)
    finally:
        attnscope.uninstrument(model)
    assert spans == []
