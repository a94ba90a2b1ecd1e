"""attnscope.batch(rows=...) over every mask kind a tiny transformers model issues: causal, GQA,
sliding window, chunked, bidirectional with padding, encoder-decoder (cross-attention) and
``generate`` steps. Rows have different real lengths (left padding for decoders, right padding
for encoders). For each kind: (a) the requests' FLOPs sum to the FLOPs of the calls split, and
(b) each request's useful FLOPs and tokens equal an independent count from the model's own eager
attention weights for that row (a real query's pair counts when its weight is not zero; FLOPs =
2 · pairs · (Dqk + Dv), Dqk + Dv from torch's FLOP counter via ``arch_sweep.reference``). A call
apportion leaves unsplit for a kind (a chunked layer over left padding, cross-attention whose
mask the layer does not keep) is asserted as unsplit, and left out of the count.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import pytest
import torch

import attnscope
from attnscope.testing import capture_spans

transformers = pytest.importorskip("transformers")
from tests.support import arch_sweep as sweep  # noqa: E402

ROWS = ("r0", "r1", "r2")
LENGTHS = (9, 6, 3)  # real tokens per row; the first is the padded length
REQ = "attnscope.request."
_FRACTION = "attnscope.padding_fraction"


class Seen(NamedTuple):
    calls: list[dict[str, Any]]  # the attention calls' attributes, in start order
    requests: dict[str, dict[str, Any]]  # request id -> its attnscope.request span's attributes


def _padding(left: bool, seq: int = LENGTHS[0]) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, mask) of three rows of LENGTHS real tokens, padded on the left or the right."""
    ids = torch.randint(3, 60, (len(LENGTHS), seq), generator=torch.Generator().manual_seed(1))
    mask = torch.zeros_like(ids)
    for b, n in enumerate(LENGTHS):
        mask[b, seq - n:] = 1
    if not left:
        mask = mask.flip(-1)
    return ids * mask, mask


def _batched(model: Any, run: Callable[[], Any]) -> Seen:
    """``run`` inside ``attnscope.batch(rows=ROWS)``, every call sampled."""
    attnscope.instrument(model)
    try:
        with capture_spans() as spans, sweep.quiet(), torch.no_grad():
            with attnscope.batch(rows=list(ROWS)):
                run()
    finally:
        attnscope.uninstrument(model)
    ordered = sorted(spans, key=lambda s: s.start_time)
    calls = [dict(s.attributes or {}) for s in ordered if "attnscope.flops" in (s.attributes or {})]
    requests = {str((s.attributes or {})[REQ + "id"]): dict(s.attributes or {})
                for s in ordered if s.name == "attnscope.request"}
    assert sorted(requests) == list(ROWS)
    return Seen(calls, requests)


def _count(weights: list[tuple[str, torch.Tensor, torch.Tensor]], dims: dict[str, int | None]
           ) -> tuple[list[int], list[int]]:
    """(useful FLOPs, real query tokens) per row over ``(module, weights, real queries)``."""
    useful, tokens = [0] * len(ROWS), [0] * len(ROWS)
    for module, w, real in weights:
        per_pair = dims[module]
        assert per_pair, module
        seen = (w != 0) & real[:, None, :, None]
        for b in range(len(ROWS)):
            useful[b] += 2 * per_pair * int(seen[b].sum())
            tokens[b] += int(real[b].sum())
    return useful, tokens


def _check(seen: Seen, expected: tuple[list[int], list[int]], unsplit: set[str]) -> None:
    """The sums (a) and the per-request counts (b); ``unsplit``: the modules whose calls
    apportion leaves out for this mask kind."""
    left_out = {a["attnscope.module"] for a in seen.calls if _FRACTION not in a}
    assert left_out == unsplit
    split = [a for a in seen.calls if _FRACTION in a]
    assert split
    n_unsplit = len(seen.calls) - len(split)
    reqs = [seen.requests[r] for r in ROWS]
    # (a) the rows' shares are the calls' FLOPs, exactly
    assert sum(a[REQ + "flops"] for a in reqs) == sum(a["attnscope.flops"] for a in split)
    assert sum(a[REQ + "padding_flops"] for a in reqs) == pytest.approx(
        sum(a[_FRACTION] * a["attnscope.flops"] for a in split), rel=1e-3)
    useful, tokens = expected
    for b, a in enumerate(reqs):
        assert a[REQ + "sampled_calls"] == len(split)
        assert a[REQ + "calls_unapportioned"] == n_unsplit
        assert a[REQ + "flops"] == a[REQ + "useful_flops"] + a[REQ + "padding_flops"]
        assert REQ + "exact" not in a  # every split call's figures are exact
        # (b) the row's useful work, from its own eager weights
        assert (a[REQ + "useful_flops"], a[REQ + "tokens"]) == (useful[b], tokens[b]), ROWS[b]
    # the shorter a row, the less of its share is useful
    assert reqs[0][REQ + "useful_flops"] > reqs[1][REQ + "useful_flops"] \
        > reqs[2][REQ + "useful_flops"]


