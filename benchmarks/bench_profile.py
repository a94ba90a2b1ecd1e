"""What the profile and timing tiers cost the calling thread, and what a profiled call finds.

    python benchmarks/bench_profile.py                      # CPU, small shape
    python benchmarks/bench_profile.py --device cuda        # bf16 (8, 16, 1024, 64)
    python benchmarks/bench_profile.py --json out.json      # also write the figures

"own" is attnscope's own time on the calling thread for one sampled call (what the wrapper adds
before and after the user's call: ``Capture.overhead_ns``, profiler start/stop included); "wall" is
the traced call's wall time minus the median untraced call, so it also holds what the profiler
adds inside the call (per-op recording) and is noisier. First-call figures come from fresh
processes (``--runs``). On CUDA, calls are timed without synchronising; the device is drained
between calls, outside the measured window.

Sections
  1. cold reference: first ``torch.profiler.profile`` use in a fresh subprocess (not attnscope)
  2. profile tier in fresh processes: the first sampled call (it starts the worker, which warms
     the profiler up), the first profiled call, later profiled calls
  3. timing tier: every call sampled at the timing tier
  4. kernels per forward and detected backend for each attention variant
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F

import attnscope
from attnscope._capture import profiler_session as _profile
from attnscope._runtime import runtime
from attnscope.testing import capture_spans

_COLD_SNIPPET = """
import time, torch
q = torch.randn({shape}, device={device!r}, dtype=torch.{dtype})
f = lambda: torch.nn.functional.scaled_dot_product_attention(q, q, q)
f()
t0 = time.perf_counter()
with torch.profiler.profile(record_shapes=True, profile_memory=True):
    f()
t1 = time.perf_counter()
with torch.profiler.profile(record_shapes=True, profile_memory=True):
    f()
