"""What a sampled call with a mask costs the calling thread, before and after issue 37 goal 2.

    python benchmarks/bench_mask_reduce.py                 # CPU: op counts, µs per enqueue
    python benchmarks/bench_mask_reduce.py --device cuda   # the calling thread's launches
    python benchmarks/bench_mask_reduce.py --before REV    # the "before" column from REV

"before": the reductions of ``attnscope/_record/reduce.py`` as it was at ``--before`` (default
5579ee0, the last commit before issue 37 goal 2), run on the mask's device behind the call and
their nine counts copied to the host, as ``capture.hostread`` did. "after": today's
``hostread.to_host`` on an instrumented layer's capture, the first call given this mask: its
boolean view copied to the host (bit-packed when large), the counts left to the worker. "again":
the next call given the same mask (every layer of a forward after the first): nothing is
enqueued, the first call's copy and counts are shared.

"ops per enqueue" counts the ATen operators enqueued per call with a TorchDispatchMode, views
left out (they launch nothing); on CUDA each is about one launch, the pinned allocation and the
copies included. The count is the same on either device, so a change is checked without a GPU.
"µs per enqueue": median calling-thread time per call (min–max over the repeats, before and
after interleaved). On CPU it includes the operators' own work, which on CUDA runs on the device:
the small masks show the dispatch cost, the large ones mostly arithmetic. "worker ms": what
"after" left to the worker (unpacking the copy and counting, on the CPU; once per mask, not per
layer: the worker's memory of recent masks is cleared before each timed read). "device ms"
(CUDA): the GPU time behind the call.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import types
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from attnscope._capture import hostread, retain
from attnscope._record.capture import AttentionFacts, Capture, Facts, HostCopy
from attnscope._runtime import runtime

_ROOT = Path(__file__).resolve().parent.parent


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


def _baseline(rev: str) -> tuple[types.ModuleType, str]:
    """The mask reductions as they were at ``rev`` (self-contained: they import only torch), and
    what the "before" column is. Where the tree has no git history (a copy sent to a GPU
    machine), today's ``_record/reduce.py``: its reductions are the ones ``rev`` enqueued on the
    device, so the counts are still checked and the column still shows that path's cost."""
    shown = None
    for path in ("attnscope/_record/reduce.py", "attnscope/record/reduce.py"):  # renamed since
        try:
            done = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=_ROOT,
                                  capture_output=True, text=True)
        except OSError:  # no git at all
            break
        if done.returncode == 0:
            shown = done
            break
    if shown is None:
        from attnscope._record import reduce

        return reduce, f"today's _record/reduce.py ({rev} not found: no git history here)"
    module = types.ModuleType(f"reduce_at_{rev}")
    exec(compile(shown.stdout, f"{rev}:{path}", "exec"), module.__dict__)
    return module, rev


