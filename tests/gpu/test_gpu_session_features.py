"""On CUDA, what the CPU tests of these features establish on the host (skipped without CUDA):
continuous batching's packed steps (tests/test_continuous_batching.py), a float32 call under
``torch.autocast`` taking the bf16 peak (tests/test_calibrate.py), a slice of a large causal
buffer counted (tests/test_sdpa_masks.py) and ``attnscope compare --kv-len``
(tests/test_cli_compare.py)."""

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
from tests.support.helpers import brute_force_flops
from tests.test_continuous_batching import HEAD_DIM, HEADS, NEW, PROMPTS, _flops, _llama


@attnscope.trace
def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
               attn_mask: torch.Tensor | None = None) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask,
                                          is_causal=attn_mask is None)


def test_continuous_batching_on_cuda_counts_the_packed_steps() -> None:
    config = pytest.importorskip("transformers.generation.configuration_utils")
    import transformers

    model = _llama().to("cuda")
    attnscope.instrument(model, trace_model=True)
    gc = transformers.GenerationConfig(max_new_tokens=NEW, do_sample=False, eos_token_id=-1,
                                       pad_token_id=0)
    cb = config.ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=32, page_size=16,
                                         use_cuda_graph=False)
    try:
        with capture_spans() as spans, torch.no_grad():
            model.generate_batch(inputs=PROMPTS, generation_config=gc,
                                 continuous_batching_config=cb, warmup=False)
    finally:
        attnscope.uninstrument(model)
    layer = sorted((s for s in spans if s.attributes.get("attnscope.module")
                    == "model.layers.0.self_attn"), key=lambda s: s.start_time)
    lengths = [len(p) for p in PROMPTS]
    decode_keys = [sum(n + step for n in lengths) for step in range(1, NEW)]
    assert [(a.attributes["attnscope.phase"], a.attributes["attnscope.seq_len_kv"],
             a.attributes["attnscope.tokens"]) for a in layer] == (
        [("prefill", sum(lengths), sum(lengths))] + [("decode", k, 3) for k in decode_keys])
    assert layer[0].attributes["attnscope.flops"] == _flops(sum(n * (n + 1) // 2
                                                                for n in lengths))
    assert [a.attributes["attnscope.flops"] for a in layer[1:]] == [_flops(k)
                                                                   for k in decode_keys]
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
