"""The worker reads no device tensor when it may not (issue 15 item 3, CPU-testable core): under
sync debugging a read is a sync the user asked not to have, and a timed-out call's stream is busy.
The spans then leave out what needed the value instead of carrying a wrong one."""

from __future__ import annotations

import types

import pytest
import torch

from attnscope.capture.record import AttentionFacts, ModelFacts
from attnscope.worker import derive


def test_a_device_tensor_is_not_readable_under_sync_debugging(
        monkeypatch: pytest.MonkeyPatch) -> None:
    on_device = types.SimpleNamespace(is_cuda=True)
    monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda: 0)
    assert derive.host_readable(on_device)  # type: ignore[arg-type]
    for mode in (1, 2):  # "warn", "error"
        monkeypatch.setattr(torch.cuda, "get_sync_debug_mode", lambda mode=mode: mode)
        assert not derive.host_readable(on_device)  # type: ignore[arg-type]
        assert derive.host_readable(torch.ones(1))


@pytest.fixture
def unreadable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every tensor behaves as a device tensor under sync debugging."""
    monkeypatch.setattr(derive, "host_readable", lambda t: False)


def _layer(past: object, mask: object) -> AttentionFacts:
    f = AttentionFacts(2, 1)
    f.cached, f.past, f.mask = True, past, mask
    f.heads, f.kv_heads, f.head_dim, f.causal = 4, 4, 8, True
    return f


def test_a_static_cache_length_that_cannot_be_read_leaves_keys_unknown(unreadable: None) -> None:
    out = derive.derive_attention(_layer(torch.tensor(7), None))
    assert out["tokens"] == 2 and out["seq_len_q"] == 1
    for key in ("kv_cache_len", "seq_len_kv", "phase", "flops"):
        assert key not in out, key


def test_a_mask_that_cannot_be_read_gives_no_token_count(unreadable: None) -> None:
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    out = derive.derive_attention(_layer(7, mask))
    assert out["kv_cache_len"] == 7 and out["flops"] > 0
    assert out.get("tokens") is None


def test_the_same_facts_read_normally() -> None:
    mask = torch.ones(2, 8, dtype=torch.bool)
    mask[0, :3] = False
    out = derive.derive_attention(_layer(torch.tensor(7), mask))
    assert out["kv_cache_len"] == 7 and out["seq_len_kv"] == 8 and out["phase"] == "decode"
    assert out["tokens"] == 2  # both rows' last key is real


def test_generated_tokens_are_not_read_from_an_unreadable_output(unreadable: None) -> None:
    f = ModelFacts(1, 3)
    f.generate, f.output, f.eos = True, torch.tensor([[1, 2, 3, 4, 5]]), (9,)
    out = derive.derive_model(f)
    assert out.get("gen_ai.usage.output_tokens") is None
    assert out["gen_ai.usage.input_tokens"] == 3  # no mask: nothing to read
