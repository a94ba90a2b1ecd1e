"""Operator spans as they ran: the op tree of one profiled call, folded and capped (worker side).

The profiler records CPU ops with start and end on the calling thread; an op's children are the
ops that started and ended inside it (time containment on the same thread). From that tree:

- **folding**: metadata-only ops (views, transposes, ``empty``...) and ops shorter than a small
  threshold are not spans: their time stays in the nearest kept ancestor's own time, and that
  ancestor counts them (``attnscope.kernel.folded``); ops below a folded op move up to it;
- **the cap**: at most ``max_spans`` child spans. The longest ops are kept (device activities
  first); a kept op's parent is always kept too (an op lasts at least as long as its children);
  the rest become one ``other`` span;
- **nesting**: every child span names its parent (an index into the same list, ``-1`` for the
  call's own span). On a GPU call a kernel hangs under the op that launched it (or that op's
  nearest kept ancestor), on the device's timeline.

:func:`hand_down` moves op spans into a nested attnscope span that ran them (``span()`` blocks,
outer traced calls profiled around inner ones).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

from ... import _schema as schema
from ...record.capture import MAX_NAME

__all__ = ["ChildSpan", "METADATA_OPS", "FOLD_MIN_NS", "FOLD_SHARE", "fold_threshold", "parents",
           "build", "hand_down", "Op"]

# a child span's attribute names, read and written per op
_KIND, _DEVICE, _SELF_NS = (schema.KERNEL_KIND.name, schema.KERNEL_DEVICE.name,
                            schema.KERNEL_SELF_NS.name)
_INPUT_SHAPES, _FOLDED, _INNER = (schema.KERNEL_INPUT_SHAPES.name, schema.KERNEL_FOLDED.name,
                                  schema.KERNEL_INNER.name)
_COUNT, _TOTAL_NS = schema.KERNEL_COUNT.name, schema.KERNEL_TOTAL_NS.name

# Ops that only make a new view or an uninitialised tensor: no work of their own worth a span.
METADATA_OPS = frozenset((
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::transpose",
    "aten::t", "aten::permute", "aten::as_strided", "aten::expand", "aten::expand_as",
    "aten::detach", "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::unsqueeze",
    "aten::squeeze", "aten::slice", "aten::select", "aten::narrow", "aten::split",
    "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::flatten", "aten::unflatten",
    "aten::view_as", "aten::resolve_conj", "aten::resolve_neg", "aten::empty", "aten::empty_like",
    "aten::empty_strided", "aten::to", "aten::contiguous", "aten::result_type",
    "aten::broadcast_tensors", "aten::_has_compatible_shallow_copy_type",
))
# An op (with all it called) shorter than both of these is folded into its parent.
FOLD_MIN_NS = 5_000
FOLD_SHARE = 0.005  # of the profiled call's time


class ChildSpan(NamedTuple):
    """One kernel/op child span on the call span's clock."""

    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    parent: int = -1  # index of the parent child span in the same list; -1: the call's span


def fold_threshold(window_ns: int) -> int:
    """Ops with all they called shorter than this are folded (``window_ns``: the call's time)."""
    return max(FOLD_MIN_NS, int(window_ns * FOLD_SHARE))


def parents(starts: Sequence[int], ends: Sequence[int], threads: Sequence[int]) -> list[int]:
    """Parent index of each op (ops sorted by start, then longest first); -1 for a top-level op.

    A parent is the innermost earlier op on the same thread that had not ended when this one began.
    """
    out = [-1] * len(starts)
    stacks: dict[int, list[int]] = {}
    for i, start in enumerate(starts):
        stack = stacks.setdefault(threads[i], [])
        while stack and ends[stack[-1]] <= start:
            stack.pop()
        if stack:
            out[i] = stack[-1]
        stack.append(i)
    return out


class Op(NamedTuple):
    """One CPU op of the call, on the call span's clock."""

    name: str
    start: int  # call-span clock, clamped into the call and into its parent
    end: int
    kind: str
    device: str
    shapes: str
    parent: int  # op index, -1 top level
    weight: int  # what decides folding and ranking: its time with all it called (or launched)


