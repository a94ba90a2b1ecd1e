"""What a CUDA graph replay costs with attnscope (issue 40), measured side by side in one run.

Host (calling-thread) cost per ``replay()`` call, median over interleaved rounds:
  plain        the graph class's own replay, unpatched
  no record    patched, a graph that holds no instrumented call (one dictionary lookup)
  unsampled    patched, a graph with captured calls, its replays never sampled
  sampled      the same, every replay sampled (a pooled event pair, a capture for the worker)
With ``--device cpu`` (default) the graph is a fake one whose replay does nothing, so the figures
are attnscope's own cost; on CUDA (``--device cuda``) the real ``torch.cuda.CUDAGraph`` of a step
of SDPA calls, which adds the launch itself to every row.

On CUDA it also takes the GPU side: the device time of a replay of the same step captured with
attnscope's external event pairs (one pair per call) and without, interleaved, as a ratio
(target <= 1.01). Target for the host: an unsampled replay <= 1 µs over plain.

Run: python benchmarks/bench_graph_replay.py [--device cpu|cuda] [--rounds 9] [--replays 20000]
"""

from __future__ import annotations

import argparse
import contextlib
import platform
import statistics
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch

import attnscope
from attnscope._capture import args as _args
from attnscope._capture import device as _device
from attnscope._capture import graphs
from attnscope._capture.device import CudaEventPool
from attnscope._runtime import runtime
from attnscope._worker import cuda as _cuda

CALLS = 8  # attention calls in the captured step
SHAPE = (8, 16, 1024, 64)  # the SDPA call (bf16 on CUDA)


class _Event:
    """A host-only timing event: what the fake graph's capture and replay record."""

    def record(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Any) -> float:
        return 0.01


class FakeGraph:
    """capture_begin / capture_end / replay with nothing behind them."""

    capturing = False

    def capture_begin(self, *a: Any, **k: Any) -> None:
        FakeGraph.capturing = True

    def capture_end(self) -> None:
        FakeGraph.capturing = False

    def replay(self) -> None:
        pass


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def _set(**settings: Any) -> None:
    """attnscope configured for the measurement: nothing exported, no metrics, no profile tier,
    no warm-up (each row's settings on top)."""
    attnscope.configure(exporter="none", metrics=False, profile_rate=0.0,
                        **settings)


def per_call_ns(fn: Callable[[], Any], calls: int) -> float:
    cpu = time.thread_time_ns()
    for _ in range(calls):
        fn()
    return (time.thread_time_ns() - cpu) / calls


@contextlib.contextmanager
def _fake_cuda() -> Iterator[None]:
    """Calls look like CUDA calls on a capturing stream while the fake graph captures."""
    cuda0 = torch.device("cuda", 0)
    patches: list[tuple[Any, str, Any]] = [
        (_args, "tensor_device", lambda a, k: cuda0),
        (torch.cuda, "is_current_stream_capturing", lambda: FakeGraph.capturing),
        (runtime.device, "event_pool", CudaEventPool(make_event=_Event)),
        (_device, "memory_before", lambda dev, reset: None),
        # the worker's own device set-up (set_device, a side stream): not on a CPU build
        (_cuda.DeviceAccess, "prepare", lambda self, dev: None),
        (_cuda.DeviceAccess, "reading", lambda self, dev: contextlib.nullcontext()),
    ]
    saved = [(obj, name, getattr(obj, name)) for obj, name, _ in patches]
    for obj, name, value in patches:
        setattr(obj, name, value)
    try:
        yield
    finally:
        for obj, name, value in saved:
            setattr(obj, name, value)


def _step(q: torch.Tensor) -> None:
    for _ in range(CALLS):
        attention(q, q, q)


def _captured(cls: Any, q: torch.Tensor, cuda: bool) -> Any:
    graph = cls()
    if cuda:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            _step(q)
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            _step(q)
    else:
        graph.capture_begin()
        _step(q)
        graph.capture_end()
    return graph


def host_costs(cls: Any, q: torch.Tensor, cuda: bool, rounds: int,
               replays: int) -> dict[str, float]:
    graphs.uninstall(cls)
    plain_graph = _captured(cls, q, cuda)
    plain = types.MethodType(cls.replay, plain_graph)  # the unpatched method, bound
    graphs.install(cls)
    _set(enabled=True, sample_rate=0.0)
    bare = _captured(cls, q, cuda)
    # a graph with no record: captured while attnscope was off
    _set(enabled=False)
    empty = _captured(cls, q, cuda)
    _set(enabled=True, sample_rate=0.0)
    assert graphs.record_of(bare) is not None and graphs.record_of(empty) is None
    rows: dict[str, list[float]] = {"plain": [], "no record": [], "unsampled": [], "sampled": []}
    for _ in range(rounds):
        rows["plain"].append(per_call_ns(plain, replays))
        rows["no record"].append(per_call_ns(empty.replay, replays))
        _set(sample_rate=0.0)
        rows["unsampled"].append(per_call_ns(bare.replay, replays))
        _set(sample_rate=1.0, overhead_budget=1.0, queue_size=1 << 20)
        rows["sampled"].append(per_call_ns(bare.replay, max(1, replays // 20)))
        attnscope.flush(timeout_s=60.0)
        if cuda:
            torch.cuda.synchronize()
    return {name: statistics.median(values) for name, values in rows.items()}


def device_ratio(q: torch.Tensor, rounds: int) -> tuple[float, float]:
    """Median device ms of a replay without and with the external event pairs."""
    cls = torch.cuda.CUDAGraph
    _set(enabled=False)
    without = _captured(cls, q, True)
    _set(enabled=True, sample_rate=0.0)
    with_pairs = _captured(cls, q, True)
    assert graphs.record_of(with_pairs) is not None
    times: dict[str, list[float]] = {"without": [], "with": []}
    for _ in range(rounds):
        for name, graph in (("without", without), ("with", with_pairs)):
            start, end = (torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
                          for _ in range(2))
            # the replays are queued before the GPU reaches them
            torch.cuda._sleep(10_000_000)  # type: ignore[no-untyped-call]
            start.record()
            for _ in range(50):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end) / 50)
    return statistics.median(times["without"]), statistics.median(times["with"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--replays", type=int, default=20000)
    args = parser.parse_args()
    cuda = args.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device here")
    print(f"python {platform.python_version()}, torch {torch.__version__}, {platform.machine()}, "
          f"device {args.device}, {CALLS} calls captured")
    if cuda:
        q = torch.randn(SHAPE, device="cuda", dtype=torch.bfloat16)
        costs = host_costs(torch.cuda.CUDAGraph, q, True, args.rounds, args.replays // 10)
    else:
        q = torch.randn(1, 2, 16, 8)
        with _fake_cuda():
            costs = host_costs(FakeGraph, q, False, args.rounds, args.replays)
    print("host, calling-thread CPU per replay() (median of rounds):")
    for name, ns in costs.items():
        print(f"  {name:<10} {ns:10.0f} ns   over plain {ns - costs['plain']:+8.0f} ns")
    if cuda:
        plain_ms, pairs_ms = device_ratio(q, args.rounds)
        print(f"device per replay: without pairs {plain_ms:.4f} ms, with {pairs_ms:.4f} ms, "
              f"ratio {pairs_ms / plain_ms:.4f}")


if __name__ == "__main__":
    main()
