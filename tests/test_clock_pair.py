"""A sampled call's two start clocks are read together (seen failing under four burners: a
thread preempted between the epoch read and the perf read ended a profiled layer's span early,
and its k, v and o projections were left on the decoder layer above it,
tests/test_optree.py::test_trace_model_hangs_a_blocks_ops_under_its_decoder_layer)."""

from __future__ import annotations

import types
from typing import Any

import pytest
import torch

import attnscope
from attnscope._capture import retain, wrapper
from attnscope._runtime import runtime

OFFSET = 10**18  # the fake epoch clock: the fake perf clock plus this


@attnscope.trace(sample_rate=1.0)
def attention(q: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)


def test_a_preemption_between_the_two_start_reads_is_read_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    perf = [1_000_000]
    preempted = [True]

    def perf_ns() -> int:
        perf[0] += 100  # each read takes 100 ns
        return perf[0]

    def time_ns() -> int:
        now = perf[0] + OFFSET
        if preempted[0]:  # the thread loses the CPU right after its first epoch read
            preempted[0] = False
            perf[0] += 5_000_000
        return now

    fake_time = types.SimpleNamespace(time_ns=time_ns, perf_counter_ns=perf_ns)
    kept: list[Any] = []

    def submit(cap: Any) -> bool:
        kept.append(cap)
        return True

    attnscope.configure(warmup_calls=0, overhead_budget=1.0, profile_rate=0.0)
    monkeypatch.setattr(wrapper, "_perf_ns", perf_ns)
    monkeypatch.setattr(wrapper, "time", fake_time)
    monkeypatch.setattr(runtime.worker, "submit", submit)
    attention(torch.randn(1, 2, 4, 8))
    (cap,) = kept
    retain.release(cap)
    # the perf reading that goes with the epoch one is the one just after it, not 5 ms later
    assert cap.start_perf_ns - (cap.start_epoch_ns - OFFSET) <= 1_000
