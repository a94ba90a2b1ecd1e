"""Allocator readings on a real GPU (issue 15 items 4, 5, and 7's capture check; needs CUDA).

One allocator query per side of a sampled call; an allocator that refuses statistics (as
CUDAPluggableAllocator does) leaves device time on and the call site traced; the graph-capture
check looks at the tensor's device.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

import attnscope
from attnscope import _log
from attnscope.testing import capture_spans

from ..support.helpers import attrs

MIB = 1 << 20


@attnscope.trace
def keeps(x: torch.Tensor, nbytes: int) -> torch.Tensor:
    kept = torch.empty(nbytes, dtype=torch.uint8, device=x.device)
    scratch = torch.empty(2 * nbytes, dtype=torch.uint8, device=x.device)
    del scratch
    return kept


@attnscope.trace
def attention(q: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Count torch._C._cuda_memoryStats calls (every allocator statistics read goes through it)."""
    calls: list[int] = []
    real = torch._C._cuda_memoryStats

    def counted(device: int) -> dict[str, Any]:
        calls.append(device)
        return real(device)

    monkeypatch.setattr(torch._C, "_cuda_memoryStats", counted)
    return calls


def test_one_allocator_read_per_side_and_exact_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    x = torch.ones(16, device="cuda")
    keeps(x, MIB)  # allocator blocks exist; the kernels are loaded
    torch.cuda.synchronize()
    calls = _counting(monkeypatch)
    kept = []
    with capture_spans(reset_peak_memory_stats=True) as spans:
        for _ in range(5):
            kept.append(keeps(x, 4 * MIB))
    assert len(calls) == 10  # before and after each call; today's code: 4 reads per call
    assert set(calls) == {x.device.index}
    for span in spans:
        a = attrs(span)
        assert a["attnscope.memory.delta_bytes"] == 4 * MIB
        assert a["attnscope.memory.peak_bytes"] == 12 * MIB
        assert a["attnscope.device_ns"] > 0


def test_refused_statistics_keep_device_time_and_the_site(monkeypatch: pytest.MonkeyPatch) -> None:
    """What CUDAPluggableAllocator does, on the real CUDA path.

    The stats and the peak reset raise.
    """
    q = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16)
    attention.__wrapped__(q)  # type: ignore[attr-defined]
    torch.cuda.synchronize()

    def refuse(device: int) -> Any:
        raise RuntimeError("CUDAPluggableAllocator does not yet support getDeviceStats.")

    monkeypatch.setattr(torch._C, "_cuda_memoryStats", refuse)
    monkeypatch.setattr(torch._C, "_cuda_resetPeakMemoryStats", refuse)
    with capture_spans(reset_peak_memory_stats=True) as spans:
        for _ in range(20):  # today's code switches the site off after 5 and drops every span
            attention(q)
    assert len(spans) == 20
    for span in spans:
        a = attrs(span)
        assert a["attnscope.device_ns"] > 0
        assert "attnscope.memory.delta_bytes" not in a and "attnscope.memory.peak_bytes" not in a
    assert _log.error_count("capture") == 0


_ALLOCATOR_C = """
#include <stddef.h>
#include <sys/types.h>
extern int cudaMalloc(void **ptr, size_t size);
extern int cudaFree(void *ptr);
void *attnscope_test_alloc(ssize_t size, int device, void *stream) {
    void *ptr = NULL;
    if (cudaMalloc(&ptr, (size_t)size) != 0) return NULL;
    return ptr;
}
void attnscope_test_free(void *ptr, ssize_t size, int device, void *stream) { cudaFree(ptr); }
"""

_CHILD = """
import json, sys, torch
import attnscope
from attnscope.testing import capture_spans

allocator = torch.cuda.memory.CUDAPluggableAllocator(
    sys.argv[1], "attnscope_test_alloc", "attnscope_test_free")
torch.cuda.memory.change_current_allocator(allocator)

@attnscope.trace
def attention(q):
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)

q = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.float16)
try:
    torch.cuda.memory_stats(0)
    refused = False
except RuntimeError:
    refused = True
with capture_spans(reset_peak_memory_stats=True) as spans:
    for _ in range(12):
        attention(q)
print(json.dumps({"refused": refused, "spans": [dict(s.attributes) for s in spans]}, default=str))
"""


def test_a_real_pluggable_allocator(tmp_path: Path) -> None:
    """A CUDAPluggableAllocator over cudaMalloc, in a fresh process (it must be set before the
    first CUDA allocation)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the test allocator")
    source = tmp_path / "alloc.c"
    source.write_text(_ALLOCATOR_C)
    lib = tmp_path / "alloc.so"
    built = subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(source)],
                           capture_output=True, text=True)
    if built.returncode != 0:
        pytest.skip(f"could not build the test allocator: {built.stderr[-300:]}")
    env = {**os.environ, "ATTNSCOPE_EXPORTER": "none", "ATTNSCOPE_METRICS": "false"}
    run = subprocess.run([sys.executable, "-c", textwrap.dedent(_CHILD), str(lib)],
                         capture_output=True, text=True, timeout=180, env=env,
                         cwd=Path(attnscope.__file__).parent.parent)
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    spans = result["spans"]
    assert len(spans) == 12, run.stderr[-2000:]
    for a in spans:
        assert a["attnscope.device_ns"] > 0
        if result["refused"]:
            assert "attnscope.memory.delta_bytes" not in a
    print(f"\npluggable allocator refuses memory_stats: {result['refused']}")


def test_capture_check_on_the_tensors_device() -> None:
    """A graph captured on cuda:1 while cuda:0 is the current device: the call passes through."""
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    q = torch.randn(2, 4, 128, 64, device="cuda:1", dtype=torch.float16)
    attention.__wrapped__(q)  # type: ignore[attr-defined]
    torch.cuda.synchronize(1)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.device(1):
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    with capture_spans() as spans:
        with torch.cuda.stream(side):  # cuda:1's current stream, and cuda:1 current
            graph.capture_begin()
            try:
                with torch.cuda.device(0):  # current device 0: its stream is not capturing
                    out = attention(q)  # the tensor's (cuda:1's) current stream is
            finally:
                graph.capture_end()
        graph.replay()
        torch.cuda.synchronize(1)
    assert spans == []
    torch.testing.assert_close(out, attention.__wrapped__(q))  # type: ignore[attr-defined]
