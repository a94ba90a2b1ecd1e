"""A mask's numbers where each (batch row, head) has one query (record.reduce's decode-step path)
against the general reductions, and masks broadcast along their key axis against their
contiguous copies.

``reduce._structure`` is the general computation (five passes and arithmetic on tensors); the
one-query path reads three passes as ints and finishes in Python. They must give the same nine
numbers for every mask, broadcast or not, read as it is or through the CUDA path's ship and land
(here on CPU tensors: the same code).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attnscope._record import reduce


def _general(mask: torch.Tensor, plan: reduce.MaskPlan, sq: int) -> list[int]:
    """The numbers by the general reductions, on a contiguous copy (nothing broadcast)."""
    seen = reduce.attend(mask.contiguous(), False)
    four = seen if seen.ndim == 4 else seen.unsqueeze(1)
    s = four.shape[-1]
    col = torch.arange(s)
    valid = col < s
    tail = valid & (col >= s - sq)
    if not plan.structure:
        return [int(v) for v in reduce.mask_numbers(mask.contiguous(), False, plan, sq, s)]
    return [int(v) for v in torch.stack(reduce._structure(four, valid, tail, sq, s)).tolist()]


def _both(mask: torch.Tensor, batch: int, heads: int, sq: int) -> tuple[list[int], list[int]]:
    skv = mask.shape[-1]
    plan = reduce.plan_mask(tuple(mask.shape), batch, heads, sq, skv)
    data, shipment = reduce.ship(mask, False, skv)
    landed = reduce.land(shipment, data.clone())
    read = [int(v) for v in reduce.mask_numbers(mask, False, plan, sq, skv).tolist()]
    shipped = [int(v) for v in reduce.mask_numbers(landed, False, plan, sq, skv,
                                                   not shipment.raw).tolist()]
    want = _general(mask, plan, sq)
    assert read == want
    return shipped, want


one_query = st.tuples(
    st.integers(1, 4), st.integers(1, 3), st.integers(1, 9),
    st.sampled_from(["padding", "random", "none", "all", "window"]),
    st.sampled_from(["none", "batch", "heads", "both"]), st.booleans(), st.integers(0, 2**31 - 1),
)


@settings(max_examples=300, deadline=None)
@given(one_query)
def test_one_query_numbers_match_the_general_reductions(spec: tuple[Any, ...]) -> None:
    _check(spec)


@settings(max_examples=150, deadline=None)
@given(one_query)
def test_the_same_through_reductions_as_for_a_large_mask(spec: tuple[Any, ...]) -> None:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reduce, "_AS_LISTS", 0)  # the path of a mask over 4,096 elements
        _check(spec)


def _check(spec: tuple[Any, ...]) -> None:
    batch, heads, skv, kind, broadcast, as_float, seed = spec
    g = torch.Generator().manual_seed(seed)
    mb = 1 if broadcast in ("batch", "both") else batch
    mh = 1 if broadcast in ("heads", "both") else heads
    j = torch.arange(skv)
    rows = []
    for _ in range(mb * mh):
        pad = int(torch.randint(0, skv + 1, (1,), generator=g))
        rows.append({"padding": j >= pad, "random": torch.rand(skv, generator=g) > 0.5,
                     "none": torch.zeros(skv, dtype=torch.bool),
                     "all": torch.ones(skv, dtype=torch.bool),
                     "window": (j >= pad) & (j > skv - 3)}[kind])
    seen = torch.stack(rows).view(mb, mh, 1, skv).expand(batch, heads, 1, skv)
    mask = torch.zeros(seen.shape).masked_fill(~seen, float("-inf")) if as_float else seen
    shipped, want = _both(mask, batch, heads, 1)
    assert shipped == want


def test_a_mask_broadcast_along_its_keys_is_read_whole() -> None:
    # "no masking" built by expanding one zero, and rows that see all keys or none: before, the
    # key axis was read once, so each row seemed to see one key (and a band to show)
    cases = [(torch.zeros(1, 1, 1, 1).expand(2, 1, 4, 4), 2, 4, 4),
             (torch.tensor([True, False]).view(2, 1, 1, 1).expand(2, 1, 1, 6), 2, 4, 1),
             (torch.zeros(2, 1, 3, 1).masked_fill(torch.tensor([False, True, False]).view(
                 1, 1, 3, 1), float("-inf")).expand(2, 1, 3, 5), 2, 4, 3)]
    for mask, batch, heads, sq in cases:
        shipped, want = _both(mask, batch, heads, sq)
        assert shipped == want
    full = _both(cases[0][0], 2, 4, 4)[1]
    assert full[reduce.FIELDS.index("pairs")] == 2 * 4 * 4
    assert full[reduce.FIELDS.index("full")] == 1 and full[reduce.FIELDS.index("inside")] == 0
