"""SIMULATION on CPU: the Python-side cost of the allocator readings around one sampled CUDA call.

Not a GPU measurement. No CUDA is touched: ``torch.cuda.memory_stats_as_nested_dict`` (the
binding ``torch._C._cuda_memoryStats`` behind an initialised check) is replaced by a Python
function returning a dictionary of the real shape (~120 values: 9 statistics x 3 pools x 4
metrics, plus counters). What the numbers show:

- ``old``: four per-value reads per call (``memory_allocated`` and ``max_memory_allocated``
  before and after), each going through ``torch.cuda.memory_stats()``, which flattens and sorts
  the whole dictionary to return one value — PyTorch's own Python code, measured for real;
- ``new``: ``capture.device.memory_before`` / ``memory_after`` — one read per side, two values
  picked from the nested dictionary.

Two variants of the stand-in binding: ``prebuilt`` returns one dictionary (the binding's own cost
left out: what the change saves in Python alone), ``rebuilt`` builds a new one per call in Python
(an over-estimate of the C++ build). The real per-call cost on a GPU (C++ dictionary build, the
allocator's lock) needs a CUDA run; ``benchmarks/`` will carry it when a GPU is lent.

Run: python benchmarks/bench_allocator_reads.py [--calls 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.cuda.memory as cuda_memory

from attnscope._capture import device

_ARRAYS = ("allocation", "segment", "active", "inactive_split", "allocated_bytes",
           "reserved_bytes", "active_bytes", "inactive_split_bytes", "requested_bytes")
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc",
             "num_device_free", "max_split_size")


def _stats() -> dict[str, Any]:
    def stat(n: int) -> dict[str, int]:
        return {"current": n, "peak": 2 * n, "allocated": 3 * n, "freed": 2 * n}

    out: dict[str, Any] = {name: 0 for name in _COUNTERS}
    for name in _ARRAYS:
        out[name] = {pool: stat(1 << 20) for pool in ("all", "small_pool", "large_pool")}
    out["oversize_allocations"] = stat(0)
    out["oversize_segments"] = stat(0)
    return out


def _old(dev: torch.device) -> None:
    torch.cuda.memory_allocated(dev)
    torch.cuda.max_memory_allocated(dev)
    torch.cuda.memory_allocated(dev)
    torch.cuda.max_memory_allocated(dev)


def _new(dev: torch.device) -> None:
    mem = device.memory_before(dev, False)
    assert mem is not None
    device.memory_after(mem)


def _per_call_us(fn: Callable[[torch.device], None], calls: int, rounds: int) -> float:
    dev = torch.device("cuda", 0)
    best = []
    for _ in range(rounds):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            fn(dev)
        best.append((time.perf_counter_ns() - t0) / calls / 1000)
    return statistics.median(best)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    opts = parser.parse_args()
    prebuilt = _stats()
    variants: dict[str, Callable[..., dict[str, Any]]] = {
        "prebuilt": lambda device=None: prebuilt,
        "rebuilt": lambda device=None: _stats(),
    }
    real = (cuda_memory.memory_stats_as_nested_dict, torch.cuda.memory_stats_as_nested_dict)
    print("SIMULATION (CPU, stand-in stats binding): allocator readings per sampled call, µs")
    try:
        for name, stand_in in variants.items():
            cuda_memory.memory_stats_as_nested_dict = stand_in  # what memory_stats() calls
            torch.cuda.memory_stats_as_nested_dict = stand_in  # what attnscope calls
            old = _per_call_us(_old, opts.calls, opts.rounds)
            new = _per_call_us(_new, opts.calls, opts.rounds)
            print(f"  {name:9s} old (4 flattened reads) {old:7.2f}   new (2 nested reads) "
                  f"{new:6.2f}   saved {old - new:7.2f}")
    finally:
        cuda_memory.memory_stats_as_nested_dict, torch.cuda.memory_stats_as_nested_dict = real


if __name__ == "__main__":
    main()
