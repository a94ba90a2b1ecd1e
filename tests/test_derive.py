"""Shapes, tokens and exact FLOPs from a call's arguments."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._capture.args import summarize
from attnscope._derive.call import attention_flops, causal_pairs, count_tokens, derive
from attnscope.testing import capture_spans
from tests.support.helpers import attrs, brute_force_flops


@attnscope.trace
def sdpa(query, key, value, attn_mask=None, is_causal=False):  # type: ignore[no-untyped-def]
    return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask,
                                          is_causal=is_causal,
                                          enable_gqa=query.shape[1] != key.shape[1])


@pytest.mark.parametrize("sq,skv", [(s, t) for s, t in itertools.product(range(0, 7), range(0, 7))])
def test_causal_pairs_matches_an_explicit_mask(sq: int, skv: int) -> None:
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0)
    assert causal_pairs(sq, skv) == int((j <= i + (skv - sq)).sum())


CASES = [
    # b, hq, hkv, sq, skv, d, causal
    (2, 4, 4, 16, 16, 8, False),  # full self-attention
    (2, 4, 4, 16, 16, 8, True),  # causal
    (1, 8, 2, 12, 12, 16, True),  # grouped-query
    (1, 8, 1, 9, 9, 16, False),  # multi-query
    (3, 4, 4, 1, 37, 8, True),  # decode: one query against a cache
    (2, 4, 2, 5, 20, 8, True),  # chunked prefill with cache, GQA
    (2, 4, 4, 20, 5, 8, True),  # more queries than keys: early rows see nothing
]


@pytest.mark.parametrize("b,hq,hkv,sq,skv,d,causal", CASES)
def test_flops_against_brute_force(b: int, hq: int, hkv: int, sq: int, skv: int, d: int,
                                   causal: bool) -> None:
    q = torch.randn(b, hq, sq, d)
    k = torch.randn(b, hkv, skv, d)
    v = torch.randn(b, hkv, skv, d)
    with capture_spans() as spans:
        sdpa(q, k, v, is_causal=causal)
    a = attrs(spans[0])
    assert a["attnscope.num_heads"] == hq and a["attnscope.num_kv_heads"] == hkv
    assert a["attnscope.flops"] == brute_force_flops(b, hq, sq, skv, d, d, causal)
    assert attention_flops(b, hq, sq, skv, d, causal=causal) == a["attnscope.flops"]


def test_value_head_dim_may_differ() -> None:
    got = derive(summarize((torch.empty(1, 2, 3, 8), torch.empty(1, 2, 5, 8),
                            torch.empty(1, 2, 5, 4)),
                           {}, ("q", "k", "v")))
    assert got["flops"] == brute_force_flops(1, 2, 3, 5, 8, 4, False)


def test_tokens_exclude_padding_for_every_mask_layout() -> None:
    lengths = torch.tensor([6, 3, 1])
    b, s = 3, 6
    pad2d = torch.arange(s)[None, :] < lengths[:, None]  # right padding, (B, S)
    assert count_tokens(pad2d, b, s) == 10
    assert count_tokens(pad2d.long(), b, s) == 10
    left = pad2d.flip(-1)  # left padding
    assert count_tokens(left, b, s) == 10
    # (B, 1, S, S) boolean causal & padding mask, as SDPA takes it
    causal = torch.ones(s, s, dtype=torch.bool).tril()
    full = causal[None, None] & pad2d[:, None, None, :] & pad2d[:, None, :, None]
    assert count_tokens(full, b, s) == 10
    # (B, 1, 1, S) additive float mask as older BERT code builds it
    additive = (1.0 - pad2d.float())[:, None, None, :] * -10000.0
    assert count_tokens(additive, b, s) == 10
    additive_min = (1.0 - pad2d.float())[:, None, None, :] * torch.finfo(torch.float32).min
    assert count_tokens(additive_min, b, s) == 10
    # decode: one query per row; the tail of the padding mask is real for every row
    assert count_tokens(left, b, 1) == 3
    assert count_tokens(torch.empty(3, 6, device="meta", dtype=torch.bool), b, s) is None


def test_traced_call_with_padding_mask_counts_real_tokens() -> None:
    q = torch.randn(2, 2, 4, 8)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)[:, None, None, :]
    with capture_spans() as spans:
        sdpa(q, q, q, attn_mask=mask)
    assert attrs(spans[0])["attnscope.tokens"] == 6


@pytest.mark.parametrize(
    "args,kwargs",
    [
        ((None, None, None), {}),
        ((1, 2.0, "x"), {}),
        (((torch.zeros(1), torch.zeros(1)),), {}),
        ((torch.empty(2, 4, 8, 16, device="meta"),) * 3, {}),
        ((torch.zeros(2, 4, 8, 16), torch.zeros(3, 4, 8, 16), torch.zeros(2, 4, 8, 16)), {}),
        ((torch.zeros(2, 3, 8, 16), torch.zeros(2, 2, 8, 16), torch.zeros(2, 2, 8, 16)), {}),
        ((torch.zeros(4),), {"hidden_states": torch.zeros(2, 3)}),
        ((), {"query": torch.zeros(1, 1, 2, 2)}),
    ],
)
def test_unusual_inputs_give_fewer_attributes_never_errors(args: tuple, kwargs: dict) -> None:
    @attnscope.trace
    def odd(*a, **kw):  # type: ignore[no-untyped-def]
        return len(a) + len(kw)

    with capture_spans() as spans:
        assert odd(*args, **kwargs) == len(args) + len(kwargs)
    (span,) = spans
    a = attrs(span)
    assert "attnscope.flops" not in a or a["attnscope.flops"] >= 0
    assert attnscope.stats()["internal_errors"] == 0


def test_meta_tensors_give_shapes_without_values() -> None:
    meta = torch.empty(2, 4, 8, 16, device="meta")
    got = derive(summarize((meta, meta, meta), {}, ("q", "k", "v")))
    assert got["device"] == "meta" and got["flops"] == brute_force_flops(2, 4, 8, 8, 16, 16, False)


def test_summary_holds_no_tensor_except_the_mask() -> None:
    q = torch.randn(1, 1, 2, 2)
    mask = torch.ones(1, 2, dtype=torch.bool)
    summary = summarize((q, q, q), {"attention_mask": mask}, ("q", "k", "v"))
    tensors = [v for _, v in summary if isinstance(v, torch.Tensor)]
    assert tensors == [mask]


def test_key_padding_mask_marks_padding_with_true() -> None:
    @attnscope.trace
    def mha_like(query, key, value, key_padding_mask=None):  # type: ignore[no-untyped-def]
        return query

    q = torch.zeros(2, 2, 4, 8)
    padding = torch.tensor([[False, False, False, True], [False, True, True, True]])
    with capture_spans() as spans:
        mha_like(q, q, q, key_padding_mask=padding)
    assert attrs(spans[0])["attnscope.tokens"] == 4


def test_unreadable_mask_leaves_tokens_unknown_rather_than_wrong() -> None:
    q = torch.zeros(1, 1, 4, 8)
    odd_mask = torch.ones(1, 1, 1, 4, 4, dtype=torch.bool)  # a layout attnscope does not read
    got = derive(summarize((q, q, q), {"attn_mask": odd_mask}, ("q", "k", "v")))
    assert "tokens" not in got and got["flops"] > 0
    assert derive(summarize((q, q, q), {}, ("q", "k", "v")))["tokens"] == 4


def test_stats_include_profile_counters() -> None:
    stats = attnscope.stats()
    assert any(key.startswith("profile_") for key in stats)


def test_a_mask_not_read_marks_the_call_inexact_and_a_read_one_does_not() -> None:
    q = torch.zeros(1, 2, 4, 8)
    odd_mask = torch.ones(1, 1, 1, 4, 4, dtype=torch.bool)  # a layout attnscope does not read
    got = derive(summarize((q, q, q), {"attn_mask": odd_mask}, ("q", "k", "v")))
    assert got["exact"] is False and got["inexact_reason"] == "mask_unread"
    # the FLOPs are then the layer's own structure's: every pair (an upper bound)
    assert got["flops"] == brute_force_flops(1, 2, 4, 4, 8, 8, False)
    causal = torch.ones(4, 4, dtype=torch.bool).tril()[None, None]
    read = derive(summarize((q, q, q), {"attn_mask": causal}, ("q", "k", "v")))
    assert "exact" not in read and "inexact_reason" not in read
    assert read["flops"] == brute_force_flops(1, 2, 4, 4, 8, 8, True)
    plain = derive(summarize((q, q, q), {}, ("q", "k", "v")))
    assert "exact" not in plain


def test_a_mask_over_the_keeping_budget_marks_the_call_inexact() -> None:
    from attnscope._record.capture import TensorMeta

    q = torch.zeros(1, 2, 4, 8)
    big = TensorMeta((1, 1, 4, 4), torch.bool, torch.device("cpu"))  # what retain keeps instead
    got = derive([*summarize((q, q, q), {}, ("q", "k", "v")), ("attn_mask", big)])
    assert got["exact"] is False and got["inexact_reason"] == "mask_not_kept"
    assert "tokens" not in got


def test_a_layer_call_whose_cache_length_was_not_read_says_so() -> None:
    from attnscope._derive.call import derive_attention
    from attnscope._record.capture import AttentionFacts

    facts = AttentionFacts(2, 1)
    facts.heads, facts.head_dim, facts.cached = 4, 8, True
    facts.past = object()  # a device copy that did not arrive: no length to read
    got = derive_attention(facts)
    assert got.exact is False and got.inexact_reason == "cache_unread"
    assert got.seq_len_kv is None and got.flops is None and got.phase is None
    facts.past = 3
    known = derive_attention(facts)
    assert known.exact is None and known.flops == 2 * 2 * 4 * 1 * 4 * (8 + 8)


@pytest.mark.parametrize(("sq", "skv", "cap"), [(8, 8, 4), (1, 9, 4), (3, 9, 4), (5, 5, 8),
                                                (6, 10, 1), (4, 4, 4)])
def test_capped_pairs_match_a_brute_force_count(sq: int, skv: int, cap: int) -> None:
    from attnscope._attention.families.kept_keys import capped_pairs

    past = skv - sq
    assert capped_pairs(sq, skv, cap, True) == sum(min(past + q + 1, cap) for q in range(sq))
    assert capped_pairs(sq, skv, cap, False) == sq * min(skv, cap)


def test_block_capped_pairs_match_the_indexers_own_selection() -> None:
    """Qwen4-exp's indexer, per query over ``v`` visible keys: the top ``min(topk, v // r)``
    whole blocks of ``r`` and the ``v % r`` keys past them (transformers' loop, counted)."""
    from attnscope._attention.families.kept_keys import capped_pairs

    for r, topk, skv in itertools.product((1, 2, 3, 4), (1, 2, 3), range(1, 23)):
        def kept(v: int, r: int = r, topk: int = topk) -> int:
            blocks = v // r
            return min(topk, blocks) * r + (v - blocks * r)
        for sq in range(1, skv + 1):
            past = skv - sq
            assert capped_pairs(sq, skv, topk * r, True, r) == sum(
                kept(past + q + 1) for q in range(sq)), (r, topk, sq, skv)
        assert capped_pairs(skv, skv, topk * r, False, r) == skv * kept(skv)


@pytest.mark.parametrize(("impl", "window"), [
    ("sdpa", None), ("eager", None), ("flash_attention_2", 4), (None, 4)])
def test_a_config_window_without_a_mask_holds_where_the_kernel_applies_it(
        impl: str | None, window: int | None) -> None:
    """A layer whose window is its config's, given no mask: transformers' sdpa skips the mask
    only where no window can bind, so over 8 keys a window of 4 was not applied; a flash kernel
    takes no mask and applies the window itself; an unknown implementation keeps the window."""
    from types import SimpleNamespace

    from attnscope._record.capture import AttentionFacts, Facts, LayerTraits

    facts = AttentionFacts(2, 8)
    facts.heads, facts.kv_heads, facts.head_dim, facts.causal, facts.window = 4, 4, 8, True, 4
    instance = SimpleNamespace(config=SimpleNamespace(_attn_implementation=impl))
    out = derive([], instance, facts=Facts(facts, LayerTraits(config_window=True)))
    assert out.sliding_window == window
    i, j = torch.arange(8).unsqueeze(1), torch.arange(8).unsqueeze(0)
    seen = (j <= i) & ((j > i - window) if window else True)  # a causal band of the window
    assert out.flops == 2 * 2 * 4 * int(seen.sum()) * (8 + 8)
