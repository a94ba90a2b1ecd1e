"""A sampled CUDA call with a mask enqueues at most six operations, and its counts stay exact
(issue 37 goal 2, CPU-testable core).

The calling thread's work on a device mask (``capture.hostread.to_host``) is counted here on CPU
tensors posing as CUDA ones: ATen operators dispatch the same on both devices, so the count
(views left out: they launch nothing) is the count of launches a CUDA call enqueues, a pinned
allocation and the copies included. Before the redesign it was 67 for any layer's mask with a
query axis (93 to 95 inside ``attnscope.batch()``).
The counts the worker computes from the copies are compared with the ones it computes from the
mask itself (a CPU mask's reading), for masks that take every path: packed or not, boolean as it
is or compared, broadcast, cut to a static cache's keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

from attnscope._capture import hostread
from attnscope._record import reduce
from attnscope._record.capture import (
    AttentionFacts,
    Capture,
    Facts,
    HostCopy,
    HostKind,
    ModelFacts,
    TensorMeta,
)

LIMIT = 6  # issue 37 goal 2: launches per sampled masked call
# what reads a value on the host (a synchronisation on CUDA)
_READS = ("aten._local_scalar_dense", "aten.nonzero", "aten.item", "aten.equal")


class _Enqueued(TorchDispatchMode):
    """The ATen operators run under it, views left out."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.blocking_copies = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if not func.is_view:
            self.ops.append(str(func.overloadpacket))
        if func.overloadpacket is torch.ops.aten.copy_:
            non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
            self.blocking_copies += not non_blocking
        return func(*args, **kwargs)


@pytest.fixture
def on_device(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setattr(hostread, "_on_device", lambda v: isinstance(v, torch.Tensor))
    yield


def _band(sq: int, skv: int, window: int | None = None) -> torch.Tensor:
    d = torch.arange(skv).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - (skv - sq)
    return (d <= 0) & (d > -window) if window else d <= 0


def _padded(batch: int, sq: int, skv: int, as_float: bool, expand: bool = False) -> torch.Tensor:
    seen = _band(sq, skv).expand(batch, 1, sq, skv)
    if not expand:
        seen = seen.clone()
        seen[0, :, :, : skv // 4] = False  # row 0 left-padded
    if as_float:
        return torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))
    return seen


def _layer(mask: torch.Tensor, sq: int, past: Any, heads: int = 4) -> AttentionFacts:
    f = AttentionFacts(mask.shape[0], sq)
    f.cached, f.past, f.mask = True, past, mask
    f.heads, f.kv_heads, f.head_dim, f.causal = heads, heads, 8, True
    return f


def _enqueue(cap: Capture) -> _Enqueued:
    counter = _Enqueued()
    with counter:
        assert hostread.to_host(cap)
    return counter


def _want(mask: torch.Tensor, ignores: bool, batch: int, heads: int | None, sq: int,
          skv: int | None) -> list[int]:
    plan = reduce.plan_mask(tuple(mask.shape), batch, heads, sq, skv)
    return [int(v) for v in reduce.mask_numbers(mask, ignores, plan, sq, skv).tolist()]


