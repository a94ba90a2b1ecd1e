"""The worker reuses a recent mask's numbers for an equal mask (``runtime.masks``), and only then.

Each test compares with ``reduce.mask_numbers`` run afresh on the same mask: the reused numbers
must be what counting again gives, and counting must happen again whenever the values, the call's
shape or the reading differ.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from attnscope._record import reduce
from attnscope._runtime import masks as mask_memo
from attnscope._runtime import runtime


@pytest.fixture(autouse=True)
def counted(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """How many times the numbers were computed, not reused."""
    runtime.masks.reset()
    calls: list[int] = []
    real = reduce.mask_numbers

    def counting(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(mask_memo, "mask_numbers", counting)
    yield calls
    runtime.masks.reset()


def _padded(batch: int, sq: int, skv: int, pads: list[int]) -> torch.Tensor:
    """A causal (batch, 1, sq, skv) bool mask, row b's first pads[b] keys hidden."""
    d = torch.arange(skv).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - (skv - sq)
    mask = (d <= 0).expand(batch, 1, sq, skv).clone()
    for b, pad in enumerate(pads):
        mask[b, :, :, :pad] = False
    return mask


def _numbers(mask: torch.Tensor, sq: int, skv: int | None, heads: int = 4,
             ignores: bool = False, attended: bool = False) -> list[int]:
    plan = reduce.plan_mask(tuple(mask.shape), mask.shape[0], heads, sq, skv)
    return [int(v) for v in runtime.masks.numbers(mask, ignores, plan, sq, skv, attended).tolist()]


def _fresh(mask: torch.Tensor, sq: int, skv: int | None, heads: int = 4,
           ignores: bool = False, attended: bool = False) -> list[int]:
    plan = reduce.plan_mask(tuple(mask.shape), mask.shape[0], heads, sq, skv)
    return [int(v) for v in reduce.mask_numbers(mask, ignores, plan, sq, skv, attended).tolist()]


def test_an_equal_mask_of_another_object_reuses_the_numbers(counted: list[int]) -> None:
    first = _padded(3, 5, 5, [0, 2, 4])
    want = _fresh(first, 5, 5)
    assert _numbers(first, 5, 5) == want
    for again in (first, first.clone(), first.to(torch.float32).bool()):  # every layer's call
        assert _numbers(again, 5, 5) == want
    assert len(counted) == 1


def test_a_mask_written_in_place_is_counted_again(counted: list[int]) -> None:
    mask = _padded(2, 1, 7, [0, 3])
    before = _numbers(mask, 1, 7)
    mask[0, :, :, :5] = False  # the same object, other values
    after = _numbers(mask, 1, 7)
    assert after == _fresh(mask, 1, 7) and after != before
    assert len(counted) == 2


def test_an_inference_tensor_written_in_place_is_counted_again(counted: list[int]) -> None:
    with torch.inference_mode():  # no version counter to tell the write
        mask = _padded(2, 4, 4, [1, 0])
        before = _numbers(mask, 4, 4)
        mask[1, :, :, :2] = False
        after = _numbers(mask, 4, 4)
        assert mask.is_inference()
        assert after == _fresh(mask, 4, 4) and after != before
        assert _numbers(mask.clone(), 4, 4) == after
    assert len(counted) == 2


def test_another_call_shape_or_reading_is_counted_again(counted: list[int]) -> None:
    mask = _padded(2, 3, 6, [0, 2])
    seen = [_numbers(mask, 3, 6), _numbers(mask, 3, 5), _numbers(mask, 3, None),
            _numbers(mask, 3, 6, heads=8), _numbers(mask, 3, 6, ignores=True),
            _numbers(mask, 3, 6, attended=True)]
    assert len(counted) == 6
    assert seen == [_fresh(mask, 3, 6), _fresh(mask, 3, 5), _fresh(mask, 3, None),
                    _fresh(mask, 3, 6, heads=8), _fresh(mask, 3, 6, ignores=True),
                    _fresh(mask, 3, 6, attended=True)]
    float_mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    assert _numbers(float_mask, 3, 6) == _fresh(float_mask, 3, 6)  # equal reading, other dtype
    assert len(counted) == 7


