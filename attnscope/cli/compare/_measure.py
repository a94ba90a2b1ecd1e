"""How ``attnscope compare`` measures: inputs, the float64 reference, calls under attnscope.

Every implementation runs on the same inputs: a probe call (does it run here? its output is checked
against the reference), warm-up calls, timed calls at attnscope's timing tier in rounds (``_plan``)
and profiled calls at the profile tier. The figures are read from attnscope's spans (``_stats``);
the one clock here times a warm-up call, for the plan only.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

import attnscope

from ... import _api
from ..._capture import profiler_session as profiler
from ._impls import SDPA_BACKENDS, Impl, repeat_kv, sdpa_repeating

__all__ = ["Spec", "TOLERANCE", "Probe", "make_inputs", "reference", "errors", "session",
           "probe", "warm", "timed", "profiled", "SPAN_PREFIX", "scores_bytes", "free_bytes"]

SPAN_PREFIX = "compare."
# Max abs error against the float64 reference allowed per dtype, for the standard-normal inputs
# compare makes (outputs are O(1)). About 8 units in the last place at 1.0 for the half types
# (bf16 2^-7 · 8, fp16 2^-10 · 8); fp32's accumulated rounding is ~1e-6, allowed 1e-4.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 7.8e-3, torch.bfloat16: 6.25e-2}
_NO_KERNEL = ("No available kernel", "No viable backend")
_REFERENCE_CHUNK = 256 * 2**20


@dataclasses.dataclass(frozen=True)
class Spec:
    """What to compare on: the shape, dtype, device, how many calls of each kind and the time
    they may take."""

    batch: int
    heads: int
    kv_heads: int
    seq_len: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device
    causal: bool = False
    runs: int = 50
    warmup: int = 5
    profile_runs: int = 2
    seed: int = 0
    budget_s: float | None = None  # warm-up and timed calls of all together (``_plan``)
    kv_len: int | None = None  # keys per sequence; None: ``seq_len``

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return self.batch, self.heads, self.seq_len, self.head_dim

    @property
    def keys(self) -> int:
        return self.seq_len if self.kv_len is None else self.kv_len


@dataclasses.dataclass
class Probe:
    """The first call's verdict: the implementation to time (maybe a fallback), its output or why
    it could not run (``error``), and torch's warnings that explain it."""

    impl: Impl
    output: torch.Tensor | None = None
    error: str | None = None
    warnings: list[str] = dataclasses.field(default_factory=list)


def make_inputs(spec: Spec) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Standard-normal q (B,H,S,D), k and v (B,H_kv,keys,D), drawn in float32 from ``seed``."""
    gen = torch.Generator().manual_seed(spec.seed)
    kv = (spec.batch, spec.kv_heads, spec.keys, spec.head_dim)
    shapes = (spec.shape, kv, kv)
    return tuple(torch.randn(s, generator=gen).to(device=spec.device, dtype=spec.dtype)
                 for s in shapes)  # type: ignore[return-value]


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
              chunk_bytes: int = _REFERENCE_CHUNK) -> torch.Tensor:
    """Attention of the same (already rounded) inputs in float64 on their device: matmul → softmax →
    matmul, K/V repeated for GQA, causal aligned bottom-right. Query rows go in chunks so that
    one chunk's scores take at most ``chunk_bytes`` (a long sequence would not fit at once)."""
    q64, k64, v64 = (t.detach().to(torch.float64) for t in (q, k, v))
    k64, v64 = repeat_kv(k64, q64.shape[1]), repeat_kv(v64, q64.shape[1])
    b, h, sq, _ = q64.shape
    skv = k64.shape[-2]
    rows = max(1, chunk_bytes // (8 * b * h * skv))
    out = torch.empty(b, h, sq, v64.shape[-1], dtype=torch.float64)
    keys = torch.arange(skv, device=q64.device)
    for start in range(0, sq, rows):
        scores = q64[:, :, start:start + rows] @ k64.transpose(-1, -2) / math.sqrt(q64.shape[-1])
        if causal:
            queries = torch.arange(start, min(start + rows, sq), device=q64.device).unsqueeze(-1)
            scores = scores.masked_fill(keys > queries + (skv - sq), float("-inf"))
        out[:, :, start:start + rows] = (torch.softmax(scores, dim=-1) @ v64).cpu()
    return out


def scores_bytes(spec: Spec) -> int:
    """Bytes of one S×keys score matrix per head of the whole batch in ``spec.dtype``: what the
    unfused implementations (naive, SDPA math) materialise, a few times over."""
    return spec.batch * spec.heads * spec.seq_len * spec.keys * spec.dtype.itemsize


def free_bytes(device: torch.device) -> int:
    """Memory free for new tensors on ``device``: CUDA's free memory, else the host's available."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    import psutil

    return int(psutil.virtual_memory().available)


def errors(output: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(max abs error, that divided by max |reference|) of ``output`` cast to float64."""
    diff = (output.detach().to("cpu", torch.float64) - ref).abs().max().item()
    scale = ref.abs().max().item()
    return float(diff), float(diff / scale) if scale > 0 else math.inf


@contextmanager
def session(device: torch.device) -> Iterator[Any]:
    """attnscope capturing every call into memory; the previous configuration restored after.

    Yields the in-memory exporter; its spans are complete once the block has left.
    """
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from ..._export.ids import IDS

    memory = InMemorySpanExporter()
    provider = TracerProvider(id_generator=IDS)  # torch.compile's random state: export.ids
    provider.add_span_processor(SimpleSpanProcessor(memory))
    previous = _api.current()
    attnscope.shutdown(timeout_s=5.0)
    attnscope.configure(tracer_provider=provider, sample_rate=1.0, warmup_calls=0,
                        profile_rate=0.0, profile_max_per_minute=1e6, overhead_budget=1.0,
                        reset_peak_memory_stats=device.type == "cuda")
    # the profile-tier calls must not find the profiler cold (they would be timed instead)
    profiler.warm_up(device.type == "cuda")
    try:
        yield memory
    finally:
        attnscope.flush(timeout_s=30.0)
        attnscope.shutdown(timeout_s=10.0)
        _api.restore(previous)
        provider.shutdown()


def _call(fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], causal: bool) -> Any:
    return fn(*inputs, is_causal=causal)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _first_call(impl: Impl, inputs: tuple[torch.Tensor, ...], spec: Spec) -> Probe:
    caught: list[str] = []
    error: str | None = None
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            with impl.context(), attnscope.sampling(force=False), torch.inference_mode():
                out = _call(impl.fn, inputs, spec.causal)
            _sync(spec.device)
        except Exception as exc:  # the implementation's own failure is the finding
            error = f"{type(exc).__name__}: {_first_line(exc)}"
            out = None
        caught = [_first_line(w.message) for w in seen]
    if error is None:
        error = _check_output(out, spec)
    return Probe(impl, out if error is None else None, error, list(dict.fromkeys(caught)))


