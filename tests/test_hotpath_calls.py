"""What a sampled call and its span cost in calls, not in time (issue 37 goals 3 and 4).

Speed is measured in ``benchmarks/`` (bench_hotpath, bench_model); these tests pin the changes
that made it cheaper, by what they do: the calling thread closes a capture with one ``leave()``
call, the argument summary is what it was, and the worker reads a module's configured
implementation once per batch, not once per span.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import attnscope
from attnscope import _schema as schema
from attnscope._capture import args as _args
from attnscope._capture import wrapper
from attnscope._record.capture import Capture, TensorMeta, expand_summary
from attnscope._runtime import runtime
from tests.support.helpers import brute_force_flops

SETTINGS: dict[str, Any] = {"sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0,
                            "profile_rate": 0.0, "metrics": False}


def test_a_sampled_call_is_closed_by_one_leave_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The finally that catches a Ctrl-C landing before leave()'s first line asks the capture
    itself whether it was left, instead of calling leave() again (a second call per sampled
    call, and a sys.exc_info(), for nothing)."""
    calls: list[bool] = []
    real = wrapper.leave

    def counting(*args: Any, **kwargs: Any) -> None:
        calls.append(True)
        real(*args, **kwargs)

    monkeypatch.setattr(wrapper, "leave", counting)
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    @attnscope.trace
    def double(q: torch.Tensor) -> torch.Tensor:
        return q * 2

    @attnscope.trace
    def failing(q: torch.Tensor) -> torch.Tensor:
        raise ValueError("user's")

    q = torch.ones(2, 3)
    assert torch.equal(double(q), q * 2)
    with pytest.raises(ValueError):
        failing(q)
    assert attnscope.flush(timeout_s=30)
    assert len(calls) == 2  # one per sampled call, the failing one included
    assert len(exporter.get_finished_spans()) == 2


def test_the_argument_summary_is_what_it_was() -> None:
    """The one-loop summary gives what TensorMeta.of and the old per-value helper gave: a
    TensorMeta (its own type) per tensor, a mask by reference, scalars and None kept, anything
    else dropped, positional names from the signature, then arg<i>, then keywords."""
    q = torch.ones(1, 2, 3, 4)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    nested = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
    summary = _args.summarize(
        (q, q.to(torch.float16), True, 3, 0.5, None, "text", nested, q, q),
        {"attn_mask": mask, "scale": 2.0, "k": q, "other": object()}, ("q", "k", "v"))
    names = [name for name, _ in summary]
    assert names == ["q", "k", "v", "arg3", "arg4", "arg5", "arg7", "attn_mask", "scale", "k"]
    values = dict(summary)
    assert values["q"] == TensorMeta.of(q) and type(values["q"]) is TensorMeta
    assert values["k"] == TensorMeta.of(q)  # the keyword, last: dict() keeps the last
    assert summary[1][1] == TensorMeta((1, 2, 3, 4), torch.float16, q.device)
    assert summary[6][1] == TensorMeta.of(nested) == TensorMeta((), nested.dtype, nested.device)
    assert values["attn_mask"] is mask
    assert (values["v"], values["arg3"], values["arg4"], values["arg5"]) == (True, 3, 0.5, None)
    assert values["scale"] == 2.0
    assert len(summary) == 10  # the ninth and tenth positionals are past the bound of eight


def _argument_sets() -> list[tuple[tuple[Any, ...], dict[str, Any], tuple[str, ...]]]:
    q = torch.ones(1, 2, 3, 4)
    mask = torch.ones(1, 1, 3, 3, dtype=torch.bool)
    nested = torch.nested.nested_tensor([torch.ones(2, 4), torch.ones(3, 4)])
    return [
        ((q, q.to(torch.float16), True, 3, 0.5, None, "text", nested, q, q),
         {"attn_mask": mask, "scale": 2.0, "k": q, "other": object()}, ("q", "k", "v")),
        ((mask, q, q), {}, ("attention_mask", "q", "k")),  # the mask first: its device first
        ((1, "x", None), {"flag": False}, ()),  # no tensor at all
        ((), {}, ("q",)),
        ((q.to(torch.float64),), {"key_padding_mask": mask}, ("q",)),
    ]


def test_a_flat_summary_expands_to_the_summary_and_knows_its_device() -> None:
    """A traced call's flat summary (``summarize_flat``) gives, expanded, what ``summarize``
    gives for the same arguments; its device is the first tensor's (a mask's too) and it says
    whether it holds a tensor by reference."""
    for args, kwargs, names in _argument_sets():
        flat, device, held = _args.summarize_flat(args, kwargs, names)
        pairs = _args.summarize(args, kwargs, names)
        assert expand_summary(flat) == pairs
        assert [type(v) for _, v in expand_summary(flat)] == [type(v) for _, v in pairs]
        tensors = [v for v in (*args[:8], *kwargs.values()) if isinstance(v, torch.Tensor)]
        assert device == (tensors[0].device if tensors else None)
        assert held == any(not isinstance(v, TensorMeta) and isinstance(v, torch.Tensor)
                           for _, v in pairs)


