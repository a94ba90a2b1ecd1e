"""What reading a mask costs: the reductions of ``attnscope.record.reduce`` per mask size.

    python benchmarks/bench_mask_reduce.py                 # CPU (the worker's cost)
    python benchmarks/bench_mask_reduce.py --device cuda   # the calling thread's launches

On CPU the worker runs the reductions on the kept mask: "time" is its cost per sampled call. On
CUDA the calling thread enqueues them on the call's stream after the call: "enqueue" is the host
time of that (launches and the pinned copy, nothing waited for), "device" the GPU time behind the
call. "ops" counts the ATen operators the reductions run (on CUDA about one kernel each). The
old worker-side reading (``worker.masks.read_mask``, removed since) was measured beside it at
commit a291b86: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from attnscope.record import reduce


def _causal(batch: int, sq: int, skv: int, device: str) -> torch.Tensor:
    d = torch.arange(skv).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - (skv - sq)
    mask = torch.zeros(sq, skv).masked_fill(d > 0, float("-inf"))
    mask = mask.expand(batch, 1, sq, skv).contiguous()
    mask[0, :, :, : skv // 8] = float("-inf")  # row 0 left-padded
    return mask.to(device)


def _time(fn: Any, device: str, repeat: int) -> tuple[float, float]:
    """(median host ms per call, median device ms per call or nan)."""
    host, dev = [], []
    for _ in range(repeat):
        if device == "cuda":
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
        if device == "cuda":
            end.record()
            end.synchronize()
            dev.append(start.elapsed_time(end))
    return statistics.median(host), statistics.median(dev) if dev else float("nan")


def _ops(fn: Any) -> int:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn()
    return sum(1 for e in prof.events() if e.cpu_parent is None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    shapes = [(1, 128, 128), (4, 512, 512), (2, 1024, 2048), (1, 1, 4096), (1, 2048, 2048)]
    print(f"device={args.device}  torch {torch.__version__}")
    print(f"{'mask (B,1,Sq,Skv) float32':28} {'MiB':>6} {'ops':>4} {'time/enqueue ms':>16} "
          f"{'device ms':>10}")
    for batch, sq, skv in shapes:
        mask = _causal(batch, sq, skv, args.device)
        plan = reduce.plan_mask(tuple(mask.shape), batch, 8, sq, skv)

        # bound per iteration: run is called (and timed) only within this iteration
        def run(mask: torch.Tensor = mask, plan: reduce.MaskPlan = plan, sq: int = sq,
                skv: int = skv) -> Any:
            values = reduce.mask_numbers(mask, False, plan, sq, skv)
            return reduce.enqueue_to_host(values) if args.device == "cuda" else values.tolist()

        run()  # warm-up
        host_ms, dev_ms = _time(run, args.device, args.repeat)
        mib = mask.numel() * mask.element_size() / 2**20
        print(f"{str((batch, 1, sq, skv)):28} {mib:6.1f} {_ops(run):4d} {host_ms:16.3f} "
              f"{dev_ms:10.3f}")


if __name__ == "__main__":
    main()
