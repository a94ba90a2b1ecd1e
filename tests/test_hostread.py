"""The worker reads no device tensor (issue 15 items 2 and 3, CPU-testable core).

On CUDA the calling thread leaves pinned copies (``HostCopy``) in place of the mask (its boolean
view), the static cache's length and ``generate()``'s new ids; the worker counts from those copies
once the call's last event has passed, and reads nothing when the events timed out. Device
tensors themselves are never read on the worker: the spans then leave out what needed their
values instead of carrying a wrong one.
"""

from __future__ import annotations

import types

import pytest
import torch

import attnscope
from attnscope._derive import call as derive
from attnscope._record import reduce
from attnscope._record.capture import AttentionFacts, Facts, HostCopy, HostKind, ModelFacts


def test_only_host_tensors_are_readable_on_the_worker() -> None:
    assert not derive.host_readable(types.SimpleNamespace(is_cuda=True))  # type: ignore[arg-type]
    assert derive.host_readable(torch.ones(1))


def _layer(past: object, mask: object) -> AttentionFacts:
    f = AttentionFacts(2, 1)
    f.cached, f.past, f.mask = True, past, mask
    f.heads, f.kv_heads, f.head_dim, f.causal = 4, 4, 8, True
    return f


def _padding() -> torch.Tensor:
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    return mask


def _copies(past: int, mask: torch.Tensor) -> AttentionFacts:
    """The facts as the calling thread leaves them on CUDA: counts instead of device tensors
    (computed by the same reductions, here on CPU)."""
    plan = reduce.plan_mask(tuple(mask.shape), 2, 4, 1, past + 1)
    counts = reduce.mask_numbers(mask, False, plan, 1, past + 1)
    return _layer(HostCopy(torch.tensor([past]), HostKind.INT),
                  HostCopy(counts, HostKind.MASK, plan))


def test_counts_copied_by_the_call_stream_are_read() -> None:
    out = derive.derive([], facts=Facts(_copies(7, _padding())))
    assert out["kv_cache_len"] == 7 and out["seq_len_kv"] == 8 and out["phase"] == "decode"
    assert out["tokens"] == 2  # both rows' last key is real
    assert out == derive.derive([], facts=Facts(_layer(torch.tensor(7), _padding())))


def test_timed_out_copies_are_not_read() -> None:
    out = derive.derive([], facts=Facts(_copies(7, _padding())), device_reads=False)
    assert out["seq_len_q"] == 1
    for key in ("kv_cache_len", "seq_len_kv", "phase", "flops", "tokens"):
        assert out.get(key) is None, key


def test_a_device_tensor_left_in_the_facts_is_not_read() -> None:
    """If the calling thread could not make the copies, the worker leaves the counts out."""
    on_device = _padding().as_subclass(_OnDevice)
    facts = _layer(7, on_device)
    out = derive.derive([], facts=Facts(facts))
    assert out["kv_cache_len"] == 7 and "tokens" not in out
    assert facts.mask is on_device  # the capture's own facts are not written


class _OnDevice(torch.Tensor):
    @property
    def is_cuda(self) -> bool:  # type: ignore[override]
        return True


def test_generated_tokens_from_a_copy_and_not_after_a_timeout() -> None:
    f = ModelFacts(1, 3)
    f.generate, f.eos = True, (9,)
    f.output = HostCopy(reduce.generated_numbers(torch.tensor([[1, 2, 3, 4, 9, 9]]), 3, (9,)),
                        HostKind.INT)
    assert derive.derive([], facts=Facts(model=f))["gen_ai.usage.output_tokens"] == 2
    out = derive.derive([], facts=Facts(model=f), device_reads=False)
    assert out.get("gen_ai.usage.output_tokens") is None
    assert out["gen_ai.usage.input_tokens"] == 3  # no mask: nothing to read


# ---- the third event: the worker waits for the copies behind the call ----------------------------


class _Event:
    def __init__(self) -> None:
        self.passed = False
        self.records = 0

    def record(self, stream: object = None) -> None:
        self.records += 1

    def query(self) -> bool:
        return self.passed

    def elapsed_time(self, end_event: object) -> float:
        return 1.0


