"""Traced calls in torch.compile'd code: the marks CUDA graphs of compiled code capture (CPU).

What Dynamo puts into the compiled graph (the marks around a CUDA call, nothing on CPU tensors,
values unchanged) is checked with the aot_eager and inductor backends on CPU; the test seam
``graph_marks.AS_CUDA`` makes Dynamo mark CPU tensors as if they were CUDA ones. What the marks
do when the compiled code runs during a capture is driven with test_graph_replay's fake GPU and
fake graph. cudagraph trees themselves need CUDA: tests/gpu/test_graph_compile.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import graph_marks, graphs
from attnscope._record import graphs as record_graphs
from attnscope._runtime import runtime
from attnscope.testing import capture_spans

from . import test_graph_replay as _replay_tests
from .support.helpers import attrs
from .test_graph_replay import STEP_MS, FakeGpu

_dynamo = pytest.importorskip("torch._dynamo")


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


@attnscope.trace
def causal(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


class Attention(torch.nn.Module):
    @attnscope.trace(name="attention")
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)


_METHOD = Attention()


def _step(x: torch.Tensor) -> torch.Tensor:
    return attention(x.sin(), x, x).cos()


def _method_step(x: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = _METHOD(x.sin(), x, x)
    return out.cos()


def _causal_step(x: torch.Tensor) -> torch.Tensor:
    return causal(x.sin(), x, x, is_causal=True).cos()


def _plain_step(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(x.sin(), x, x).cos()


X = torch.randn(1, 2, 16, 8)
gpu = _replay_tests.gpu  # the fake GPU and graph class, as test_graph_replay drives them


@pytest.fixture
def as_cuda(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(graph_marks, "AS_CUDA", True)
    attnscope.configure(compiled_graph_marks=True)
    _dynamo.reset()
    yield
    _dynamo.reset()


@pytest.fixture
def fresh() -> Iterator[None]:
    _dynamo.reset()
    yield
    _dynamo.reset()


def _targets(fn: Callable[..., Any], backend: str) -> tuple[list[str], torch.Tensor]:
    """The call targets of the graph Dynamo hands ``backend``, and the compiled result."""
    inner = _dynamo.lookup_backend(backend)
    seen: list[str] = []

    def spy(gm: torch.fx.GraphModule, example: Any) -> Any:
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return inner(gm, example)

    out = torch.compile(fn, backend=spy, fullgraph=True)(X)  # no graph break either
    return seen, out


def _compiled(fn: Callable[..., Any], backend: str) -> torch.Tensor:
    _dynamo.reset()
    out: torch.Tensor = torch.compile(fn, backend=backend)(X)
    return out


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("step", [_step, _method_step], ids=["function", "method"])
def test_cpu_tensors_get_no_marks(fresh: None, backend: str, step: Any) -> None:
    traced, out = _targets(step, backend)
    _dynamo.reset()
    plain, ref = _targets(_plain_step, backend)
    assert traced == plain  # the same graph as without attnscope
    assert not any("graph_mark" in t for t in traced)
    assert torch.equal(out, ref)


def test_cuda_calls_get_no_marks_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """Off by default: outside a capture a mark still costs host time per call and step."""
    monkeypatch.setattr(graph_marks, "AS_CUDA", True)
    assert attnscope.configure().compiled_graph_marks is False
    _dynamo.reset()
    traced, _ = _targets(_step, "aot_eager")
    assert not any("graph_mark" in t for t in traced)
    attnscope.configure(compiled_graph_marks=True)
    assert runtime.sampler.graph_marks is True
    _dynamo.reset()
    traced, _ = _targets(_step, "aot_eager")
    assert sum("graph_mark" in t for t in traced) == 2
    _dynamo.reset()


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("step", [_step, _method_step], ids=["function", "method"])
def test_cuda_calls_are_marked_around_the_attention(as_cuda: None, backend: str,
                                                    step: Any) -> None:
    traced, out = _targets(step, backend)
    marks = [i for i, t in enumerate(traced) if "graph_mark" in t]
    (sdpa,) = [i for i, t in enumerate(traced) if "scaled_dot_product" in t]
    assert len(marks) == 2 and marks[0] < sdpa < marks[1]
    assert torch.equal(out, _compiled(_plain_step, backend))  # bit-identical


def test_inductor_keeps_the_marks_around_the_attention_kernel(as_cuda: None) -> None:
    from torch._inductor.utils import run_and_get_code

    out, codes = run_and_get_code(torch.compile(_step, backend="inductor"), X)
    call = codes[-1][codes[-1].index("def call("):]
    begin = call.index("attnscope.graph_mark")
    end = call.index("attnscope.graph_mark", begin + 1)
    assert begin < call.index("scaled_dot_product") < end  # neither dropped nor moved past it
    assert torch.equal(out, _compiled(_plain_step, "inductor"))


def _captured_replay(gpu: FakeGpu, step: Any) -> tuple[Any, list[Any]]:
    compiled: Any = torch.compile(step, backend="aot_eager")
    with capture_spans() as spans:
        compiled(X)  # compiled, not captured (a warm-up run): the marks do nothing
        assert gpu.recorded == 0 and not gpu.capture
        graph = gpu.graph_class()  # type: ignore[attr-defined]
        graph.capture_begin()
        try:
            compiled(X)
        finally:
            graph.capture_end()
        graph.replay()
        gpu.finish_all()
    return graph, spans


@pytest.mark.parametrize("step", [_step, _method_step], ids=["function", "method"])
def test_a_compiled_call_captured_into_a_graph_is_a_child_of_its_replays(
        gpu: FakeGpu, as_cuda: None, step: Any) -> None:
    graph, spans = _captured_replay(gpu, step)
    rec = graphs.record_of(graph)
    assert rec is not None and len(rec.templates) == 1 and rec.marks == []
    (replay,) = [s for s in spans if s.name == record_graphs.REPLAY_NAME]
    (call,) = [s for s in spans if s is not replay]
    assert call.name == "attention" and call.parent.span_id == replay.context.span_id
    a = attrs(call)
    assert a["attnscope.replayed"] is True
    assert a["attnscope.device_ns"] == int(STEP_MS * 1e6)
    assert a["attnscope.flops"] == 4 * 1 * 2 * 16 * 16 * 8  # from the shapes the mark saw
    assert attrs(replay)["attnscope.graph.calls"] == 1


def test_a_compiled_calls_constants_reach_its_template(gpu: FakeGpu, as_cuda: None) -> None:
    """is_causal is no tensor: the marks cannot carry it, the call's note (made while Dynamo
    traces) does, and the template's FLOPs are the causal ones."""
    _, spans = _captured_replay(gpu, _causal_step)
    (call,) = [s for s in spans if s.name == "causal"]
    a = attrs(call)
    assert a["attnscope.causal"] is True
    assert a["attnscope.flops"] < 4 * 1 * 2 * 16 * 16 * 8  # the masked half is not counted


