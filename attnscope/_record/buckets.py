"""A call's phase and shape bucket, read from what its capture recorded (its facts, else its
argument summary).

Both sides use these: the worker keys its latency estimates by phase (prefill and decode differ
by orders of magnitude) and arms a slow-call grant with the slow call's shape bucket; the calling
thread compares a call's bucket with the grant's, only for a call of an armed site. Pure functions
of plain values: nothing is read from a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .capture import TensorMeta
from .facts import NO_FACTS, Facts

__all__ = ["phase", "bucket"]

# At most this many tensors (and dimensions each) make a bucket: bounded work, bounded keys.
_MAX_TENSORS = 6
_MAX_DIMS = 6


def phase(summary: Sequence[tuple[str, Any]], facts: Facts = NO_FACTS) -> str:
    """``"decode"`` (one new token on top of a cache), ``"prefill"``, or ``""`` (a call that
    recorded no attention or model facts: a plain traced function, whose ``summary`` says no
    phase)."""
    value = facts.attention or facts.model
    if value is None:
        return ""
    cached = value.cached or value.past is not None
    rows_q = value.seq_q if value.packed_q is None else value.packed_q
    return "decode" if rows_q == 1 and cached else "prefill"


def _size(value: Any) -> int:
    """An int's power-of-two bucket (its bit length); anything else (a device copy) is 0."""
    return value.bit_length() if isinstance(value, int) and not isinstance(value, bool) else 0


def bucket(summary: Sequence[tuple[str, Any]], facts: Facts = NO_FACTS) -> tuple[int, ...]:
    """The call's shapes, each size rounded up to a power of two: a decode step at cache length
    300 and one at 400 share a bucket, one at 600 does not; a prefill never shares one with a
    decode step. Facts (an instrumented layer: batch, query, keys, heads) when recorded, else
    the tensor arguments' shapes."""
    layer, model = facts.attention, facts.model
    if layer is not None:
        keys = layer.seq_kv if layer.seq_kv is not None else layer.past
        return (1, _size(layer.batch), _size(layer.seq_q), _size(keys), _size(layer.heads))
    if model is not None:
        return (2, _size(model.batch), _size(model.seq_q), _size(model.past))
    out: list[int] = []
    tensors = 0
    for _, value in summary:
        if isinstance(value, TensorMeta):
            out.append(len(value.shape))
            out.extend(_size(d) for d in value.shape[:_MAX_DIMS])
            tensors += 1
            if tensors == _MAX_TENSORS:
                break
    return tuple(out)