def probe(impl: Impl, inputs: tuple[torch.Tensor, ...], spec: Spec) -> Probe:
    """One untraced call: does ``impl`` run on these inputs here, and what did it return?

    An SDPA backend that has no kernel taking ``enable_gqa`` is tried again with K/V repeated.
    """
    first = _first_call(impl, inputs, spec)
    if (first.error is not None and impl.name in SDPA_BACKENDS and not impl.user
            and spec.kv_heads != spec.heads and any(m in first.error for m in _NO_KERNEL)):
        second = _first_call(sdpa_repeating(impl.name), inputs, spec)
        if second.error is None:
            return second
    return first


def warm(impl: Impl, inputs: tuple[torch.Tensor, ...], spec: Spec, calls: int
         ) -> tuple[str | None, float]:
    """``calls`` untimed calls of ``impl``, not captured. Returns the error of a call that raised
    (the rest are then skipped) and the seconds the last call took, synchronised (for the plan:
    the call that fixes the figures is attnscope's, never this clock)."""
    seconds = math.nan
    try:
        with impl.context(), torch.inference_mode(), attnscope.sampling(force=False):
            for _ in range(calls):
                start = time.perf_counter()
                _call(impl.fn, inputs, spec.causal)
                _sync(spec.device)
                seconds = time.perf_counter() - start
    except Exception as exc:  # the implementation failed on a later call
        return f"{type(exc).__name__}: {_first_line(exc)}", seconds
    return None, seconds


def timed(impl: Impl, inputs: tuple[torch.Tensor, ...], spec: Spec, round_no: int,
          calls: int) -> str | None:
    """One round's block: ``calls`` calls of ``impl`` at attnscope's timing tier, their spans
    marked with the round. Returns the error of a call that raised, else None."""
    fn = attnscope.trace(name=SPAN_PREFIX + impl.name,
                         attributes={"compare.phase": "timed", "compare.round": round_no})(impl.fn)
    return _captured(impl, fn, inputs, spec, calls, profile=False)


def profiled(impl: Impl, inputs: tuple[torch.Tensor, ...], spec: Spec, calls: int) -> str | None:
    """``calls`` calls of ``impl`` at attnscope's profile tier. Returns the error of one that
    raised, else None."""
    fn = attnscope.trace(name=SPAN_PREFIX + impl.name,
                         attributes={"compare.phase": "profiled"})(impl.fn)
    return _captured(impl, fn, inputs, spec, calls, profile=True)


def _captured(impl: Impl, fn: Callable[..., Any], inputs: tuple[torch.Tensor, ...], spec: Spec,
              calls: int, profile: bool) -> str | None:
    try:
        with impl.context(), torch.inference_mode():
            for _ in range(calls):
                with attnscope.sampling(force=True, profile=profile):
                    _call(fn, inputs, spec.causal)
            _sync(spec.device)
    except Exception as exc:  # the implementation failed on a later call
        return f"{type(exc).__name__}: {_first_line(exc)}"
    finally:
        attnscope.flush(timeout_s=30.0)  # build these spans before the next block is timed
    return None


def _check_output(out: Any, spec: Spec) -> str | None:
    if not isinstance(out, torch.Tensor):
        return f"returned {type(out).__name__}, not a tensor"
    if tuple(out.shape) != spec.shape:
        return f"returned shape {tuple(out.shape)}, expected {spec.shape}"
    return None


def _first_line(value: object) -> str:
    lines = str(value).strip().splitlines()
    return lines[0][:300] if lines else type(value).__name__
