"""OpenTelemetry GenAI semantic conventions on the model-level spans of ``instrument(model,
trace_model=True)``, and the server time-to-first-token / time-per-output-token histograms,
checked against figures computed independently from the emitted spans."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

import attnscope
from attnscope._export import metrics as _metrics
from attnscope.testing import capture_spans
from tests.support.helpers import base_name

transformers = pytest.importorskip("transformers")

TTFT = "gen_ai.server.time_to_first_token"
TPOT = "gen_ai.server.time_per_output_token"
NAME = "tiny-llama/for-tests"
PROMPT = torch.tensor([[5, 6, 7, 8, 9]])
IDS = torch.tensor([[5, 6, 7, 8, 9], [0, 0, 7, 8, 9]])
MASK = torch.tensor([[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]])


@pytest.fixture(autouse=True)
def _bare(bare_env: None) -> None:
    """No OTEL_*/ATTNSCOPE_* variables from the outside."""


def _llama(name: str | None = NAME) -> Any:
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa", pad_token_id=0, eos_token_id=None, bos_token_id=None,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    if name is not None:
        model.config._name_or_path = name  # what from_pretrained sets
    return model


def _points(reader: InMemoryMetricReader) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data is not None else ():
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name in (TTFT, TPOT):
                    assert metric.unit == "s"
                    out[metric.name] = list(metric.data.data_points)
    return out


def _generate(model: Any, ids: torch.Tensor, new: int, **kw: Any) -> torch.Tensor:
    """Exactly ``new`` tokens per row, greedily (IDS is left-padded: MASK says so)."""
    mask = MASK if ids is IDS else torch.ones_like(ids)
    with torch.no_grad():
        out: torch.Tensor = model.generate(ids, attention_mask=mask, max_new_tokens=new,
                                           min_new_tokens=new, do_sample=False, pad_token_id=0,
                                           **kw)
    return out


def _gen_and_forwards(spans: list[Any]) -> tuple[Any, list[Any]]:
    (gen,) = [s for s in spans if base_name(s) == "LlamaForCausalLM.generate"]
    forwards = sorted((s for s in spans if base_name(s) == "LlamaForCausalLM"),
                      key=lambda s: s.start_time)
    return gen, forwards


def test_model_spans_carry_operation_and_model_name_attention_stays_attnscope() -> None:
    model = attnscope.instrument(_llama(), trace_model=True)
    with capture_spans() as spans:
        _generate(model, IDS, 3)
    gen, forwards = _gen_and_forwards(spans)
    assert gen.attributes["gen_ai.operation.name"] == "text_completion"
    assert gen.attributes["gen_ai.request.model"] == NAME
    assert gen.attributes["gen_ai.usage.input_tokens"] == 8
    assert gen.attributes["gen_ai.usage.output_tokens"] == 6
    assert "gen_ai.provider.name" not in gen.attributes and "gen_ai.system" not in gen.attributes
    assert len(forwards) == 3
    for f in forwards:  # one step of the generate() call: named, but no operation of its own
        assert f.attributes["gen_ai.request.model"] == NAME
        assert "gen_ai.operation.name" not in f.attributes
    # attention layers and decoder blocks: attnscope's own names only
    others = [s for s in spans if s not in forwards and s is not gen]
    assert others
    for s in others:
        assert not any(k.startswith("gen_ai.") for k in s.attributes), s.name
    attnscope.uninstrument(model)


def test_a_model_built_from_a_config_has_no_model_name() -> None:
    model = attnscope.instrument(_llama(name=None), trace_model=True)
    with capture_spans() as spans:
        _generate(model, PROMPT, 2)
        with torch.no_grad():
            model(PROMPT)
    gen, forwards = _gen_and_forwards(spans)
    assert gen.attributes["gen_ai.operation.name"] == "text_completion"
    assert all("gen_ai.request.model" not in s.attributes for s in spans)
    assert len(forwards) == 3 and all("gen_ai.operation.name" not in f.attributes
                                      for f in forwards)
    attnscope.uninstrument(model)


def test_ttft_and_tpot_equal_the_span_timings(meter_provider: MeterProvider,
                                              reader: InMemoryMetricReader) -> None:
    model = attnscope.instrument(_llama(), trace_model=True)
    with capture_spans(meter_provider=meter_provider) as spans:
        out = _generate(model, PROMPT, 6)
    gen, forwards = _gen_and_forwards(spans)
    (first,) = [f for f in forwards if f.attributes["attnscope.kv_cache_len"] == 0]
    assert first is forwards[0] and first.parent.span_id == gen.context.span_id
    made = out.shape[1] - PROMPT.shape[1]
    assert made == gen.attributes["gen_ai.usage.output_tokens"] == 6
    ttft = (first.end_time - gen.start_time) / 1e9
    tpot = (gen.end_time - first.end_time) / 1e9 / (made - 1)
    assert 0 < ttft <= (gen.end_time - gen.start_time) / 1e9
    points = _points(reader)
    (t,), (p,) = points[TTFT], points[TPOT]
    want = {"gen_ai.operation.name": "text_completion", "gen_ai.request.model": NAME}
    assert dict(t.attributes) == want and dict(p.attributes) == want
    assert t.count == 1 and t.sum == pytest.approx(ttft, rel=1e-12, abs=1e-12)
    assert p.count == 1 and p.sum == pytest.approx(tpot, rel=1e-12, abs=1e-12)
    assert tuple(t.explicit_bounds) == _metrics.TTFT_BUCKETS_S
    assert tuple(p.explicit_bounds) == _metrics.TPOT_BUCKETS_S
    attnscope.uninstrument(model)


def test_a_batch_gets_time_to_first_token_only(meter_provider: MeterProvider,
                                               reader: InMemoryMetricReader) -> None:
    """Rows of a batch may end at different steps, which the generate span's end cannot tell:
    no time per output token for them; the first token is the same forward's for every row."""
    model = attnscope.instrument(_llama(), trace_model=True)
    with capture_spans(meter_provider=meter_provider) as spans:
        _generate(model, IDS, 4)
    gen, forwards = _gen_and_forwards(spans)
    points = _points(reader)
    (t,) = points[TTFT]
    assert t.sum == pytest.approx((forwards[0].end_time - gen.start_time) / 1e9, rel=1e-12)
    assert TPOT not in points or not points[TPOT]
    attnscope.uninstrument(model)