CASES = {
    # name: (mask, past as the call gave it, pack threshold)
    "float": (lambda: _padded(2, 16, 16, True), 0, reduce.PACK_FROM),
    "float packed": (lambda: _padded(2, 16, 16, True), 0, 64),
    "bool broadcast": (lambda: _padded(3, 16, 16, False, expand=True), 0, reduce.PACK_FROM),
    "bool packed": (lambda: _padded(2, 16, 16, False), 0, 64),
    "static cache, float packed": (lambda: _padded(2, 8, 24, True), torch.tensor(8), 64),
    "static cache, bool cut and packed": (lambda: _padded(2, 8, 24, False), 8, 64),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_sampled_masked_layer_call_enqueues_at_most_six_operations(
        on_device: None, monkeypatch: pytest.MonkeyPatch, case: str) -> None:
    make, past, pack_from = CASES[case]
    monkeypatch.setattr(reduce, "PACK_FROM", pack_from)
    mask = make()
    sq = 8 if "static" in case else 16
    skv = 16  # the keys filled: the static cache's buffer holds 24
    cap = Capture()
    cap.batch = ("a", "b", "c")[: mask.shape[0]]  # inside attnscope.batch(): rows counted too
    f = _layer(mask, sq, past)
    cap.facts = Facts(f)
    counter = _enqueue(cap)
    assert len(counter.ops) <= LIMIT, counter.ops
    assert counter.blocking_copies == 0 and not set(counter.ops) & set(_READS), counter.ops
    assert isinstance(f.mask, HostCopy) and f.mask.kind == "mask"
    if isinstance(past, torch.Tensor):
        assert isinstance(f.past, HostCopy) and f.past.read() == [8]
    assert f.mask.read() == _want(mask, False, mask.shape[0], 4, sq, skv)
    if isinstance(past, int):  # per-row counts need the keys on the host
        rows = reduce.row_numbers(mask, False, mask.shape[0], 4, sq, skv, None)
        assert rows is not None and f.row_counts.read() == rows.reshape(-1).tolist()


def test_a_model_forward_and_generate_call_enqueue_at_most_six_operations(
        on_device: None) -> None:
    padding = torch.ones(2, 12, dtype=torch.long)
    padding[0, :3] = 0
    forward = ModelFacts(2, 4)
    forward.cached, forward.past, forward.mask = True, 8, padding
    static = ModelFacts(2, 4)  # a static cache's length on the device: copied too
    static.cached, static.past, static.mask = True, torch.tensor(8), padding
    generate = ModelFacts(2, 8)
    generate.generate, generate.mask, generate.eos = True, padding[:, :8], (9,)
    generate.output = torch.tensor([[1] * 8 + [5, 9, 9, 3], [1] * 8 + [5, 6, 7, 3]])
    for f in (forward, static, generate):
        cap = Capture()
        cap.facts = Facts(model=f)
        counter = _enqueue(cap)
        assert len(counter.ops) <= LIMIT, counter.ops
        assert counter.blocking_copies == 0 and not set(counter.ops) & set(_READS)
    assert isinstance(forward.row_sums, HostCopy)
    sums = reduce.row_sums(padding, 2, 4, 12)
    assert sums is not None and forward.row_sums.read() == sums.tolist()
    for f in (forward, static):
        assert isinstance(f.mask, HostCopy)
        assert f.mask.read() == _want(padding, False, 2, None, 4, 12)
    assert static.past.read() == [8]
    assert generate.output.read() == [2 + 4]
    assert generate.mask.read() == _want(padding[:, :8], False, 2, None, 8, None)


def test_a_traced_functions_mask_enqueues_at_most_six_operations(on_device: None) -> None:
    q = TensorMeta.of(torch.zeros(2, 4, 16, 8))  # what a capture keeps of q, k and v
    for with_qkv in (True, False):
        mask = _padded(2, 16, 16, True)
        cap = Capture()
        cap.summary = ([("q", q), ("k", q), ("v", q)] if with_qkv else []) + [("attn_mask", mask)]
        counter = _enqueue(cap)
        assert len(counter.ops) <= LIMIT, counter.ops
        copy = cap.summary[-1][1]
        assert isinstance(copy, HostCopy)
        if with_qkv:
            assert copy.read() == _want(mask, False, 2, 4, 16, 16)
        else:
            assert copy.kind == "positions"
            assert copy.read() == reduce.position_counts(mask, False).tolist()


def test_a_copy_over_the_keeping_budget_is_not_made(on_device: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope._runtime import runtime

    monkeypatch.setattr(runtime.retention, "take", lambda n: False)
    f = _layer(_padded(2, 16, 16, True), 16, 0)
    cap = Capture()
    cap.facts = Facts(f)
    counter = _Enqueued()
    with counter:
        hostread.to_host(cap)
    assert isinstance(f.mask, TensorMeta) and "aten.copy_" not in counter.ops


# ---- the copy reads as the mask: every path of ship() against the mask itself ----------------

masks = st.tuples(
    st.integers(1, 3), st.integers(1, 2), st.integers(1, 6), st.integers(0, 4), st.integers(0, 4),
    st.sampled_from(["causal", "window", "random", "full"]),
    st.sampled_from(["bool", "bool-masked", "float", "long"]),
    st.booleans(), st.booleans(), st.integers(0, 2**31 - 1))


@settings(max_examples=200, deadline=None)
@given(masks)
def test_the_shipped_copy_gives_the_masks_own_counts(spec: tuple[Any, ...]) -> None:
    batch, heads, sq, past, spare, kind, dtype, broadcast, pack, seed = spec
    skv = past + sq
    g = torch.Generator().manual_seed(seed)
    base = {"causal": _band(sq, skv + spare), "window": _band(sq, skv + spare, 2),
            "full": torch.ones(sq, skv + spare, dtype=torch.bool),
            "random": torch.rand(sq, skv + spare, generator=g) > 0.4}[kind]
    seen = base.expand(1 if broadcast else batch, 1, sq, skv + spare)
    if not broadcast:
        seen = seen.expand(batch, heads, sq, skv + spare).clone()
        seen[0, :, :, : min(past, 2)] = False
    mask = {"bool": seen, "bool-masked": ~seen, "long": seen.long(),
            "float": torch.zeros(seen.shape).masked_fill(~seen, float("-inf"))}[dtype]
    ignores = dtype == "bool-masked"
    old = reduce.PACK_FROM
    reduce.PACK_FROM = 8 if pack else old
    try:
        for keys in (skv, None):
            data, shipment = reduce.ship(mask, ignores, keys)
            host = reduce.land(shipment, data.contiguous().clone())
            plan = reduce.plan_mask(tuple(mask.shape), batch, heads, sq, skv)
            got = reduce.mask_numbers(host, ignores, plan, sq, skv, not shipment.raw)
            assert got.tolist() == reduce.mask_numbers(mask, ignores, plan, sq, skv).tolist()
            assert shipment.nbytes <= mask.untyped_storage().nbytes()
    finally:
        reduce.PACK_FROM = old


def test_counts_read_later_are_computed_once() -> None:
    calls = []

    def compute() -> torch.Tensor:
        calls.append(1)
        return torch.tensor([[1, 2], [3, 4]])

    later = reduce.Later(compute)
    copy = HostCopy(later, HostKind.ROWS, (2, 2))
    assert copy.read() == [1, 2, 3, 4] and copy.read() == [1, 2, 3, 4] and len(calls) == 1


# ---- every layer of a forward is given the same mask: copied once -----------------------------


def _layer_call(mask: torch.Tensor) -> tuple[AttentionFacts, _Enqueued]:
    f = _layer(mask, 16, 0)
    cap = Capture()
    cap.facts = Facts(f)
    return f, _enqueue(cap)


def test_the_next_call_given_the_same_mask_enqueues_nothing_and_shares_its_counts(
        on_device: None) -> None:
    mask = _padded(2, 16, 16, True)
    first, counter = _layer_call(mask)
    assert "aten.copy_" in counter.ops
    second, counter = _layer_call(mask)
    assert counter.ops == []
    assert isinstance(second.mask, HostCopy) and second.mask.values is first.mask.values
    assert second.mask.read() == first.mask.read() == _want(mask, False, 2, 4, 16, 16)


def test_a_mask_written_in_place_or_another_mask_is_copied_again(on_device: None) -> None:
    mask = _padded(2, 16, 16, True)
    first, _ = _layer_call(mask)
    mask[1, :, :, :5] = float("-inf")  # written since: its version moved on
    second, counter = _layer_call(mask)
    assert "aten.copy_" in counter.ops
    assert second.mask.read() == _want(mask, False, 2, 4, 16, 16) != first.mask.read()
    _, counter = _layer_call(mask.clone())  # equal values, another tensor
    assert "aten.copy_" in counter.ops


def test_the_last_copy_does_not_keep_its_mask_alive(on_device: None) -> None:
    import gc
    import weakref

    mask = _padded(2, 16, 16, True)
    f, _ = _layer_call(mask)
    gone = weakref.ref(mask)
    del mask
    gc.collect()
    assert gone() is None and f.mask.read()[0] == 16 + 12


def test_an_inference_mode_mask_is_copied_every_time(on_device: None) -> None:
    """An inference tensor has no version counter (and may be written in place unseen)."""
    with torch.inference_mode():
        mask = _padded(2, 16, 16, True)
    first, counter = _layer_call(mask)
    assert "aten.copy_" in counter.ops
    with torch.inference_mode():
        mask[1, :, :, :5] = float("-inf")
    second, counter = _layer_call(mask)
    assert "aten.copy_" in counter.ops and len(counter.ops) <= LIMIT
    assert first.mask.read() == _want(_padded(2, 16, 16, True), False, 2, 4, 16, 16)
    assert second.mask.read() == _want(mask.clone(), False, 2, 4, 16, 16) != first.mask.read()


def test_an_empty_device_mask_is_left_unread_as_an_empty_host_mask(on_device: None) -> None:
    from attnscope._attention.masks import counts_of

    mask = torch.zeros(2, 1, 16, 0, dtype=torch.bool)
    f = _layer(mask, 16, None)
    f.cached = False
    cap = Capture()
    cap.facts = Facts(f)
    counter = _enqueue(cap)
    assert counter.ops == [] and isinstance(f.mask, HostCopy)
    assert counts_of(f.mask, False, 2, 4, 16, None) is None
    assert counts_of(mask, False, 2, 4, 16, None) is None