def test_a_timer_with_copies_is_ready_once_its_third_event_has_passed() -> None:
    from attnscope._capture.device import CudaEventPool

    made: list[_Event] = []

    def make() -> _Event:
        made.append(_Event())
        return made[-1]

    pool = CudaEventPool(make_event=make)
    timer = pool.get(None)
    timer.record_start()
    timer.record_end()
    start, end = made
    end.passed = True
    assert timer.ready()  # nothing copied: the end event decides
    timer.record_after()
    after = made[2]
    assert after.records == 1 and not timer.ready()  # the copies have not landed yet
    after.passed = True
    assert timer.ready()
    timer.release()
    again = pool.get(None)
    assert again is timer and len(made) == 3  # the third event is pooled with the pair
    again.record_end()
    after.passed = False
    assert again.ready()  # a reused timer waits for its third event only when it records one


def _fake_cuda(monkeypatch: pytest.MonkeyPatch) -> list[torch.Tensor]:
    """Traced calls on a faked CUDA device: their masks copied (the list of what was)."""
    import contextlib

    from attnscope._capture import hostread
    from attnscope._capture.device import CudaEventPool
    from attnscope._runtime import runtime
    from attnscope._worker import cuda as worker_cuda

    from .support.helpers import calls_on

    cuda0 = torch.device("cuda", 0)
    calls_on(monkeypatch, lambda _real: cuda0)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "memory_stats_as_nested_dict", lambda device=None: {})
    monkeypatch.setattr(runtime.device, "event_pool", CudaEventPool(make_event=_PassedEvent))
    monkeypatch.setattr(worker_cuda.DeviceAccess, "prepare", lambda self, dev: None)
    monkeypatch.setattr(worker_cuda.DeviceAccess, "reading",
                        lambda self, dev: contextlib.nullcontext())
    monkeypatch.setattr(hostread, "_on_device", lambda v: isinstance(v, torch.Tensor))
    copied: list[torch.Tensor] = []
    monkeypatch.setattr(hostread, "enqueue_to_host", lambda v: copied.append(v) or v.clone())
    return copied


@attnscope.trace
def _masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
            attn_mask: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)


def test_a_traced_call_on_the_device_reads_its_mask_from_the_copy(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A sampled call on a (faked) CUDA device: the mask is copied on the call's stream and
    counted by the worker; the capture does not keep the mask."""
    from attnscope._runtime import runtime
    from attnscope.testing import capture_spans

    copied = _fake_cuda(monkeypatch)
    q = torch.randn(2, 2, 4, 8)
    mask = torch.ones(2, 1, 4, 4, dtype=torch.bool)
    mask[0, :, :, :1] = False  # row 0: its first key is padding
    with capture_spans() as spans:
        _masked(q, q, q, attn_mask=mask)
        _masked(q, q, q, attn_mask=mask)  # the same mask again: its copy is shared (issue 37)
        assert attnscope.flush(10)
    assert len(spans) == 2 and len(copied) == 1
    assert [s.attributes["attnscope.tokens"] for s in spans] == [7, 7]
    # the mask's bytes went back to the budget at the call's end
    assert runtime.retention.kept_bytes == 0


def test_a_2d_query_by_key_mask_on_the_device_is_read_as_on_the_host(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SDPA's 2-D (Sq, Skv) mask on a (faked) CUDA device: reduced for the call's shape on the
    calling thread, as the worker reads the same mask on the host (exact FLOPs, causality, its
    window). Reference: the band's pairs counted from the mask broadcast to (B, H, Sq, Skv)."""
    from attnscope.testing import capture_spans

    q = torch.randn(2, 4, 8, 16)
    band = torch.ones(8, 8, dtype=torch.bool).tril() & ~torch.ones(8, 8, dtype=torch.bool).tril(-3)
    with capture_spans() as host:
        _masked(q, q, q, attn_mask=band)
        assert attnscope.flush(10)
    copied = _fake_cuda(monkeypatch)
    with capture_spans() as device:
        _masked(q, q, q, attn_mask=band)
        assert attnscope.flush(10)
    assert len(copied) == 1
    pairs = int(band.expand(2, 4, 8, 8).sum())
    for spans in (host, device):
        attributes = dict(spans[0].attributes or {})
        assert attributes["attnscope.flops"] == 2 * pairs * (16 + 16)
        assert attributes["attnscope.causal"] is True
        assert attributes["attnscope.sliding_window"] == 3


class _PassedEvent(_Event):
    def __init__(self) -> None:
        super().__init__()
        self.passed = True
