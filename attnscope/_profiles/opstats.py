"""What a profiled call's ops did: attention core versus projections, host syncs, copies.

Works on the op tree :mod:`attnscope._profiles.kernels` builds (each op with its name, times
on the call's clock, input shapes and parent index; parents before children).

**Core and projections** are decided on the top-level ops of the call (ops no other op of the
call contains), in the order they ran:

- an attention op (SDPA and its backends, the flash-attn package, FlexAttention) is core;
- ``aten::linear`` / ``aten::addmm``, and a matrix product whose second input is a 2-D weight, is
  a projection;
- eager attention: around each softmax, the ops from the matrix product before it (QKᵀ) to the
  matrix product after it (PV) are core, with the scaling, masking, casts and dropout between.

Everything else (rotary embeddings, cache updates, ``repeat_kv`` copies, ...) is neither.
"""

from __future__ import annotations

import ast
from collections.abc import Sequence
from typing import Any

__all__ = ["SYNC_OPS", "SYNC_RUNTIME", "COPY_OPS", "roles", "host_syncs", "copy_ns"]

_ATTENTION_PREFIXES = (
    "aten::scaled_dot_product_attention", "aten::_scaled_dot_product", "aten::_flash_attention",
    "aten::_efficient_attention", "aten::_cudnn_attention", "flash_attn::", "flash_attn_3::",
    "FlexAttention",
)
_FLEX = ("flex_attention", "flex_decoding")
_PROJECTION_OPS = frozenset(("aten::linear", "aten::addmm", "aten::_addmm_activation"))
_MATMUL_OPS = frozenset(("aten::matmul", "aten::bmm", "aten::baddbmm", "aten::einsum", "aten::mm"))
_SOFTMAX_OPS = frozenset(("aten::softmax", "aten::_softmax", "aten::_safe_softmax"))
# Ops that make the host wait for a result (a value read back, an output size known only then).
# Nested ones (aten::item -> aten::_local_scalar_dense) count once, as the outer one.
SYNC_OPS = frozenset((
    "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero",
    "aten::masked_select", "aten::equal", "aten::_unique2", "aten::unique_consecutive",
    "aten::unique_dim",
))
# CUDA runtime calls that block the host until the device has caught up.
SYNC_RUNTIME = frozenset(("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize",
                          "cudaMemcpy"))
# Host-side copies and fills (a CPU call's memcpy/memset time).
COPY_OPS = frozenset(("aten::copy_", "aten::fill_", "aten::zero_"))

CORE = "core"
PROJECTION = "projection"


def _is_attention(name: str) -> bool:
    if name.startswith(_ATTENTION_PREFIXES):
        return True
    lowered = name.lower()
    return any(n in lowered for n in _FLEX)


def _weight_product(shapes: str) -> bool:
    """A matrix product whose second input is 2-D (a weight): a projection."""
    if not shapes:
        return False
    try:
        found = ast.literal_eval(shapes)
    except (ValueError, SyntaxError):  # cut at 256 characters
        return False
    return isinstance(found, list) and len(found) >= 2 and isinstance(found[1], list) \
        and len(found[1]) == 2


def roles(ops: Sequence[Any]) -> list[str]:
    """``core``, ``projection`` or ``""`` for each op: its top-level op's role."""
    top = [i for i, op in enumerate(ops) if op.parent < 0]
    label = {i: "" for i in top}
    for i in top:
        name = ops[i].name
        if _is_attention(name):
            label[i] = CORE
        elif name in _PROJECTION_OPS or (name in _MATMUL_OPS and _weight_product(ops[i].shapes)):
            label[i] = PROJECTION
    for pos, i in enumerate(top):
        if ops[i].name in _SOFTMAX_OPS and not label[i]:
            lo = _matmul_near(ops, top, label, pos, -1)
            hi = _matmul_near(ops, top, label, pos, 1)
            for j in top[lo:hi + 1]:
                label[j] = CORE
    out = [""] * len(ops)
    for i, op in enumerate(ops):
        out[i] = label[i] if op.parent < 0 else out[op.parent]
    return out


def _matmul_near(ops: Sequence[Any], top: Sequence[int], label: dict[int, str], pos: int,
                 step: int) -> int:
    """Position of the matrix product next to a softmax (QKᵀ before, PV after), or ``pos``."""
    k = pos + step
    while 0 <= k < len(top):
        i = top[k]
        if label[i] or ops[i].name in _SOFTMAX_OPS:
            break  # a projection, an attention op or another softmax: no product of this one
        if ops[i].name in _MATMUL_OPS:
            return k
        k += step
    return pos


def host_syncs(ops: Sequence[Any], runtime: Sequence[tuple[str, int, int]]) -> list[str]:
    """The ops and runtime calls of the call that made the host wait, one entry per sync.

    ``runtime``: (name, start, end) of CUDA runtime sync calls inside the call's window; one made
    inside a sync op (``.item()`` on CUDA: a copy, then a stream sync) is that op's.
    """
    found: list[str] = []
    spans: list[tuple[int, int]] = []
    inside = [False] * len(ops)
    for i, op in enumerate(ops):
        above = op.parent >= 0 and (inside[op.parent] or ops[op.parent].name in SYNC_OPS)
        inside[i] = above
        if op.name in SYNC_OPS and not above:
            found.append(op.name)
            spans.append((op.start, op.end))
    for name, start, end in runtime:
        if name in SYNC_RUNTIME and not any(s <= start and end <= e for s, e in spans):
            found.append(name)
    return found


def copy_ns(ops: Sequence[Any]) -> int:
    """Time of the outermost host copy/fill ops (a copy inside a copy counts once)."""
    total = 0
    inside = [False] * len(ops)
    for i, op in enumerate(ops):
        above = op.parent >= 0 and (inside[op.parent] or ops[op.parent].name in COPY_OPS)
        inside[i] = above
        if op.name in COPY_OPS and not above:
            total += op.end - op.start
    return total