def _forward_case(model: Any, inputs: dict[str, Any], real: dict[str, torch.Tensor],
                  unsplit: set[str]) -> None:
    """One padded forward: the reference from the model's own weights (``real``: the real
    queries of each output group), then the same forward in a batch block."""
    ref, _ = sweep.reference(model, inputs)
    weights = [(c.module, c.w, real[c.group]) for c in ref.calls if c.module not in unsplit]
    seen = _batched(model, lambda: model(**inputs))
    # one span per call the model reports (its groups come in output order, not call order)
    assert sorted(a["attnscope.module"] for a in seen.calls) == sorted(c.module for c in ref.calls)
    _check(seen, _count(weights, ref.dims), unsplit)


@pytest.mark.parametrize(("model_type", "class_name", "extra"), [
    ("llama", "LlamaForCausalLM", {"num_key_value_heads": 4}),  # plain causal
    ("llama", "LlamaForCausalLM", {"num_key_value_heads": 2}),  # GQA: 2 query heads per KV head
    ("mistral", "MistralForCausalLM", {"sliding_window": 4}),  # a window of 4 over 9 tokens
], ids=["causal", "gqa", "sliding"])
def test_a_left_padded_decoder_batch_splits_by_its_rows_weights(
        model_type: str, class_name: str, extra: dict[str, Any]) -> None:
    model = sweep.build(model_type, class_name, **extra)
    for key, value in extra.items():  # the mask kind is the one asked for
        assert getattr(model.config, key) == value
    ids, mask = _padding(left=True)
    _forward_case(model, {"input_ids": ids, "attention_mask": mask},
                  {"attentions": mask.bool()}, set())


def test_a_chunked_layer_over_left_padding_is_left_unsplit_and_the_full_layer_is_exact(
        ) -> None:
    """Llama 4's chunks start at each row's first real token: apportion does not reproduce that
    layer's per-row FLOPs and leaves its call out (counted unapportioned), never guessed."""
    model = sweep.build("llama4_text", "Llama4ForCausalLM", attention_chunk_size=4,
                        no_rope_layers=[1, 0], num_hidden_layers=2)
    assert model.config.layer_types == ["chunked_attention", "full_attention"]
    ids, mask = _padding(left=True)
    _forward_case(model, {"input_ids": ids, "attention_mask": mask},
                  {"attentions": mask.bool()}, {"model.layers.0.self_attn"})


def test_a_right_padded_encoder_batch_splits_by_its_rows_weights() -> None:
    """BERT: bidirectional, the padding mask hides padded keys; a padded query's weights are
    not attention of a real token (its row of weights is still non-zero): real queries only."""
    model = sweep.build("bert", "BertModel")
    ids, mask = _padding(left=False)
    _forward_case(model, {"input_ids": ids, "attention_mask": mask},
                  {"attentions": mask.bool()}, set())


def test_an_encoder_decoder_batch_splits_its_encoder_and_decoder_self_attention() -> None:
    """BART, the encoder right-padded: its encoder and the decoder's causal self-attention are
    split exactly; the decoder's cross-attention keeps no mask of the encoder's padding, so its
    calls are left unsplit rather than all called useful."""
    model = sweep.build("bart", "BartForConditionalGeneration")
    ids, mask = _padding(left=False)
    dec = torch.randint(3, 60, (len(ROWS), 5), generator=torch.Generator().manual_seed(2))
    real = {"encoder_attentions": mask.bool(), "decoder_attentions": torch.ones_like(dec).bool(),
            "cross_attentions": torch.ones_like(dec).bool()}
    cross = {f"model.decoder.layers.{i}.encoder_attn" for i in range(2)}
    _forward_case(model, {"input_ids": ids, "attention_mask": mask, "decoder_input_ids": dec},
                  real, cross)


@pytest.mark.parametrize(("model_type", "class_name", "extra"), [
    ("llama", "LlamaForCausalLM", {}),
    ("mistral", "MistralForCausalLM", {"sliding_window": 4}),  # decode steps past the window
], ids=["gqa", "sliding"])
def test_generate_steps_of_a_left_padded_batch_split_by_each_steps_weights(
        model_type: str, class_name: str, extra: dict[str, Any]) -> None:
    model = sweep.build(model_type, class_name, **extra)
    ids, mask = _padding(left=True)
    new = 4

    def generate(**kw: Any) -> Any:
        return model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new,
                              min_new_tokens=new, do_sample=False, **kw)

    ref, _ = sweep.reference(model, {"input_ids": ids, "attention_mask": mask})
    with sweep.quiet(), torch.no_grad():
        steps = generate(output_attentions=True, return_dict_in_generate=True).attentions
    assert len(steps) == new
    modules = [c.module for c in ref.calls]
    one = torch.ones(len(ROWS), 1, dtype=torch.bool)  # each new token is real
    weights = [(m, w, mask.bool() if step == 0 else one)
               for step, layers in enumerate(steps) for m, w in zip(modules, layers, strict=True)]
    seen = _batched(model, generate)
    assert [a.get("attnscope.phase") for a in seen.calls] == (
        ["prefill"] * len(modules) + ["decode"] * len(modules) * (new - 1))
    _check(seen, _count(weights, ref.dims), set())
    for a in seen.requests.values():
        assert a[REQ + "decode.calls"] == len(modules) * (new - 1)
