"""A model forward's step figures (Σ N_Q², Σ N_Q·N_KV) and its sampled layers' sums."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import attnscope
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")


def _model() -> Any:
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="eager", pad_token_id=0, eos_token_id=None, bos_token_id=None)
    model = transformers.LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model, trace_model=True)
    return model


def _under(span: Any, ancestor: int, spans: list[Any]) -> bool:
    by_id = {s.context.span_id: s for s in spans}
    while span.parent is not None:
        if span.parent.span_id == ancestor:
            return True
        span = by_id.get(span.parent.span_id)
        if span is None:
            return False
    return False


def test_each_forward_of_a_left_padded_generate_carries_its_step_sums() -> None:
    ids = torch.tensor([[0, 0, 5, 6, 7], [8, 9, 10, 11, 12]])
    mask = (ids != 0).long()
    new = 4
    with capture_spans() as spans, torch.no_grad():
        model = _model()
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, do_sample=False)
    forwards = sorted((s for s in spans if "attnscope.sum_nq2" in s.attributes),
                      key=lambda s: s.start_time)
    assert len(forwards) == new
    real = mask.sum(1).tolist()  # real prompt tokens per row: 3 and 5
    for step, span in enumerate(forwards):
        a = span.attributes
        nq = real if step == 0 else [1, 1]
        nkv = [r + step for r in real]  # the row's real keys: its prompt, then one per step
        assert a["attnscope.sum_nq2"] == sum(q * q for q in nq)
        assert a["attnscope.sum_nq_nkv"] == sum(q * k for q, k in zip(nq, nkv, strict=True))
        layers = [s for s in spans if "attnscope.flops" in s.attributes
                  and _under(s, span.context.span_id, spans)]
        assert len(layers) == 2 == a["attnscope.layers.calls"]
        assert a["attnscope.layers.flops"] == sum(s.attributes["attnscope.flops"] for s in layers)
        if all("attnscope.bytes" in s.attributes for s in layers):
            assert a["attnscope.layers.bytes"] == sum(s.attributes["attnscope.bytes"]
                                                      for s in layers)


def test_a_forward_without_a_mask_counts_every_row_whole() -> None:
    with capture_spans() as spans, torch.no_grad():
        _model()(input_ids=torch.tensor([[5, 6, 7], [8, 9, 10]]))
    (fwd,) = [s for s in spans if "attnscope.sum_nq2" in s.attributes]
    assert fwd.attributes["attnscope.sum_nq2"] == 2 * 3 * 3
    assert fwd.attributes["attnscope.sum_nq_nkv"] == 2 * 3 * 3


def test_a_device_masks_step_sums_travel_as_a_pinned_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    """CPU-testable core of the CUDA path: the calling thread enqueues the two sums of a device
    padding mask; the worker reads them as it reads a host mask's."""
    from attnscope._capture import hostread
    from attnscope._derive import call as derive
    from attnscope._record.capture import Capture, Facts, HostCopy, ModelFacts

    def facts() -> ModelFacts:
        f = ModelFacts(3, 1)
        f.cached, f.past = True, 6
        f.mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7, [0, 1, 1, 1, 1, 1, 1]])
        return f

    host = derive.derive_model(facts())
    assert (host.sum_nq2, host.sum_nq_nkv) == (3, 5 + 7 + 6)
    monkeypatch.setattr(hostread, "_on_device", lambda v: isinstance(v, torch.Tensor))
    monkeypatch.setattr(hostread, "enqueue_to_host", lambda t: t.clone())
    cap = Capture()
    f = facts()
    cap.facts = Facts(model=f)
    assert hostread.to_host(cap)
    assert isinstance(f.mask, HostCopy) and isinstance(f.row_sums, HostCopy)
    device = derive.derive_model(f)
    assert (device.sum_nq2, device.sum_nq_nkv) == (host.sum_nq2, host.sum_nq_nkv)


def test_a_steps_rank_span_sums_its_forwards_and_their_layers() -> None:
    from attnscope._spans.steps import rank_name

    model = _model()
    with capture_spans() as spans, torch.no_grad():
        for n, length in ((1, 3), (2, 5), (3, 2)):  # step 3 closes step 2 (docs/live.md)
            with attnscope.step(n):
                model(input_ids=torch.arange(1, length + 1).repeat(2, 1))
    ranks = sorted((s for s in spans if s.name == rank_name(0)
                    and s.attributes["attnscope.step"] < 3),
                   key=lambda s: s.attributes["attnscope.step"])
    assert [s.attributes["attnscope.step"] for s in ranks] == [1, 2]
    for rank, length in zip(ranks, (3, 5), strict=True):
        inside = [s for s in spans if s.context.trace_id == rank.context.trace_id]
        layers = [s for s in inside if "attnscope.flops" in s.attributes]
        (fwd,) = [s for s in inside if "attnscope.sum_nq2" in s.attributes
                  and "attnscope.module" in s.attributes]
        a = rank.attributes
        assert a["attnscope.layers.calls"] == len(layers) == 2
        assert a["attnscope.layers.flops"] == sum(s.attributes["attnscope.flops"] for s in layers)
        assert a["attnscope.sum_nq2"] == fwd.attributes["attnscope.sum_nq2"] == 2 * length ** 2
        assert a["attnscope.sum_nq_nkv"] == 2 * length * length
