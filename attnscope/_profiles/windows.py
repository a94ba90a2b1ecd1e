"""The kernels of the calls timed inside a profiled call, from its events (worker side).

A call timed while attnscope profiled a call around it (``attnscope.profiled_by`` ``enclosing``:
the attention layer inside a profiled decoder layer or model forward) ran under that profile:
its ops and kernels are among the outer call's events. Here they get the figures a profiled
call's own span has — ``kernel.count``, ``kernel.total_ns``, ``kernel.top_names`` /
``kernel.top_ns`` / ``kernel.top`` — by the rule :func:`attnscope._profiles.optree.hand_down`
uses for op spans: an op is the nested call's when it starts inside the call's time (a GPU
activity goes with the op that launched it), and a kernel is counted as :func:`.kernels.analyze`
counts it for a call (on CPU the ops by their own time, on a GPU the device activities).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .. import _schema as schema
from .._units import top_list
from .kernels import DEVICE_KINDS, RawEvent, call_bounds, cpu_tree, top_kernels

__all__ = ["nested_kernels"]


def nested_kernels(events: Sequence[RawEvent], windows: Sequence[tuple[int, int]], *,
                   span_start_ns: int, span_end_ns: int,
                   on_device: bool) -> list[dict[str, Any]]:
    """Per window (a nested call's start and end on the span's clock), its kernel attributes
    (schema keys, no prefix); an empty dict for a window nothing ran in."""
    if not windows:
        return []
    _, _, offset = call_bounds(events, span_start_ns, span_end_ns)
    cpu_ops, _, own = cpu_tree(events)
    device_ops = [e for e in events if e.kind in DEVICE_KINDS] if on_device else []
    out: list[dict[str, Any]] = []
    for start, end in windows:
        lo, hi = start - offset, end - offset  # on the profiler's clock
        inside = [i for i, op in enumerate(cpu_ops) if lo <= op.start_ns <= hi]
        if on_device:
            launched = {cpu_ops[i].op_id for i in inside if cpu_ops[i].op_id}
            work = [(e.end_ns - e.start_ns, e.name) for e in device_ops
                    if e.op_id and e.op_id in launched]
        else:
            work = [(own[i], cpu_ops[i].name) for i in inside]
        if not work:
            out.append({})
            continue
        attrs = {schema.KERNEL_COUNT.key: len(work),
                 schema.KERNEL_TOTAL_NS.key: sum(ns for ns, _ in work), **top_kernels(work)}
        attrs[schema.KERNEL_TOP.key] = top_list(attrs[schema.KERNEL_TOP_NAMES.key],
                                                attrs[schema.KERNEL_TOP_NS.key])
        out.append(attrs)
    return out
