"""The small traced program of the A/A and 2x acceptance runs (benchmarks/bench_diff_aa.py,
tests/test_cli_diff_runs.py): two traced layers, ``layer1`` doing ``SLOW`` times the work.

Run: python benchmarks/aa_program.py TRACE_FILE SLOW CALLS
"""
import sys

import torch
import torch.nn.functional as F

import attnscope

out, slow, calls = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(1)
attnscope.configure(exporter="jaeger-json:" + out, service_name="aa", sample_rate=1.0,
                    profile_rate=0.0, warmup_calls=3, overhead_budget=1.0, metrics=False)

@attnscope.trace(name="layer0")
def layer0(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

@attnscope.trace(name="layer1")
def layer1(q, k, v):  # `slow` times the work, the same result
    for _ in range(slow - 1):
        F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)

torch.manual_seed(0)
q, k, v = (torch.randn(1, 4, 256, 64) for _ in range(3))
with torch.inference_mode():
    for _ in range(calls):
        layer1(q, k, layer0(q, k, v))
attnscope.shutdown(timeout_s=60)
