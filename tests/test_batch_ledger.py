"""What the worker keeps of a ``batch`` block is its own and lives no longer than the block: the
calling side's ``BatchRecord`` is never written by the worker, and a block whose end the worker
never hears of (more ended blocks waiting than the bound) leaves nothing behind."""

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
        vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32,
        attn_implementation="eager", pad_token_id=0, eos_token_id=None, bos_token_id=None)
    model = transformers.LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model)
    return model


def _run(model: Any, rows: list[str]) -> None:
    ids = torch.tensor([[0, 5, 6], [7, 8, 9]])
    with torch.no_grad(), attnscope.batch(rows=rows):
        model(input_ids=ids, attention_mask=(ids != 0).long())


def test_the_worker_keeps_a_blocks_calls_only_while_the_block_lives(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope._record.batches import BatchRecord
    from attnscope._runtime import runtime
    from attnscope._worker import loop

    # the record has no field for the worker to write
    assert set(BatchRecord.__slots__) == {"rows", "block_id", "parent", "start_epoch_ns",
                                          "end_epoch_ns", "sampled", "lost", "__weakref__"}
    model = _model()
    with capture_spans() as spans:
        _run(model, ["a", "b"])
        attnscope.flush()
        worker = runtime.worker.current
        assert worker is not None and worker.engine is not None
        # ended and its request spans made: nothing of it left with the worker
        assert (len(worker.blocks_seen), len(worker.engine.ledger)) == (0, 0)
        monkeypatch.setattr(loop, "_MAX_ENDED_BLOCKS", 0)  # the next block's end is dropped
        _run(model, ["c", "d"])
        attnscope.flush()
        assert worker.blocks_dropped == 1
        # its calls were split and seen, yet the worker holds nothing of it once it is gone
        assert (len(worker.blocks_seen), len(worker.engine.ledger)) == (0, 0)
    requests = sorted(str((s.attributes or {}).get("attnscope.request.id"))
                      for s in spans if s.name == "attnscope.request")
    assert requests == ["a", "b"]
    split = [s for s in spans if "attnscope.padding_fraction" in (s.attributes or {})]
    assert len(split) == 2  # one layer's call in each block