t2 = time.perf_counter()
print((t1 - t0) * 1e9, (t2 - t1) * 1e9)
"""


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Callable[[], Any], device: str) -> int:
    _sync(device)
    t0 = time.perf_counter_ns()
    fn()
    t1 = time.perf_counter_ns()
    _sync(device)
    return t1 - t0


def _median(fn: Callable[[], Any], device: str, n: int) -> float:
    return statistics.median(_timed(fn, device) for _ in range(n))


def cold_reference(shape: tuple[int, ...], device: str, dtype: str) -> tuple[float, float] | None:
    code = _COLD_SNIPPET.format(shape=shape, device=device, dtype=dtype)
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=300)
        first, second = out.stdout.split()[-2:]
        return float(first), float(second)
    except Exception as exc:  # informative only
        print(f"(cold reference failed: {exc!r})", file=sys.stderr)
        return None


class _OwnCost:
    """Collects attnscope's own calling-thread time per sampled call (what the overhead budget
    is charged with).

    The wrapper hands a call's cost to the budget only while one is set (``overhead_budget`` <
    1), and a set budget would throttle the very calls measured: :meth:`arm`, after each
    ``configure()``, sets one whose ``add`` records and adapts nothing. (Without it no cost was
    ever recorded: ``own.take()[0]`` raised IndexError, then ``median`` of nothing, issue 36 §5.)
    """

    def __init__(self) -> None:
        from attnscope._capture.sampling import OverheadBudget

        self.values: list[int] = []

        def add(budget: OverheadBudget, own_ns: int, wall_ns: int, rate: float) -> None:
            self.values.append(own_ns)

        OverheadBudget.add = add  # type: ignore[method-assign,assignment]

    def arm(self) -> None:
        runtime.sampler.budget.budget = 0.5  # below 1: the wrapper reports each call's cost

    def take(self) -> list[int]:
        out, self.values = self.values, []
        return out


def _attention() -> Callable[..., Any]:
    @attnscope.trace
    def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)

    return attention


def first_profiled(q: torch.Tensor, device: str, later_n: int) -> dict[str, Any]:
    """In a fresh process: the first sampled call, the first profiled call, later profiled calls."""
    own = _OwnCost()
    attention = _attention()

    def bare() -> Any:
        return F.scaled_dot_product_attention(q, q, q)

    def traced() -> Any:
        return attention(q, q, q)

    for _ in range(5):
        bare()
    base = _median(bare, device, 50)
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=1.0, profile_max_per_minute=1e9, metrics=False)
    own.arm()
    with attnscope.sampling(force=True, profile=False):
        first_sampled = _timed(traced, device)  # starts the worker, which warms the profiler up
    first_sampled_own = own.take()[0]
    t0 = time.perf_counter()
    while (not (runtime.profiler.warm_cuda if device == "cuda" else runtime.profiler.warm_cpu)
           and time.perf_counter() - t0 < 60):
        if device == "cuda":
            _profile.warm_up_async(cuda=True)  # the worker warms CUDA only once CUDA is initialised
        time.sleep(0.005)
    warm_wait_s = time.perf_counter() - t0
    before = _profile.stats()["profiled"]
    first = _timed(traced, device)
    first_own = own.take()[0]
    profiled_first = _profile.stats()["profiled"] - before
    later = [_timed(traced, device) for _ in range(later_n)]
    later_own = own.take()
    attnscope.flush(timeout_s=60)
    profiled = _profile.stats()["profiled"] - before
    attnscope.shutdown()
    return {
        "bare_ns": base,
        "first_sampled_wall_ns": first_sampled - base,
        "first_sampled_own_ns": first_sampled_own,
        "warm_up_wait_s": warm_wait_s,
        "first_profiled_wall_ns": first - base,
        "first_profiled_own_ns": first_own,
        "first_was_profiled": profiled_first == 1,
        "later_profiled_wall_ns": statistics.median(later) - base,
        "later_profiled_own_ns": statistics.median(later_own),
        "profiled_calls": profiled,
    }


def first_profiled_runs(args: argparse.Namespace, runs: int) -> list[dict[str, Any]]:
    out = []
    for _ in range(runs):
        cmd = [sys.executable, __file__, "--child-first", "--device", args.device, "--shape",
               ",".join(map(str, args.shape_t)), "--dtype", args.dtype_s]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
        if proc.returncode != 0 or not lines:
            print(f"(first-call child failed rc={proc.returncode}: {proc.stderr[-500:]})",
                  file=sys.stderr)
            continue
        out.append(json.loads(lines[-1]))
    return out


def timing_cost(q: torch.Tensor, device: str, n: int) -> dict[str, Any]:
    own = _OwnCost()
    attention = _attention()

    def bare() -> Any:
        return F.scaled_dot_product_attention(q, q, q)

    def traced() -> Any:
        return attention(q, q, q)

    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0, metrics=False)
    own.arm()
    for _ in range(10):
        traced()
    own.take()
    walls_bare, walls_traced = [], []
    for _ in range(n):  # interleaved, so drift hits both alike
        walls_bare.append(_timed(bare, device))
        walls_traced.append(_timed(traced, device))
    timing_own = own.take()
    attnscope.flush(timeout_s=60)
    attnscope.configure(enabled=False)
    disabled = _median(traced, device, n)
    attnscope.configure(enabled=True)
    base = statistics.median(walls_bare)
    return {
        "bare_ns": base,
        "timing_wall_ns": statistics.median(walls_traced) - base,
        "timing_own_ns": statistics.median(timing_own),
        "timing_own_p90_ns": sorted(timing_own)[int(0.9 * (len(timing_own) - 1))],
        "disabled_wall_ns": disabled - base,
    }


def _variants(device: str) -> list[tuple[str, Callable[..., Any], Any]]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v

    def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v)

    out: list[tuple[str, Callable[..., Any], Any]] = [
        ("naive matmul-softmax-matmul", naive, None),
        ("SDPA math", sdpa, sdpa_kernel(SDPBackend.MATH)),
    ]
    if device == "cuda":
        out += [
            ("SDPA efficient", sdpa, sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION)),
            ("SDPA flash", sdpa, sdpa_kernel(SDPBackend.FLASH_ATTENTION)),
            ("SDPA cuDNN", sdpa, sdpa_kernel(SDPBackend.CUDNN_ATTENTION)),
        ]
    else:
        out.append(("SDPA default (CPU flash)", sdpa, None))
    return out


def kernels_per_forward(q: torch.Tensor, device: str) -> list[dict[str, Any]]:
    _profile.warm_up(cuda=device == "cuda")  # this section is about what a call finds, not cost
    rows = []
    for label, fn, ctx in _variants(device):
        traced = attnscope.trace(name=label)(fn)
        row: dict[str, Any] = {"variant": label}
        try:
            with ctx if ctx is not None else nullcontext():
                fn(q, q, q)  # the backend is available here, and warm
                _sync(device)
                with capture_spans(profile_rate=1.0, profile_max_per_minute=1e9,
                                   max_kernel_spans=256) as spans:
                    traced(q, q, q)
        except Exception as exc:
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:100]}"
            rows.append(row)
            continue
        parent = next(s for s in spans if "attnscope.tier" in (s.attributes or {}))
        a = dict(parent.attributes or {})
        row.update(
            tier=a.get("attnscope.tier"),
            kernels=a.get("attnscope.kernel.count"),
            kernel_ns=a.get("attnscope.kernel.total_ns"),
            backend=a.get("attnscope.backend"),
            top=list(a.get("attnscope.kernel.top_names", ()))[:3],
            launch_overhead_ns=a.get("attnscope.launch_overhead_ns"),
            peak_bytes=a.get("attnscope.memory.peak_bytes"),
        )
        rows.append(row)
    return rows


def _us(ns: float) -> str:
    return f"{ns / 1e3:10.1f} µs"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--shape", default=None,
                        help="B,H,S,D (default 8,16,1024,64 on CUDA, 2,8,256,64 on CPU)")
    parser.add_argument("--dtype", default=None, help="bfloat16 on CUDA, float32 on CPU by default")
    parser.add_argument("-n", type=int, default=200, help="calls per median")
    parser.add_argument("--runs", type=int, default=5,
                        help="fresh processes for the first-call figures")
    parser.add_argument("--no-cold", action="store_true",
                        help="skip the cold torch.profiler reference")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    parser.add_argument("--child-first", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    device = args.device
    args.shape_t = tuple(
        int(x)
        for x in (args.shape or ("8,16,1024,64" if device == "cuda" else "2,8,256,64")).split(",")
    )
    args.dtype_s = args.dtype or ("bfloat16" if device == "cuda" else "float32")
    q = torch.randn(args.shape_t, device=device, dtype=getattr(torch, args.dtype_s))
    if args.child_first:
        print(json.dumps(first_profiled(q, device, later_n=20)))
        return 0

    print(f"attnscope {attnscope.__version__}  torch {torch.__version__}  device={device}  "
          f"shape={args.shape_t}  dtype={args.dtype_s}  n={args.n}  runs={args.runs}")
    figures: dict[str, Any] = {"device": device, "shape": args.shape_t, "dtype": args.dtype_s,
                               "torch": torch.__version__}
    if device == "cuda":
        figures["gpu"] = torch.cuda.get_device_name()

    if not args.no_cold:
        cold = cold_reference(args.shape_t, device, args.dtype_s)
        if cold is not None:
            figures["cold_torch_profiler_first_ns"], figures["cold_torch_profiler_second_ns"] = cold
            print("\n1. reference, not attnscope: torch.profiler.profile in a fresh process")
            print(f"   first use {cold[0] / 1e6:10.2f} ms   second use {cold[1] / 1e6:8.2f} ms")

    runs = first_profiled_runs(args, args.runs)
    figures["first_call_runs"] = runs
    if runs:
        def med(key: str) -> float:
            return float(statistics.median(r[key] for r in runs))

        later_own, first_own = med("later_profiled_own_ns"), med("first_profiled_own_ns")
        later_wall, first_wall = med("later_profiled_wall_ns"), med("first_profiled_wall_ns")
        figures["first_vs_later_own_ratio"] = first_own / later_own if later_own else None
        print(f"\n2. profile tier, medians over {len(runs)} fresh processes "
              "(own = attnscope's calling-thread time; wall = traced - untraced call)")
        print(f"   {'untraced call':40s} {_us(med('bare_ns'))}")
        print(f"   {'first sampled call (starts the worker)':40s} "
              f"own {_us(med('first_sampled_own_ns'))}"
              f"   wall {_us(med('first_sampled_wall_ns'))}")
        print(f"   {'profiler warm-up, off the calling thread':40s} "
              f"{med('warm_up_wait_s') * 1e3:10.1f} ms until warm")
        print(f"   {'first profiled call':40s} own {_us(first_own)}   wall {_us(first_wall)}")
        print(f"   {'later profiled calls (median of 20)':40s} own {_us(later_own)}   "
              f"wall {_us(later_wall)}")
        print(f"   first/later ratio: own {first_own / later_own:.2f}   wall "
              f"{first_wall / later_wall if later_wall > 0 else float('nan'):.2f}   "
              f"first call profiled in {sum(r['first_was_profiled'] for r in runs)}/"
              f"{len(runs)} runs")

    costs = timing_cost(q, device, args.n)
    figures.update(costs)
    print(f"\n3. timing tier, every call sampled (median of {args.n})")
    print(f"   {'untraced call':40s} {_us(costs['bare_ns'])}")
    print(f"   {'timing tier':40s} own {_us(costs['timing_own_ns'])} "
          f"(p90 {costs['timing_own_p90_ns'] / 1e3:.1f} µs)"
          f"   wall {_us(costs['timing_wall_ns'])}")
    print(f"   {'attnscope disabled':40s}                    wall {_us(costs['disabled_wall_ns'])}")

    rows = kernels_per_forward(q, device)
    figures["kernels"] = rows
    print("\n4. kernels per forward (profile tier, one call each)")
    print(f"   {'variant':30s} {'backend':10s} {'kernels':>7s} {'kernel µs':>10s} "
          f"{'launch ovh µs':>13s}  top")
    for row in rows:
        if "error" in row:
            print(f"   {row['variant']:30s} unavailable: {row['error']}")
            continue
        ovh = row["launch_overhead_ns"]
        print(f"   {row['variant']:30s} {str(row['backend']):10s} {str(row['kernels']):>7s} "
              f"{(row['kernel_ns'] or 0) / 1e3:10.1f} "
              f"{'-' if ovh is None else f'{ovh / 1e3:.1f}':>13s}"
              f"  {', '.join(n[:40] for n in row['top'])}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(figures, fh, indent=2, default=str)
    attnscope.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