def test_marks_outside_a_capture_do_nothing(gpu: FakeGpu, as_cuda: None) -> None:
    compiled = torch.compile(_step, backend="aot_eager")
    with capture_spans(sample_rate=0.0) as spans:
        for _ in range(3):
            compiled(X)
    assert spans == [] and gpu.recorded == 0


def test_a_compiled_llama_layer_keeps_its_extractors_facts(gpu: FakeGpu, as_cuda: None) -> None:
    """An instrumented transformers layer in compiled code: its module is noted while Dynamo
    traces (not a tensor: the marks cannot carry it), so the template has the layer's facts as
    a hand-captured one has them (test_graph_replay's cache-length test)."""
    model, cache = _replay_tests.prefilled_llama(layers=2)
    ids, position = torch.tensor([[9]]), torch.tensor([8])

    def step() -> torch.Tensor:
        with torch.no_grad():
            out = model(input_ids=ids, **_replay_tests._cache_arg(model, cache), use_cache=True,
                        cache_position=position)
        logits: torch.Tensor = out.logits
        return logits

    attnscope.instrument(model)
    try:
        compiled = torch.compile(step, backend="aot_eager")
        with capture_spans() as spans:
            compiled()
            graph = gpu.graph_class()  # type: ignore[attr-defined]
            graph.capture_begin()
            compiled()
            graph.capture_end()
            graph.replay()
            gpu.finish_all()
    finally:
        attnscope.uninstrument(model)
    layers = [s for s in spans if "self_attn" in s.name]
    assert len(layers) == 2
    for layer in layers:
        a = attrs(layer)
        assert a["attnscope.replayed"] is True and a["attnscope.num_heads"] == 4
        assert a["attnscope.exact"] is False and a["attnscope.inexact_reason"] == "cache_unread"