def _forward_site(model: Any) -> Any:
    return model.__dict__["forward"].__func__.__attnscope_site__


def test_nothing_is_recorded_when_the_first_forward_was_not_sampled(
        meter_provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    model = attnscope.instrument(_llama(), trace_model=True)
    with capture_spans(meter_provider=meter_provider) as spans:
        _forward_site(model).countdown = 2  # the prefill goes through unsampled, the rest are
        _generate(model, PROMPT, 4)
    gen, forwards = _gen_and_forwards(spans)
    assert [f.attributes["attnscope.kv_cache_len"] for f in forwards] == [5, 6, 7]
    assert not any(_points(reader).values())  # no first forward seen: no figure, not a guess
    attnscope.uninstrument(model)


def test_nothing_is_recorded_without_a_cache(meter_provider: MeterProvider,
                                             reader: InMemoryMetricReader) -> None:
    """Without a KV cache no forward says it is the first: nothing is recorded."""
    model = attnscope.instrument(_llama(), trace_model=True)
    with capture_spans(meter_provider=meter_provider) as spans:
        _generate(model, PROMPT, 3, use_cache=False)
    gen, forwards = _gen_and_forwards(spans)
    assert len(forwards) == 3
    assert not any(_points(reader).values())
    attnscope.uninstrument(model)


def test_a_failed_generate_records_nothing(meter_provider: MeterProvider,
                                           reader: InMemoryMetricReader) -> None:
    model = attnscope.instrument(_llama(), trace_model=True)
    calls = {"n": 0}

    def stop(input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any) -> torch.Tensor:
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("stopped")
        return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    with capture_spans(meter_provider=meter_provider) as spans:
        with pytest.raises(RuntimeError, match="stopped"):
            _generate(model, PROMPT, 4, stopping_criteria=transformers.StoppingCriteriaList([stop]))
    gen, _ = _gen_and_forwards(spans)
    assert not gen.status.is_ok
    assert not any(_points(reader).values())
    attnscope.uninstrument(model)


def test_on_cuda_the_first_token_waits_for_the_forwards_device_time(
        meter_provider: MeterProvider, reader: InMemoryMetricReader) -> None:
    """A CUDA forward returns once its kernels are queued: its end is its start plus its device
    time when that is later (built Results, as the worker hands them to the recorder)."""
    from types import SimpleNamespace

    first_token = _metrics._FirstToken(meter_provider.get_meter("test"))
    module = {"attnscope.module": "LlamaForCausalLM"}
    gen = SimpleNamespace(capture_id=1, parent_id=None, start_ns=1_000, end_ns=901_000, error=None,
                          attrs={**module, "gen_ai.operation.name": "text_completion",
                                 "attnscope.batch_size": 1, "gen_ai.usage.output_tokens": 5})
    fwd = SimpleNamespace(capture_id=2, parent_id=1, start_ns=2_000, end_ns=12_000, error=None,
                          attrs={**module, "attnscope.kv_cache_len": 0, "attnscope.batch_size": 1,
                                 "attnscope.device_ns": 100_000})
    for result in (gen, fwd):
        first_token.see(result, result.attrs, None)
    points = _points(reader)
    (t,), (p,) = points[TTFT], points[TPOT]
    assert t.sum == pytest.approx((2_000 + 100_000 - 1_000) / 1e9)
    assert p.sum == pytest.approx((901_000 - 102_000) / 1e9 / 4)
    assert not first_token.open
