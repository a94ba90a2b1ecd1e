"""On CUDA, what the CPU tests of these features establish on the host (skipped without CUDA):
continuous batching's packed steps (tests/test_continuous_batching.py), a float32 call under
``torch.autocast`` taking the bf16 peak (tests/test_calibrate.py), a slice of a large causal
buffer counted (tests/test_sdpa_masks.py), ``attnscope compare --kv-len``
(tests/test_cli_compare.py) and checkpointing's recomputed forwards, which autograd runs on a
device thread of its own on CUDA (tests/test_recompute.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._derive import roofline
from attnscope.testing import capture_spans
from tests.support.figures import record
from tests.support.helpers import brute_force_flops
from tests.test_continuous_batching import (
    HEAD_DIM,
    HEADS,
    _generate_batch,
    _llama,
    check_packed_layer,
)
from tests.test_recompute import _LAYERS, _STEPS, _layer_spans, _model, traced_training


@attnscope.trace
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                          is_causal=attn_mask is None)


def test_continuous_batching_on_cuda_counts_the_packed_steps() -> None:
    model = _llama().to("cuda")
    attnscope.instrument(model, trace_model=True)
    try:
        with capture_spans() as spans:
            _generate_batch(model, cuda_graphs=False)  # replays are tests/gpu/test_graph_*'s
    finally:
        attnscope.uninstrument(model)
    layer = check_packed_layer(spans)
    assert all(a.attributes["attnscope.device_ns"] > 0 for a in layer)


def test_a_float32_call_under_cuda_autocast_takes_the_bf16_peak() -> None:
    q = torch.randn(2, HEADS, 128, HEAD_DIM, device="cuda")
    with capture_spans() as spans:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            _attention(q, q, q)
    (a,) = [s.attributes for s in spans]
    assert a["attnscope.dtype"] == "float32" and a["attnscope.autocast_dtype"] == "bfloat16"
    peaks = roofline.device_peaks_for(torch.cuda.get_device_name())
    if peaks is None:
        pytest.skip(f"{torch.cuda.get_device_name()} is not in attnscope's peak table")
    assert a["attnscope.roofline.peak_tflops"] == roofline.dtype_peak_tflops(peaks, "bfloat16")


def test_a_slice_of_a_large_cuda_causal_buffer_is_counted() -> None:
    side, s = 8192, 96
    buffer = torch.tril(torch.ones(side, side, dtype=torch.bool, device="cuda")).view(
        1, 1, side, side)
    q = torch.randn(1, HEADS, s, HEAD_DIM, device="cuda", dtype=torch.float16)
    with capture_spans() as spans:
        _attention(q, q, q, attn_mask=buffer[:, :, :s, :s])
    (a,) = [sp.attributes for sp in spans]
    assert "attnscope.inexact_reason" not in a and a["attnscope.tokens"] == s
    assert a["attnscope.flops"] == brute_force_flops(1, HEADS, s, s, HEAD_DIM, HEAD_DIM, True)


def test_compare_a_decode_step_on_cuda() -> None:
    keys = 1024
    done = subprocess.run(
        [sys.executable, "-m", "attnscope", "compare", "--shape", "4,8,1,64", "--kv-len",
         str(keys), "--kv-heads", "2", "--impl", "math,flash,efficient,cudnn", "--runs", "6",
         "--warmup", "1", "--profile-runs", "1", "--json", "--no-progress"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONPATH=os.getcwd()))
    doc = json.loads(done.stdout)
    assert doc["shape"]["kv_len"] == keys and doc["device"].startswith("cuda")
    ran = [r for r in doc["implementations"] if r["status"] not in ("unavailable", "skipped")]
    assert ran and all(r["status"] == "ok" for r in ran), ran
    flops = brute_force_flops(4, 8, 1, keys, 64, 64, causal=False)
    assert all(r["flops"] == flops for r in ran)


@pytest.mark.parametrize("checkpointing", ["reentrant", "non_reentrant"])
def test_forwards_recomputed_by_cuda_autograd_are_marked(checkpointing: str) -> None:
    spans = traced_training(_model(checkpointing).to("cuda"))
    layers = _layer_spans(spans)
    again = [s for s in layers if s.attributes.get("attnscope.recompute") is True]
    assert len(layers) == 2 * len(again) == 2 * _LAYERS * _STEPS
    steps = {s.context.trace_id for s in spans
             if s.attributes.get("attnscope.module_class") == "LlamaForCausalLM"}
    # which trace they join on autograd's device thread: the step's, or traces of their own
    joined = sum(s.context.trace_id in steps for s in again)
    record("recompute_trace", checkpointing=checkpointing, in_step_trace=joined,
           recomputed=len(again))
