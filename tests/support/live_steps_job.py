"""A tiny data-parallel job for ``torchrun --nproc-per-node 2`` (CPU, gloo), used by
tests/test_live_steps.py: each step runs an instrumented attention model, all-reduces its
gradients, and declares ``attnscope.step(n)``; each rank writes its own Jaeger JSON file.

Usage: torchrun [--standalone | --rdzv-id ID] --nproc-per-node 2
       tests/support/live_steps_job.py OUT_DIR STEPS
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import attnscope


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = nn.MultiheadAttention(16, 2, batch_first=True)
        self.out = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, _ = self.attn(x, x, x, need_weights=False)
        return self.out(y).mean()


def main() -> None:
    out_dir, steps = sys.argv[1], int(sys.argv[2])
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    attnscope.configure(exporter=f"jaeger-json:{out_dir}/trace.rank{rank}.json",
                        sample_rate=1.0, warmup_calls=0, profile_rate=0.0, metrics=False,
                        overhead_budget=1.0)  # every step on both ranks, however busy the CPU
    torch.manual_seed(0)
    model = Block()
    attnscope.instrument(model)
    for step in range(steps):
        attnscope.step(step)
        x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(step * world + rank))
        model.zero_grad()
        model(x).backward()
        for p in model.parameters():  # a real collective per step: the ranks move together
            assert p.grad is not None
            dist.all_reduce(p.grad)
    attnscope.step(None)
    counts = {k: v for k, v in attnscope.stats().items() if isinstance(v, int) and v}
    ok = attnscope.shutdown(timeout_s=30.0)
    print(f"rank {rank}: run id {os.environ.get('TORCHELASTIC_RUN_ID')} shutdown ok {ok} {counts}",
          file=sys.stderr)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