def test_a_capture_expands_its_flat_summary_once() -> None:
    cap = Capture()
    cap.expand()
    assert cap.summary == [] and cap.flat_summary == ()
    q = torch.ones(2, 3)
    cap.flat_summary, _, held = _args.summarize_flat((q, 4), {}, ("q", "n"))
    assert not held
    cap.expand()
    first = cap.summary
    assert first == [("q", TensorMeta.of(q)), ("n", 4)] and type(first[0][1]) is TensorMeta
    assert cap.flat_summary == ()  # the flat one let go
    cap.expand()
    assert cap.summary is first


def test_a_traced_call_hands_its_summary_over_flat(monkeypatch: pytest.MonkeyPatch) -> None:
    """The calling thread makes no pair and no TensorMeta for a call of shapes and scalars: the
    worker expands the summary (a call with a mask is expanded on the calling thread, where its
    mask is weighed against the retention budget)."""
    handed: list[Capture] = []
    real = runtime.worker.submit

    def keep(cap: Capture) -> bool:
        handed.append(cap)
        flat = bool(cap.flat_summary) and not cap.summary
        result = real(cap)
        handed.append(flat)  # type: ignore[arg-type]
        return result

    monkeypatch.setattr(runtime.worker, "submit", keep)
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)

    @attnscope.trace
    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
        return q

    q = torch.ones(1, 2, 4, 8)
    attend(q, q, q)
    attend(q, q, q, attn_mask=torch.ones(1, 1, 4, 4, dtype=torch.bool))
    assert attnscope.flush(timeout_s=30)
    assert handed[1] is True and handed[3] is False  # flat; expanded, for its mask
    spans = exporter.get_finished_spans()
    assert len(spans) == 2
    for span in spans:  # the worker read the shapes from the flat summary
        attributes = dict(span.attributes or {})
        assert attributes[schema.FLOPS.name] == brute_force_flops(1, 2, 4, 4, 8, 8, False)
        assert attributes[schema.NUM_HEADS.name] == 2


class _CountingConfig:
    """A module config whose ``_attn_implementation`` counts its reads (everything else is the
    real config's)."""

    def __init__(self, real: Any) -> None:
        self._real = real
        self.reads = 0
        self.impl = "sdpa"

    @property
    def _attn_implementation(self) -> str:
        self.reads += 1
        return self.impl

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)


def test_the_worker_reads_a_modules_implementation_once_per_batch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every layer span names the implementation its module's config says; the worker reads it
    once per module per batch (through transformers' config __getattribute__, four Python calls),
    and a change is in the next batch's spans."""
    transformers = pytest.importorskip("transformers")
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)
    attnscope.instrument(model)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.inference_mode():
        model(ids)  # the worker starts and builds its pipeline
    assert attnscope.flush(timeout_s=30)
    caps: list[Any] = []
    with monkeypatch.context() as patch:
        def keep(cap: Any) -> bool:
            caps.append(cap)
            return True

        patch.setattr(runtime.worker, "submit", keep)
        with torch.inference_mode():
            model(ids)
    attn = model.model.layers[0].self_attn
    layer = [c for c in caps if c.instance is attn]
    assert len(layer) == 1
    counting = _CountingConfig(attn.config)
    attn.config = counting
    worker = runtime.worker.current
    assert worker is not None and worker.engine is not None
    engine = worker.engine
    exporter.clear()

    def finish(n: int) -> None:
        for _ in range(n):
            engine.finish(copy.copy(layer[0]), False, worker.cuda, worker.escalator)

    finish(1)  # derive's own reads for a new shape, once
    engine.end_batch()
    counting.reads = 0
    finish(5)
    assert counting.reads == 1  # one per span before
    engine.end_batch()
    counting.impl = "eager"
    finish(2)
    engine.end_batch()
    assert counting.reads == 2
    assert attnscope.flush(timeout_s=30)
    impls = [(span.attributes or {}).get("attnscope.implementation")
             for span in exporter.get_finished_spans()]
    assert impls == ["sdpa"] * 6 + ["eager"] * 2


def test_an_instrumented_layer_asks_is_compiling_once_per_sampled_call(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A method's wrapper asks ``torch.compiler.is_compiling()`` before its countdown; enter()
    does not ask again for it (a traced function's wrapper does not ask: enter() does)."""
    asked: list[bool] = []
    real = torch.compiler.is_compiling

    def counting() -> bool:
        asked.append(True)
        return real()

    monkeypatch.setattr(runtime.dynamo, "loaded", True)
    monkeypatch.setattr(torch.compiler, "is_compiling", counting)
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS)

    class Layer(torch.nn.Module):
        @attnscope.trace
        def forward(self, q: torch.Tensor) -> torch.Tensor:
            return q * 2

    @attnscope.trace
    def double(q: torch.Tensor) -> torch.Tensor:
        return q * 2

    q = torch.ones(2, 3)
    for call in (Layer().forward, double):
        asked.clear()
        assert torch.equal(call(q), q * 2)
        assert len(asked) == 1, call
    assert attnscope.flush(timeout_s=30)
    assert len(exporter.get_finished_spans()) == 2
