"""A call's phase and shape bucket, read from what its capture recorded (``Capture.summary``).

Both sides use these: the worker keys its latency estimates by phase (prefill and decode differ
by orders of magnitude) and arms a slow-call grant with the slow call's shape bucket; the calling
thread compares a call's bucket with the grant's, only for a call of an armed site. Pure functions
of plain values: nothing is read from a device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .capture import ATTENTION_KEY, MODEL_KEY, AttentionFacts, ModelFacts, TensorMeta

__all__ = ["phase", "bucket"]

# At most this many tensors (and dimensions each) make a bucket: bounded work, bounded keys.
_MAX_TENSORS = 6
_MAX_DIMS = 6


def phase(summary: Sequence[tuple[str, Any]]) -> str:
    """``"decode"`` (one new token on top of a cache), ``"prefill"``, or ``""`` (a call that
    recorded no attention or model facts: a plain traced function)."""
    for key, value in summary:
        if key in (ATTENTION_KEY, MODEL_KEY) and isinstance(value, (AttentionFacts, ModelFacts)):
            cached = value.cached or value.past is not None
            return "decode" if value.seq_q == 1 and cached else "prefill"
    return ""


def _size(value: Any) -> int:
    """An int's power-of-two bucket (its bit length); anything else (a device copy) is 0."""
    return value.bit_length() if isinstance(value, int) and not isinstance(value, bool) else 0


def bucket(summary: Sequence[tuple[str, Any]]) -> tuple[int, ...]:
    """The call's shapes, each size rounded up to a power of two: a decode step at cache length
    300 and one at 400 share a bucket, one at 600 does not; a prefill never shares one with a
    decode step. Facts (an instrumented layer: batch, query, keys, heads) when recorded, else
    the tensor arguments' shapes."""
    for key, value in summary:
        if key == ATTENTION_KEY and isinstance(value, AttentionFacts):
            keys = value.seq_kv if value.seq_kv is not None else value.past
            return (1, _size(value.batch), _size(value.seq_q), _size(keys), _size(value.heads))
        if key == MODEL_KEY and isinstance(value, ModelFacts):
            return (2, _size(value.batch), _size(value.seq_q), _size(value.past))
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
