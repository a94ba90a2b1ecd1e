"""The mask reductions that run on the call's stream (record.reduce) against a brute-force reading.

The reference reads the boolean "may attend" view pair by pair in plain Python: tokens from the key
positions some query sees, visible pairs, and for band-shaped masks the band's offsets. The
reductions must agree with it for every mask, on CPU here and on CUDA in tests/gpu (same code).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope._attention.masks import (
    MaskCounts,
    MaskReading,
    band_pairs,
    counts_of,
    positions_tokens,
    read_counts,
)
from attnscope._capture import hostread
from attnscope._record import reduce
from attnscope._record.capture import AttentionFacts, Capture, Facts, HostCopy, ModelFacts


def _brute(seen: torch.Tensor, batch: int, heads: int, sq: int) -> tuple[int, int]:
    """(real query tokens, visible pairs over batch and heads) of a (B|1, H|1, Sq, Skv) view."""
    b4 = seen.expand(batch, heads, *seen.shape[-2:])
    pairs = int(b4.sum())
    skv = seen.shape[-1]
    tokens = sum(1 for b in range(batch) for j in range(skv - sq, skv)
                 if bool(b4[b, :, :, j].any()))
    return tokens, pairs


masks = st.tuples(
    st.integers(1, 3), st.integers(1, 3), st.integers(1, 6), st.integers(0, 4),
    st.sampled_from(["causal", "window", "two-sided", "full", "random"]),
    st.integers(0, 3), st.booleans(), st.booleans(), st.integers(0, 2**31 - 1),
)


def _make(spec: tuple[Any, ...]) -> tuple[torch.Tensor, int, int, int, int]:
    batch, heads, sq, past, kind, pad, broadcast, as_float, seed = spec
    skv = past + sq
    g = torch.Generator().manual_seed(seed)
    i = torch.arange(sq).unsqueeze(1)
    j = torch.arange(skv).unsqueeze(0)
    d = j - i - past
    base = {"causal": d <= 0, "window": (d <= 0) & (d > -2), "two-sided": d.abs() <= 1,
            "full": torch.ones(sq, skv, dtype=torch.bool),
            "random": torch.rand(sq, skv, generator=g) > 0.4}[kind]
    mb, mh = (1, 1) if broadcast else (batch, heads)
    seen = base.expand(mb, mh, sq, skv).clone()
    if pad and not broadcast:  # left padding of the first row: its first keys are not real
        seen[0, :, :, : min(pad, skv)] = False
    if as_float:
        return torch.zeros(seen.shape).masked_fill(~seen, float("-inf")), batch, heads, sq, skv
    return seen, batch, heads, sq, skv


@settings(max_examples=300, deadline=None)
@given(masks)
def test_counts_match_a_brute_force_reading(spec: tuple[Any, ...]) -> None:
    mask, batch, heads, sq, skv = _make(spec)
    seen = reduce.attend(mask, False)
    counts = counts_of(mask, False, batch, heads, sq, skv)
    assert counts is not None
    reading, tokens = read_counts(counts, batch, heads, sq, skv)
    want_tokens, want_pairs = _brute(seen, batch, heads, sq)
    assert tokens == want_tokens
    old = read_mask(seen, batch, heads, sq, skv)
    assert reading == old  # the reading the worker made from the tensor itself
    if reading is not None and reading.pairs is not None:
        # random masks: rows that see every key and keys no query sees carry no structure
        if spec[4] != "random":
            if spec[5] and not spec[6]:  # a band's pairs count padded positions (kernels do too)
                assert reading.pairs >= want_pairs
            else:
                assert reading.pairs == want_pairs


def test_a_static_cache_buffer_is_read_up_to_the_filled_keys_only() -> None:
    sq, skv, buffer = 3, 5, 9
    d = torch.arange(buffer).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - (skv - sq)
    mask = (d <= 0).view(1, 1, sq, buffer)  # the unfilled keys are masked, as static caches do
    for keys in (skv, torch.tensor(skv)):  # a host int, or the cache's own device length
        plan = reduce.plan_mask(tuple(mask.shape), 2, 4, sq,
                                keys if isinstance(keys, int) else None)
        counts = reduce.mask_numbers(mask, False, plan, sq, keys).tolist()
        reading, tokens = read_counts(MaskCounts(counts, plan), 2, 4, sq, skv)
        assert tokens == 2 * sq
        assert reading is not None and reading.causal is True
        assert reading.pairs == 2 * 4 * sum(min(skv, i + skv - sq + 1) for i in range(sq))


def test_mpt_style_inverted_bool_mask_takes_its_polarity_from_the_diagonal() -> None:
    d = torch.arange(4).unsqueeze(0) - torch.arange(4).unsqueeze(1)
    masked = (d > 0).view(1, 1, 4, 4)  # True = masked
    counts = counts_of(masked, False, 1, 2, 4, 4)
    assert counts is not None
    reading, tokens = read_counts(counts, 1, 2, 4, 4)
    assert reading is not None and reading.causal is True and tokens == 4


def test_generated_tokens_stop_at_each_rows_first_eos() -> None:
    ids = torch.tensor([[1, 2, 5, 9, 9, 9], [1, 2, 5, 5, 5, 9], [1, 2, 7, 7, 7, 7]])
    assert reduce.generated_numbers(ids, 2, (9,)).tolist() == [2 + 4 + 4]
    assert reduce.generated_numbers(ids, 2, (9, 7)).tolist() == [2 + 4 + 1]
    assert reduce.generated_numbers(ids, 2, ()).tolist() == [12]


def test_to_host_replaces_device_values_by_counts(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CPU, tensors pretending to be CUDA ones go through the same replacement."""
    monkeypatch.setattr(hostread, "_on_device", lambda v: isinstance(v, torch.Tensor))
    monkeypatch.setattr(hostread, "enqueue_to_host", lambda values: values.clone())
    cap = Capture()
    cap.kept_bytes = 0
    facts = AttentionFacts(2, 4)
    facts.heads, facts.head_dim, facts.cached = 2, 8, True
    facts.past = torch.tensor(3)
    d = torch.arange(7).unsqueeze(0) - torch.arange(4).unsqueeze(1) - 3
    facts.mask = (d <= 0).view(1, 1, 4, 7)
    model = ModelFacts(2, 4)
    model.mask = torch.ones(2, 7, dtype=torch.long)
    model.mask[0, :2] = 0
    model.output = torch.tensor([[1, 1, 1, 1, 5, 9], [1, 1, 1, 1, 5, 6]])
    model.eos, model.prompt_len = (9,), 4
    cap.facts = Facts(facts, model=model)
    cap.summary = [("attn_mask", torch.ones(2, 7, dtype=torch.bool))]
    assert hostread.to_host(cap) is True
    assert isinstance(facts.past, HostCopy) and facts.past.read() == [3]
    assert isinstance(facts.mask, HostCopy) and isinstance(model.mask, HostCopy)
    reading, tokens = read_counts(MaskCounts(facts.mask.read(), facts.mask.plan), 2, 2, 4, 7)
    assert tokens == 8 and reading is not None and reading.causal is True
    assert isinstance(model.output, HostCopy) and model.output.read() == [2 + 2]
    positions = cap.summary[0][1]
    assert isinstance(positions, HostCopy) and positions_tokens(positions, 2, 4) == 8