def _causal(batch: int, sq: int, skv: int, device: str) -> torch.Tensor:
    d = torch.arange(skv).unsqueeze(0) - torch.arange(sq).unsqueeze(1) - (skv - sq)
    mask = torch.zeros(sq, skv).masked_fill(d > 0, float("-inf"))
    mask = mask.expand(batch, 1, sq, skv).contiguous()
    mask[0, :, :, : skv // 8] = float("-inf")  # row 0 left-padded
    return mask.to(device)


def _host(values: torch.Tensor) -> torch.Tensor:
    host = torch.empty(values.shape, dtype=values.dtype, pin_memory=values.is_cuda)
    host.copy_(values, non_blocking=True)
    return host


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def _timed(fn: Any, device: str) -> tuple[float, float]:
    """(host µs of one call, device ms behind it or nan)."""
    _sync(device)
    if device == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    fn()
    host = (time.perf_counter() - t0) * 1e6
    _release()
    if device != "cuda":
        return host, float("nan")
    end.record()
    end.synchronize()
    return host, start.elapsed_time(end)


_built: list[Capture] = []


def _release() -> None:
    """The keeping budget back, as the worker gives it back once it built the captures."""
    while _built:
        retain.release(_built.pop())


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} ({min(values):.0f}–{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--before", default="5579ee0", help="git revision of the 'before' column")
    args = parser.parse_args()
    device = args.device
    old, before_is = _baseline(args.before)
    if device == "cpu":  # CPU tensors take the CUDA path: the same operators, counted and timed
        hostread._on_device = lambda v: isinstance(v, torch.Tensor)  # type: ignore[assignment]
    shapes = [(1, 128, 128), (4, 512, 512), (2, 1024, 2048), (1, 1, 4096), (1, 2048, 2048)]
    print(f"device={device}  torch {torch.__version__}  before={before_is}  "
          f"repeat={args.repeat} (median (min–max))")
    print(f"{'':30} {'ops per enqueue':>18} {'calling thread µs per enqueue':>68}")
    print(f"{'mask (B,1,Sq,Skv) float32':24} {'MiB':>5} {'before':>6} {'after':>5} {'again':>5} "
          f"{'before':>26} {'after':>22} {'again':>18} {'worker ms':>9} {'device ms b/a':>13}")
    for batch, sq, skv in shapes:
        mask = _causal(batch, sq, skv, device)
        plan = old.plan_mask(tuple(mask.shape), batch, 8, sq, skv)

        # bound per iteration: before/after are called (and timed) only within this iteration
        def before(mask: torch.Tensor = mask, plan: Any = plan, sq: int = sq,
                   skv: int = skv) -> Any:
            return _host(old.mask_numbers(mask, False, plan, sq, skv))

        def after(mask: torch.Tensor = mask, sq: int = sq, skv: int = skv,
                  batch: int = batch) -> Any:
            f = AttentionFacts(batch, sq)
            f.cached, f.past, f.mask, f.heads = True, skv - sq, mask, 8
            cap = Capture()
            cap.kept_bytes = 0
            cap.facts = Facts(f)
            hostread.to_host(cap)
            _built.append(cap)
            return f.mask

        want = before()
        _sync(device)
        copy = after()
        _release()
        _sync(device)
        assert isinstance(copy, HostCopy) and copy.read() == want.tolist(), "counts differ"
        counts = []
        for fn in (before, _fresh(after), after):
            with _Ops() as ops:
                fn()
            _release()
            counts.append(ops.count)
        times: dict[str, list[float]] = {"before": [], "after": [], "again": []}
        dev: dict[str, list[float]] = {"before": [], "after": []}
        worker: list[float] = []
        for _ in range(args.repeat):  # interleaved: the machine's noise hits both alike
            for name, fn in (("before", before), ("after", _fresh(after))):
                h, d = _timed(fn, device)
                times[name].append(h)
                dev[name].append(d)
            times["again"].append(_timed(after, device)[0])  # the next layer, the same mask
            copy = _fresh(after)()
            _release()
            _sync(device)
            runtime.masks.reset()  # counted, not taken from an equal mask read before
            t0 = time.perf_counter()
            copy.read()
            worker.append((time.perf_counter() - t0) * 1e3)
        mib = mask.numel() * mask.element_size() / 2**20
        device_ms = (f"{statistics.median(dev['before']):.3f}/{statistics.median(dev['after']):.3f}"
                     if device == "cuda" else "-")
        print(f"{str((batch, 1, sq, skv)):24} {mib:5.1f} {counts[0]:6d} {counts[1]:5d} "
              f"{counts[2]:5d} {_spread(times['before']):>26} {_spread(times['after']):>22} "
              f"{_spread(times['again']):>18} {statistics.median(worker):9.2f} {device_ms:>13}")


def _fresh(fn: Any) -> Any:
    """``fn`` as a call given a mask the thread has not copied yet (the first layer's)."""
    def first() -> Any:
        hostread._recent.last = None
        return fn()

    return first


if __name__ == "__main__":
    main()