def build(ops: Sequence[Op], device: Sequence[tuple[Any, int, int, int]], *, fold_ns: int,
          max_spans: int) -> tuple[list[ChildSpan], int]:
    """Child spans of one call and the number of top-level ops folded into the call's span.

    ``ops``: in tree order (parents before children). ``device``: (event, start, end, op index or
    -1) for GPU activities, already on the call's clock.
    """
    keep = [op.weight >= fold_ns and op.name not in METADATA_OPS for op in ops]
    inner = _merge_wrappers(ops, keep, fold_ns)
    dropped_ops, dropped_dev = _cap(ops, device, keep, max_spans)
    up = _kept_ancestors(ops, keep)
    merged = [j for names in inner.values() for j in names]
    folded, top_folded = _folded(up, keep, [*dropped_ops, *merged])
    # ops merged into an op the cap left out are left out with it
    dropped_ops += [j for i in dropped_ops for j in inner.get(i, ())]
    own = [op.end - op.start for op in ops]
    for i in range(len(ops)):
        if keep[i] and up[i] >= 0:
            own[up[i]] -= ops[i].end - ops[i].start
    spans: list[ChildSpan] = []
    index: dict[int, int] = {}
    for i, op in enumerate(ops):
        if not keep[i]:
            continue
        attrs: dict[str, Any] = {_KIND: op.kind, _DEVICE: op.device,
                                 _SELF_NS: max(0, own[i])}
        if op.shapes:
            attrs[_INPUT_SHAPES] = op.shapes
        if folded[i]:
            attrs[_FOLDED] = folded[i]
        if i in inner:
            attrs[_INNER] = [ops[j].name for j in inner[i]]
        index[i] = len(spans)
        spans.append(ChildSpan(op.name or "?", op.start, op.end, attrs, index.get(up[i], -1)))
    skip = set(dropped_dev)
    for j, (ev, start, end, at) in enumerate(device):
        if j in skip:
            continue
        while at >= 0 and not keep[at]:
            at = ops[at].parent
        spans.append(ChildSpan(ev.name[:MAX_NAME] or "?", start, end, {
            _KIND: ev.kind, _DEVICE: ev.device}, index.get(at, -1)))
    if dropped_ops or dropped_dev:
        spans.append(_other(ops, keep, device, dropped_ops, dropped_dev))
    return _by_start(spans), top_folded


def _by_start(spans: list[ChildSpan]) -> list[ChildSpan]:
    """In start order, parents still before their children (else as built: parents first)."""
    order = sorted(range(len(spans)), key=lambda k: (spans[k].start_ns, -spans[k].end_ns, k))
    where = {old: new for new, old in enumerate(order)}
    if any(spans[k].parent >= 0 and where[spans[k].parent] > new for new, k in enumerate(order)):
        return spans
    return [spans[k]._replace(parent=where.get(spans[k].parent, -1)) for k in order]


def _merge_wrappers(ops: Sequence[Op], keep: list[bool], fold_ns: int) -> dict[int, list[int]]:
    """An op that only wraps one other op (``aten::linear`` > ``aten::matmul`` > ``aten::mm``)
    is one span: the inner op is unmarked in ``keep`` and listed under the outer one. Merged while
    the outer op's own time, apart from what it wraps, stays under ``fold_ns``."""
    kids: dict[int, list[int]] = {}
    for i, above in enumerate(_kept_ancestors(ops, keep)):
        if keep[i]:
            kids.setdefault(above, []).append(i)
    inner: dict[int, list[int]] = {}
    for i, op in enumerate(ops):
        if not keep[i]:
            continue
        below = kids.get(i, [])
        while (len(below) == 1
               and (op.end - op.start) - (ops[below[0]].end - ops[below[0]].start) < fold_ns):
            wrapped = below[0]
            keep[wrapped] = False
            inner.setdefault(i, []).append(wrapped)
            below = kids.get(wrapped, [])
        kids[i] = below
    return inner


def _folded(up: Sequence[int], keep: Sequence[bool],
            dropped: Sequence[int]) -> tuple[list[int], int]:
    """How many folded ops each kept op took in, and how many the call's span did (ops the cap
    left out are counted by the ``other`` span instead)."""
    folded = [0] * len(up)
    top_folded = 0
    out = set(dropped)
    for i, above in enumerate(up):
        if keep[i] or i in out:
            continue
        if above < 0:
            top_folded += 1
        else:
            folded[above] += 1
    return folded, top_folded


def _cap(ops: Sequence[Op], device: Sequence[tuple[Any, int, int, int]], keep: list[bool],
         max_spans: int) -> tuple[list[int], list[int]]:
    """At most ``max_spans`` spans: device work first, then the heaviest ops (ties keep tree
    order: parents first). Returns the ops (unmarked in ``keep``) and device activities left out."""
    ranked = [(0, -(end - start), j) for j, (_, start, end, _) in enumerate(device)]
    ranked += [(1, -op.weight, i) for i, op in enumerate(ops) if keep[i]]
    dropped_ops: list[int] = []
    dropped_dev: list[int] = []
    if len(ranked) <= max_spans:
        return dropped_ops, dropped_dev
    ranked.sort()
    for group, _, idx in ranked[max(0, max_spans - 1):]:
        if group == 0:
            dropped_dev.append(idx)
        else:
            dropped_ops.append(idx)
            keep[idx] = False
    return dropped_ops, dropped_dev