@attnscope.trace
def scaled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, length: int, scale: float,
           is_causal: bool) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=scale,
                                                            is_causal=is_causal) * length


def test_dynamic_numbers_neither_break_the_graph_nor_reach_the_note(as_cuda: None) -> None:
    """Under dynamic shapes an int argument is a SymInt the note could not take (a graph break,
    an error under fullgraph): numbers are left out of it, bools kept."""
    def step(x: torch.Tensor) -> torch.Tensor:
        return scaled(x, x, x, x.shape[2], x.shape[2] ** -0.5, True)

    compiled = torch.compile(step, backend="aot_eager", dynamic=True, fullgraph=True)
    for length in (16, 24, 32):
        x = torch.randn(1, 2, length, 8)
        assert torch.allclose(compiled(x), step(x))
    assert any(facts[3] == (("is_causal", True),) for facts, _ in
               runtime.graphs.mark_calls.values())


@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_marks_leave_training_alone(as_cuda: None, backend: str) -> None:
    """A marked call in a compiled training step: the forward and the gradients unchanged."""
    grads = []
    for fn in (_step, _plain_step):
        _dynamo.reset()
        x = X.clone().requires_grad_(True)
        loss: Any = torch.compile(fn, backend=backend)(x).sum()
        loss.backward()
        assert x.grad is not None
        grads.append(x.grad)
    assert torch.equal(grads[0], grads[1])


@attnscope.trace
def as_dict(q: torch.Tensor) -> dict[str, torch.Tensor]:
    return {"out": torch.nn.functional.scaled_dot_product_attention(q, q, q)}


def test_the_end_mark_reads_a_results_nested_tensors(as_cuda: None) -> None:
    """A result that is no tensor (a dict, a ModelOutput): the end mark still reads the output,
    so nothing can run it before the attention."""
    def step(x: torch.Tensor) -> torch.Tensor:
        return as_dict(x)["out"].cos()

    captured: list[torch.fx.GraphModule] = []
    inner = _dynamo.lookup_backend("aot_eager")

    def spy(gm: torch.fx.GraphModule, example: Any) -> Any:
        captured.append(gm)
        return inner(gm, example)

    torch.compile(step, backend=spy, fullgraph=True)(X)
    (gm,) = captured
    (end,) = [n for n in gm.graph.nodes if "graph_mark" in str(n.target) and n.args[2] == 1]
    (sdpa,) = [n for n in gm.graph.nodes if "scaled_dot_product" in str(n.target)]
    assert sdpa in end.args[0]


def test_inductor_finds_no_node_that_would_make_cudagraph_trees_skip_the_graph(
        as_cuda: None) -> None:
    """torch's own test of a post-grad graph before cudagraph trees capture it (ops tagged
    cudagraph_unsafe, forbidden ops, unbacked sizes) passes on a marked graph; the marks'
    effect tokens lower to nothing, so no CPU tensor enters the graph either."""
    from torch._inductor import config
    from torch._inductor.custom_graph_pass import CustomGraphPass
    from torch._inductor.utils import get_first_incompatible_cudagraph_node

    seen: list[Any] = []

    class Spy(CustomGraphPass):
        def __call__(self, graph: torch.fx.Graph) -> None:
            seen.append([str(n.target) for n in graph.nodes])
            assert graph.owning_module is not None
            seen.append(get_first_incompatible_cudagraph_node(graph.owning_module))

        def uuid(self) -> str:
            return "attnscope-test-graph-marks"

    with config.patch(post_grad_custom_post_pass=Spy(), force_disable_caches=True):
        torch.compile(_step, backend="inductor")(X)
    targets, incompatible = seen
    assert sum("with_effects" in t for t in targets) == 2  # both marks reach inductor
    assert incompatible is None
