"""CUDA graphs of torch.compile(mode="reduce-overhead") on a real GPU (issue 40; skipped without
CUDA, run by scripts/gpu_check.sh step 1b).

The tiny Llama static-cache decode step of test_graph_replay.py, compiled with
``mode="reduce-overhead"``: cudagraph trees run it once to warm up, capture it on the next call
through ``torch.cuda.graph`` and replay it from then on through ``CUDAGraph.replay``. The model's
Python does not run at capture: what attnscope times there are the ``attnscope::graph_mark``
ops Dynamo put around each instrumented attention layer (capture.graph_marks). Each sampled
replay must give one span per attention layer whose ``device_ns`` is within 5% of events
recorded around the same layers eagerly at steady state, and the compiled step must compute bit
for bit what it computes compiled without attnscope.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch

import attnscope
from attnscope.testing import capture_spans

from .test_graph_replay import (
    REPLAYS,
    TOLERANCE,
    Decode,
    _eager_device_ns,
    _llama,
    replayed_calls_by_layer,
)

WARMUP = 3  # cudagraph trees: a warm-up run, the recording run, then replays


def _compiled(decode: Decode) -> Callable[[], torch.Tensor]:
    torch._dynamo.reset()  # each model compiles afresh: no graph of another run is reused
    step: Callable[[], torch.Tensor] = torch.compile(decode.step, mode="reduce-overhead")
    return step


def _run(step: Callable[[], torch.Tensor], calls: int) -> torch.Tensor:
    out = step()
    for _ in range(calls - 1):
        out = step()
    torch.cuda.synchronize()
    return out.clone()  # a later replay overwrites the graph's output


def _plain_output() -> torch.Tensor:
    return _run(_compiled(Decode(_llama())), WARMUP + 1)


def test_each_sampled_replay_of_a_compiled_step_times_every_attention_layer() -> None:
    plain = _plain_output()
    model = _llama()
    eager = _eager_device_ns(Decode(model))  # eager events around the same layers
    decode = Decode(model)
    attnscope.instrument(model)
    try:
        with capture_spans(compiled_graph_marks=True) as spans:
            step = _compiled(decode)
            out = _run(step, WARMUP + 1)
            assert torch.equal(out, plain)  # what the compiled graph computes is unchanged
            for _ in range(REPLAYS):
                step()
                torch.cuda.synchronize()
                assert attnscope.flush(timeout_s=30.0)  # read before the next replay
    finally:
        attnscope.uninstrument(model)
    replays = [s for s in spans if s.name == "cuda_graph.replay"]
    assert len(replays) >= REPLAYS
    assert attnscope.stats()["graph_replays_lost"] == 0
    per_layer = [[int(c.attributes["attnscope.device_ns"]) for c in calls]
                 for calls in replayed_calls_by_layer(spans, replays)]
    for i, eager_ns in enumerate(eager):
        graph_ns = statistics.median(per_layer[i][WARMUP:])  # steady state
        assert abs(graph_ns - eager_ns) <= TOLERANCE * eager_ns, (i, graph_ns, eager_ns)


def test_unsampled_replays_of_a_compiled_step_record_nothing() -> None:
    plain = _plain_output()
    model = _llama()
    decode = Decode(model)
    attnscope.instrument(model)
    try:
        with capture_spans(sample_rate=0.0, compiled_graph_marks=True) as spans:
            out = _run(_compiled(decode), WARMUP + 5)
    finally:
        attnscope.uninstrument(model)
    assert spans == []
    assert torch.equal(out, plain)


def test_a_compiled_step_without_cuda_graphs_is_not_timed_by_marks() -> None:
    """mode="default": the marks run with the compiled code and do nothing (no capture)."""
    model = _llama()
    decode = Decode(model)
    attnscope.instrument(model)
    try:
        torch._dynamo.reset()
        step = torch.compile(decode.step)
        with capture_spans(sample_rate=0.0, compiled_graph_marks=True) as spans:
            _run(step, WARMUP + 2)
    finally:
        attnscope.uninstrument(model)
    assert spans == []
    assert attnscope.stats()["graph_replays_sampled"] == 0