def test_interleaved_masks_stay_and_the_entries_are_bounded(counted: list[int]) -> None:
    full, sliding = _padded(2, 6, 6, [0, 1]), _padded(2, 6, 6, [0, 1])
    sliding &= (torch.arange(6).unsqueeze(0) - torch.arange(6).unsqueeze(1)) > -3
    for _ in range(4):  # alternating layers (Gemma's sliding and full): two entries, both kept
        _numbers(full, 6, 6)
        _numbers(sliding, 6, 6)
    assert len(counted) == 2
    for pad in range(2 * mask_memo.ENTRIES):
        _numbers(_padded(2, 6, 6, [pad % 6, pad // 6]), 6, 6)
    assert len(runtime.masks.copies) == mask_memo.ENTRIES
    kept = sum(entry[1].numel() * entry[1].element_size() for entry in runtime.masks.copies)
    assert kept <= mask_memo.ENTRIES * mask_memo.MAX_BYTES


def test_a_mask_over_the_byte_bound_is_not_kept(counted: list[int]) -> None:
    side = 1 << 10  # (1, 1, 1024, 1024) bool: 1 MiB, kept; one more key column: over
    small = _padded(1, side, side, [0])
    big = _padded(1, side, side + 1, [0])
    for mask in (small, small, big, big):
        _numbers(mask, side, mask.shape[-1])
    assert len(counted) == 3
    assert [entry[1].shape[-1] for entry in runtime.masks.copies] == [side]


def test_a_device_length_is_never_reused(counted: list[int]) -> None:
    mask = _padded(1, 2, 9, [0])  # a static cache's buffer: its length only as a tensor
    plan = reduce.plan_mask(tuple(mask.shape), 1, 4, 2, None)
    for keys in (torch.tensor(5), torch.tensor(7)):
        got = runtime.masks.numbers(mask, False, plan, 2, keys).tolist()
        assert got == reduce.mask_numbers(mask, False, plan, 2, keys).tolist()
    assert len(counted) == 2 and runtime.masks.copies == []


def test_a_stopping_worker_frees_the_copies() -> None:
    import attnscope

    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0)
    attention = attnscope.trace(lambda q, k, v: q)
    q = torch.zeros(1, 2, 4, 8)
    attention(q, q, q)  # starts the worker
    assert attnscope.flush(timeout_s=30)
    _numbers(_padded(1, 2, 2, [0]), 2, 2)
    assert runtime.masks.copies
    attnscope.shutdown()
    assert runtime.masks.copies == []


# what the mask's numbers decide (not the timings: tflops, tokens_per_s)
_DERIVED = ("flops", "tokens", "causal", "window", "inexact", "bytes", "arithmetic_intensity")


def _generate_spans(model: Any) -> list[dict[str, Any]]:
    """The mask-derived attributes of each attention span of a left-padded batch's
    ``generate()`` under inference mode (a serving loop's masks: no version counter)."""
    from attnscope.testing import capture_spans

    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 8, 9, 10], [0, 6, 7, 8, 9, 10]])
    with capture_spans() as spans, torch.inference_mode():
        model.generate(ids, attention_mask=(ids != 0).long(), max_new_tokens=4,
                       min_new_tokens=4, do_sample=False, pad_token_id=0)
    rows = []
    for span in sorted(spans, key=lambda s: (s.start_time, s.attributes["attnscope.module"])):
        attrs = span.attributes or {}
        if "attnscope.module" in attrs and attrs.get("attnscope.kind") != "model":
            rows.append({k: v for k, v in attrs.items()
                         if any(k.endswith(f".{name}") for name in _DERIVED)})
    return rows


def test_a_padded_generate_gets_the_same_spans_as_reading_every_call(
        monkeypatch: pytest.MonkeyPatch, counted: list[int]) -> None:
    transformers = pytest.importorskip("transformers")
    import attnscope

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=64)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model)
    reused = _generate_spans(model)
    assert len(reused) == 3 * 4 and len(counted) == 4  # one count a step, not one a layer
    monkeypatch.setattr(runtime.masks, "token", lambda mask: None)  # no reuse, no cache
    assert _generate_spans(model) == reused
    assert len(counted) == 4 + 3 * 4
    assert {"attnscope.flops", "attnscope.tokens", "attnscope.causal"} <= set(reused[0])


def test_tokens_follow_values_shape_and_dtype_and_the_numbers_are_bounded(
        counted: list[int]) -> None:
    memo = runtime.masks
    mask = _padded(2, 1, 5, [0, 2])
    token = memo.token(mask)
    assert token is not None and memo.token(mask.clone()) == token
    assert memo.token(mask.to(torch.uint8)) != token  # equal values, another dtype
    assert memo.token(mask.view(2, 1, 5)) != token  # another shape
    changed = mask.clone()
    changed[1, 0, 0, 4] = False
    assert memo.token(changed) not in (token, None)
    assert memo.token(torch.zeros(mask_memo.MAX_BYTES + 1, dtype=torch.bool)) is None
    for skv in range(1, mask_memo.MAX_NUMBERS + 10):  # one mask read for many call shapes
        assert _numbers(mask, 1, skv) == _fresh(mask, 1, skv)
    assert len(memo.found) == mask_memo.MAX_NUMBERS
    assert _numbers(mask, 1, 5) == _fresh(mask, 1, 5)  # forgotten first, counted again
    assert _numbers(mask, 1, mask_memo.MAX_NUMBERS + 8) == _fresh(
        mask, 1, mask_memo.MAX_NUMBERS + 8)  # still kept: no count
    assert len(counted) == mask_memo.MAX_NUMBERS + 10


def test_masks_torch_cannot_compare_or_copy_have_no_token() -> None:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # nested tensors are a prototype
        rows = [torch.ones(2, 3), torch.ones(4, 3)]
        odd = [torch.nested.nested_tensor(rows), torch.nested.nested_tensor(
            rows, layout=torch.jagged), torch.ones(2, 3).to_sparse(),
            torch.ones(2, 3).as_subclass(_Sub)]
    for mask in odd:  # a fuzzed argument once made the worker's key raise (no span)
        assert runtime.masks.token(mask) is None
    with torch.inference_mode():
        assert runtime.masks.token(torch.nested.nested_tensor(rows, layout=torch.jagged)) is None
    assert runtime.masks.copies == []


class _Sub(torch.Tensor):
    pass