def _kept_ancestors(ops: Sequence[Op], keep: Sequence[bool]) -> list[int]:
    up = [-1] * len(ops)
    for i, op in enumerate(ops):
        p = op.parent
        up[i] = -1 if p < 0 else (p if keep[p] else up[p])
    return up


def _other(ops: Sequence[Op], keep: Sequence[bool], device: Sequence[tuple[Any, int, int, int]],
           dropped_ops: Sequence[int], dropped_dev: Sequence[int]) -> ChildSpan:
    """One span for what the cap left out: how many, and their time (ops left out inside a kept op
    are in that op's own time too). It lasts the time of the top-level ops and the device
    activities left out, from the earliest of them."""
    dropped = set(dropped_ops)
    top = [i for i in dropped_ops if _top_dropped(ops, i, dropped, keep)]
    outer = [i for i in dropped_ops if ops[i].parent not in dropped]
    total = sum(ops[i].end - ops[i].start for i in outer)
    total += sum(device[j][2] - device[j][1] for j in dropped_dev)
    length = sum(ops[i].end - ops[i].start for i in top)
    length += sum(device[j][2] - device[j][1] for j in dropped_dev)
    starts = [ops[i].start for i in top] + [device[j][1] for j in dropped_dev]
    nested = [ops[i].start for i in dropped_ops]
    first = min(starts) if starts else min(nested)
    dev = device[dropped_dev[0]][0].device if dropped_dev else ops[dropped_ops[0]].device
    return ChildSpan("other", first, first + length, {
        _KIND: "other", _DEVICE: dev,
        _COUNT: len(dropped_ops) + len(dropped_dev),
        _TOTAL_NS: total})


def _top_dropped(ops: Sequence[Op], i: int, dropped: set[int], keep: Sequence[bool]) -> bool:
    """Neither a kept op nor another left-out op above it: its time is in no other span."""
    p = ops[i].parent
    while p >= 0:
        if p in dropped or keep[p]:
            return False
        p = ops[p].parent
    return True


def hand_down(children: list[ChildSpan], nested: Sequence[Any]) -> list[ChildSpan]:
    """Move op spans that ran inside a nested attnscope call into that call's children.

    ``nested``: results of the calls nested directly in this one (with ``start_ns``, ``end_ns``,
    ``children``), not yet built. An op goes down when its middle lies inside the nested call,
    with all spans below it; a GPU activity goes with the op that launched it. Returns what stays.
    """
    if not nested or not children:
        return children
    target = [-1] * len(children)
    for k, child in enumerate(children):
        p = child.parent
        if p >= 0 and target[p] >= 0:
            target[k] = target[p]  # below a span that moved: goes with it
        elif child.attributes.get(_KIND) == "cpu_op":
            mid = (child.start_ns + child.end_ns) // 2
            for r, res in enumerate(nested):
                if res.start_ns <= mid <= res.end_ns:
                    target[k] = r
                    break
    if all(t < 0 for t in target):
        return children
    new_index: dict[int, int] = {}
    stay: list[ChildSpan] = []
    for k, child in enumerate(children):
        r = target[k]
        if r < 0:
            new_index[k] = len(stay)
            stay.append(child._replace(parent=new_index.get(child.parent, -1)))
            continue
        dest = nested[r].children
        parent = new_index[child.parent] if child.parent >= 0 and target[child.parent] == r else -1
        if child.attributes.get(_KIND) == "cpu_op":
            # into the nested span (its clock and the profiler's differ by microseconds)
            lo, hi = ((dest[parent].start_ns, dest[parent].end_ns) if parent >= 0
                      else (nested[r].start_ns, nested[r].end_ns))
            start = min(max(child.start_ns, lo), hi)
            child = child._replace(start_ns=start, end_ns=min(max(child.end_ns, start), hi))
        new_index[k] = len(dest)
        dest.append(child._replace(parent=parent))
    for r in set(target) - {-1}:
        _own_times(nested[r].children)
    return stay


def _own_times(spans: list[ChildSpan]) -> None:
    """``self_ns`` of each op span again: its time minus its children's (after clamping)."""
    own = [c.end_ns - c.start_ns for c in spans]
    for c in spans:
        if c.parent >= 0 and c.attributes.get(_KIND) == "cpu_op":
            own[c.parent] -= c.end_ns - c.start_ns  # GPU activities run beside, not inside
    for k, c in enumerate(spans):
        if _SELF_NS in c.attributes:
            c.attributes[_SELF_NS] = max(0, own[k])