# ---- the reference: the reading the worker made from the boolean tensor before the reductions ----


def read_mask(seen: torch.Tensor, batch: int, heads: int, sq: int,
              skv: int) -> MaskReading | None:
    """The pre-reduction reading, kept as a reference: structure and visible pairs of a
    ``(B|1, H|1, Sq, Skv)`` "may attend" mask, or None when its layout does not match the call (a
    padding mask, ``(B, 1, 1, S)``, has no query axis)."""
    if seen.ndim == 3:
        seen = seen.unsqueeze(1)
    if seen.ndim != 4 or tuple(seen.shape[-2:]) != (sq, skv) or sq < 1:
        return None
    mb, mh = seen.shape[0], seen.shape[1]
    if mb not in (1, batch) or mh not in (1, heads):
        return None
    scale = (batch if mb == 1 else 1) * (heads if mh == 1 else 1)
    exact = int(seen.sum()) * scale
    rows = seen.any(-1) & ~seen.all(-1)  # queries that see some keys but not all
    kept = seen & rows.unsqueeze(-1)
    cols = kept.any(-2)
    hidden = (rows.unsqueeze(-1) & cols.unsqueeze(-2) & ~seen).flatten(0, 1).any(0)
    visible = kept.flatten(0, 1).any(0)
    if not bool(visible.any()):  # every row sees all keys or none: no structure to read
        full = bool(seen.all())
        return MaskReading(False if full and sq > 1 else None, None, exact)
    d = (torch.arange(skv, device=seen.device).unsqueeze(0)
         - torch.arange(sq, device=seen.device).unsqueeze(1) - (skv - sq))
    vd = d[visible]
    vlo, vhi = int(vd.min()), int(vd.max())
    hd = d[hidden]
    if bool(((hd >= vlo) & (hd <= vhi)).any()):  # a real key hidden inside the band: not a band
        return MaskReading(None if vhi <= 0 else False, None, exact)
    hi = vhi if bool((hd > vhi).any()) else None
    lo = vlo if bool((hd < vlo).any()) else None
    causal = False if vhi > 0 else (True if hi is not None else None)
    if causal is None:  # no real query is kept from a later real key, nor shown one: unknown
        return MaskReading(None, None, None)
    window = hi - lo + 1 if hi is not None and lo is not None else None
    return MaskReading(causal, window, batch * heads * band_pairs(sq, skv, lo, hi))

