"""``attnscope compare --from PATH``: the shapes a trace's attention calls had, ranked by the
time they took, each one a comparison's ``--shape``, ``--kv-len``, ``--kv-heads``, ``--causal``
and dtype.

A shape is what compare can rebuild: batch, query and key/value heads, query and key lengths,
head dim, dtype, causality. What the calls' masks hid (padding, a window) is not rebuilt: the
inputs are dense, and the line before each table says so when such calls were in it. Time is
each call's wall time weighted by 1/its sample rate (profiled calls left out while others
remain: the profiler slows them), so the ranking estimates where the program's attention time
went.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from ... import _schema as schema
from ..summary import int_attribute, latency_rows, profiles_within, wall_ns, weight
from ..traces import SpanRow, attention_calls, load_runs

__all__ = ["TraceShape", "trace_shapes"]

_DTYPES = ("float32", "bfloat16", "float16")


@dataclasses.dataclass(frozen=True)
class TraceShape:
    """One shape of a trace's attention calls, and what of the trace's time it took."""

    batch: int
    heads: int
    kv_heads: int
    seq_q: int
    seq_kv: int  # decode steps: the median of their key lengths (see ``kv_range``)
    head_dim: int
    dtype: str
    causal: bool
    calls: int  # sampled calls of this shape
    time_ns: float  # their estimated wall time (see the module's note)
    share: float  # of all the trace's attention time
    masked: bool  # some of them had a mask or window that the dense inputs do not rebuild
    kv_range: tuple[int, int]  # the least and most keys of the calls

    def describe(self) -> str:
        kv = f", {self.kv_heads} KV heads" if self.kv_heads != self.heads else ""
        keys = f" keys={self.seq_kv}" if self.seq_kv != self.seq_q else ""
        lo, hi = self.kv_range
        spread = f" (the median of its calls' {lo}–{hi} keys)" if lo != hi else ""
        return (f"B={self.batch} H={self.heads}{kv} S={self.seq_q}{keys}{spread} "
                f"D={self.head_dim} {self.dtype}{' causal' if self.causal else ''}")


# batch, heads, kv heads, queries, keys (decode steps: their power-of-two bucket), head dim,
# dtype, causal
_Key = tuple[int, int, int, int, int, int, str, bool]


def trace_shapes(path: str) -> tuple[list[TraceShape], int]:
    """The shapes of the attention calls in the trace at ``path`` (a file, an ``attnscope run``
    directory or a ``--repeat`` one: all its runs), the most time first, and how many calls had
    no shape compare can rebuild (a length, head count or dtype missing, another dtype). Decode
    steps (one query) are grouped by their key length's power of two, as a cache grows by one
    key a step: each group is compared at its calls' median key length."""
    rows = [r for _, run in load_runs(path) for r in run]  # a --repeat directory: every run's
    calls = attention_calls(rows)
    within, _ = profiles_within(rows, calls)
    groups: dict[_Key, list[SpanRow]] = defaultdict(list)
    unusable = 0
    for row in calls:
        key = _key(row)
        if key is None:
            unusable += 1
        else:
            groups[key].append(row)
    times = {key: _time(group, within) for key, group in groups.items()}
    total = sum(times.values())
    shapes = []
    for key, group in groups.items():
        keys = sorted(int(int_attribute(r, schema.SEQ_LEN_KV.name) or 0) for r in group)
        b, h, kv, sq, _, d, dtype, causal = key
        shapes.append(TraceShape(
            b, h, kv, sq, keys[(len(keys) - 1) // 2], d, dtype, causal, calls=len(group),
            time_ns=times[key], share=times[key] / total if total > 0 else 0.0,
            masked=any(_masked(r) for r in group), kv_range=(keys[0], keys[-1])))
    shapes.sort(key=lambda s: (-s.time_ns, -s.calls))
    return shapes, unusable


def _key(row: SpanRow) -> _Key | None:
    a = row.attributes
    sizes = [int_attribute(row, attr.name) for attr in (
        schema.BATCH_SIZE, schema.NUM_HEADS, schema.NUM_KV_HEADS, schema.SEQ_LEN_Q,
        schema.SEQ_LEN_KV, schema.HEAD_DIM)]
    dtype = a.get(schema.DTYPE.name)
    if any(s is None or s <= 0 for s in sizes) or dtype not in _DTYPES:
        return None
    b, h, kv, sq, skv, d = (int(s) for s in sizes if s is not None)
    if h % kv:
        return None
    if sq == 1:
        skv = skv.bit_length()
    return b, h, kv, sq, skv, d, str(dtype), a.get(schema.CAUSAL.name) is True and sq > 1


def _time(rows: Sequence[SpanRow], within: Mapping[Any, Any]) -> float:
    timed = latency_rows(rows, within)  # those the profiler did not slow, while any remain
    # the calls left out stand for as many again: the kept ones' mean, over every call
    kept = sum(wall_ns(r) * weight(r) for r in timed)
    return kept * sum(weight(r) for r in rows) / max(sum(weight(r) for r in timed), 1e-12)


def _masked(row: SpanRow) -> bool:
    """The call's mask (padding, a window, requests packed apart) hid pairs that dense inputs
    of its shape do not: its tokens or FLOPs are below the dense ones'."""
    sizes = [int_attribute(row, attr.name) for attr in (
        schema.BATCH_SIZE, schema.NUM_HEADS, schema.SEQ_LEN_Q, schema.SEQ_LEN_KV,
        schema.HEAD_DIM)]
    if any(s is None for s in sizes) or schema.SLIDING_WINDOW.name in row.attributes:
        return True
    b, h, sq, skv, d = (int(s) for s in sizes if s is not None)
    tokens = int_attribute(row, schema.TOKENS.name)
    flops = int_attribute(row, schema.FLOPS.name)
    causal = row.attributes.get(schema.CAUSAL.name) is True and sq > 1
    pairs = sq * skv - (sq * (sq - 1) // 2 if causal and skv >= sq else 0)
    return ((tokens is not None and tokens < b * sq)
            or (flops is not None and flops < 4 * b * h * pairs * d))
