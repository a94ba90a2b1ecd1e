"""Decorate a hand-written attention function and print the spans attnscope emits (on stderr).

Run: python examples/trace_attention.py
"""

import math

import torch

import attnscope


@attnscope.trace(name="my_attention")
def my_attention(q, k, v, is_causal=False):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool).tril()
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def main() -> None:
    # Every call sampled, spans printed as JSON on stdout; no collector needed.
    attnscope.configure(exporter="console", sample_rate=1.0, warmup_calls=0)
    q = k = v = torch.randn(2, 8, 128, 64)
    with attnscope.span("request", tokens=2 * 128):
        for _ in range(3):
            my_attention(q, k, v, is_causal=True)
    attnscope.shutdown()


if __name__ == "__main__":
    main()
