"""Operator spans as they ran: the op tree of one profiled call, folded and capped (worker side).

The profiler records CPU ops with start and end on the calling thread; an op's children are the
ops that started and ended inside it (time containment on the same thread). From that tree, by a
fixed rule per operator — its name and its place in the tree, never its measured duration, so two
traces of the same code have spans of the same shape:

- **folding**: metadata-only ops (:data:`METADATA_OPS`: views, transposes, ``empty``...) are never
  spans: their time stays in the nearest kept ancestor's own time, and that ancestor counts them
  (``attnscope.kernel.folded``); ops below a folded op move up to it;
- **merging**: the ops a dispatcher operator (a name with a namespace, ``aten::linear``) runs
  are its implementation (``aten::matmul`` › ``aten::mm``, ``aten::_softmax``, a ``copy_``): they
  are one span with it, listed in ``attnscope.kernel.inner`` (in the order they ran, one entry
  per op). Ops under a region without a namespace (a custom ``record_function`` range, an
  autograd Function) stay child spans of it;
- **the cap**: at most ``max_spans`` child spans per attnscope span. Only a span with more ops
  than that loses some, chosen by their place in the tree (device activities, then the outermost
  ops, in the order they started), so a kept op's parent is always kept too; the rest become one
  ``other`` span, which names the longest of them (``attnscope.kernel.top``). It is applied
  per attnscope span (after :func:`hand_down`), so a layer with fewer ops than the cap keeps
  them all;
- **nesting**: every child span names its parent (an index into the same list, ``-1`` for the
  call's own span). On a GPU call a kernel hangs under the op that launched it (or that op's
  nearest kept ancestor), on the device's timeline.

:func:`hand_down` moves op spans into a nested attnscope span that ran them (``span()`` blocks,
outer traced calls profiled around inner ones, ``trace_model=True``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

from .. import _schema as schema
from .._record.capture import MAX_NAME
from .._units import top_list

__all__ = ["ChildSpan", "Children", "METADATA_OPS", "MAX_INNER", "SPAN_BOUND", "absorbs",
           "parents", "build", "cap", "hand_down", "Op"]

# a child span's attribute names, read and written per op
_KIND, _DEVICE, _SELF_NS = (schema.KERNEL_KIND.name, schema.KERNEL_DEVICE.name,
                            schema.KERNEL_SELF_NS.name)
_INPUT_SHAPES, _FOLDED, _INNER = (schema.KERNEL_INPUT_SHAPES.name, schema.KERNEL_FOLDED.name,
                                  schema.KERNEL_INNER.name)
_COUNT, _TOTAL_NS = schema.KERNEL_COUNT.name, schema.KERNEL_TOTAL_NS.name
_MODULE = schema.MODULE.name
_CPU_OP, _OTHER = "cpu_op", "other"
_TOP = schema.KERNEL_TOP.name
# names ``other`` lists in ``attnscope.kernel.top``
OTHER_TOP = 5

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
    # the same, recorded without a namespace (autograd's in-place detach of a cache's tensors)
    "detach", "detach_",
))
# Entries of ``attnscope.kernel.inner`` per span; further merged ops are counted in ``folded``.
MAX_INNER = 32
# Spans a profiled call keeps before :func:`hand_down` shares them out among its nested spans
# (each of which is then capped to ``max_spans``): the memory bound of one profile's spans.
SPAN_BOUND = 4096


class ChildSpan(NamedTuple):
    """One kernel/op child span on the call span's clock."""

    name: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    parent: int = -1  # index of the parent child span in the same list; -1: the call's span


class Children(list[ChildSpan]):
    """A call's child spans, capped to ``limit``; ``uncapped`` holds them before the cap (at most
    :data:`SPAN_BOUND`), for :func:`hand_down` to share out before capping each span's own."""

    limit: int
    uncapped: list[ChildSpan]

    @classmethod
    def of(cls, spans: list[ChildSpan], limit: int) -> Children:
        out = cls(cap(spans, limit))
        out.limit = limit
        out.uncapped = spans
        return out


def absorbs(name: str) -> bool:
    """A dispatcher operator (``aten::linear``, ``flash_attn::…``): the ops it runs are its own."""
    return "::" in name


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


def build(ops: Sequence[Op], device: Sequence[tuple[Any, int, int, int]], *, max_spans: int,
          labels: Mapping[int, str] | None = None) -> tuple[Children, int]:
    """Child spans of one call and the number of top-level ops folded into the call's span.

    ``ops``: in tree order (parents before children). ``device``: (event, start, end, op index or
    -1) for GPU activities, already on the call's clock. ``labels``: op index → the module that
    owns its weights (``q_proj``), added to the span's name.
    """
    n = len(ops)
    keep = [False] * n
    up = [-1] * n  # nearest kept ancestor
    folded = [0] * n
    inner: dict[int, list[str]] = {}
    top_folded = 0
    for i, op in enumerate(ops):
        p = op.parent
        above = -1 if p < 0 else (p if keep[p] else up[p])
        up[i] = above
        if op.name in METADATA_OPS:
            if above < 0:
                top_folded += 1
            else:
                folded[above] += 1
        elif above >= 0 and absorbs(ops[above].name):
            names = inner.setdefault(above, [])
            if len(names) < MAX_INNER:
                names.append(op.name)
            else:
                folded[above] += 1
        else:
            keep[i] = True
    own = [op.end - op.start for op in ops]
    for i in range(n):
        if keep[i] and up[i] >= 0:
            own[up[i]] -= ops[i].end - ops[i].start
    spans: list[ChildSpan] = []
    index: dict[int, int] = {}
    for i, op in enumerate(ops):
        if not keep[i]:
            continue
        attrs: dict[str, Any] = {_KIND: op.kind, _DEVICE: op.device, _SELF_NS: max(0, own[i])}
        if op.shapes:
            attrs[_INPUT_SHAPES] = op.shapes
        if folded[i]:
            attrs[_FOLDED] = folded[i]
        if i in inner:
            attrs[_INNER] = inner[i]
        name = op.name or "?"
        label = labels.get(i) if labels else None
        if label:
            name = labelled(name, label)
        index[i] = len(spans)
        spans.append(ChildSpan(name, op.start, op.end, attrs, index.get(up[i], -1)))
    for ev, start, end, at in device:
        while at >= 0 and not keep[at]:
            at = ops[at].parent
        spans.append(ChildSpan(ev.name[:MAX_NAME] or "?", start, end, {
            _KIND: ev.kind, _DEVICE: ev.device}, index.get(at, -1)))
    spans = _by_start(spans)
    return Children.of(cap(spans, SPAN_BOUND), max_spans), top_folded


def labelled(name: str, label: str) -> str:
    """An op span's name with the module that owns its weights: ``aten::linear (q_proj)``."""
    return f"{name} ({label})"[:MAX_NAME]


def _by_start(spans: list[ChildSpan]) -> list[ChildSpan]:
    """In start order, parents still before their children (else as built: parents first)."""
    order = sorted(range(len(spans)), key=lambda k: (spans[k].start_ns, -spans[k].end_ns, k))
    where = {old: new for new, old in enumerate(order)}
    if any(spans[k].parent >= 0 and where[spans[k].parent] > new for new, k in enumerate(order)):
        return spans
    return [spans[k]._replace(parent=where.get(spans[k].parent, -1)) for k in order]


def cap(spans: list[ChildSpan], max_spans: int) -> list[ChildSpan]:
    """At most ``max_spans`` spans (parents before children in ``spans``), chosen by their place
    in the tree, never by their time: device activities first (what a GPU call costs), then the
    outermost ops (depth 0, then 1, ...), at one depth in the order they started (ties: list
    order), so two runs of the same code keep the same spans; one ``other`` span holds the rest
    (an ``other`` span already there is merged into it) and names the longest of them. Under
    the limit: ``spans`` as they are."""
    if len(spans) <= max_spans:
        return spans
    n = len(spans)
    depth = [0] * n
    ranked: list[tuple[int, int, int, int]] = []
    for k, s in enumerate(spans):
        if s.parent >= 0:
            depth[k] = depth[s.parent] + 1
        kind = s.attributes.get(_KIND)
        if kind != _OTHER:  # always into the new one
            ranked.append((int(kind == _CPU_OP), depth[k], s.start_ns, k))
    ranked.sort()
    # an op's parent op is shallower: a kept op's parent op is kept (a kept device activity whose
    # op was left out hangs under that op's nearest kept ancestor)
    kept = {k for *_, k in ranked[:max(0, max_spans - 1)]}
    dropped = [k for k in range(n) if k not in kept]
    out: list[ChildSpan] = []
    where: dict[int, int] = {}
    for k, s in enumerate(spans):
        if k not in kept:
            continue
        p = s.parent
        while p >= 0 and p not in kept:
            p = spans[p].parent
        where[k] = len(out)
        out.append(s._replace(attributes=dict(s.attributes), parent=where.get(p, -1)))
    out.append(_other(spans, dropped, set(dropped)))
    _own_times(out)
    return _by_start(out)


def _other(spans: Sequence[ChildSpan], dropped: Sequence[int], out: set[int]) -> ChildSpan:
    """One span for what the cap left out: how many ops and activities (those folded and merged
    into them included) and their time (ops left out inside a kept op are in that op's own time
    too). It lasts the time of the top-level ops and the device activities left out, from the
    earliest of them."""
    count = total = length = 0
    starts: list[int] = []
    device = ""
    for k in dropped:
        s = spans[k]
        a = s.attributes
        d = s.end_ns - s.start_ns
        kind = a.get(_KIND)
        if kind == _OTHER:
            count += int(a.get(_COUNT, 0))
            total += int(a.get(_TOTAL_NS, 0))
        elif kind == _CPU_OP:
            count += 1 + int(a.get(_FOLDED, 0)) + len(a.get(_INNER, ()))
            if s.parent not in out:
                total += d
        else:  # a device activity: beside the ops, never inside them
            count += 1
            total += d
        if kind != _CPU_OP or s.parent < 0:
            length += d
            starts.append(s.start_ns)
        if not device:
            device = str(a.get(_DEVICE, ""))
    # a GPU activity's device when one was left out
    device = next((str(spans[k].attributes.get(_DEVICE)) for k in dropped
                   if spans[k].attributes.get(_KIND) not in (_CPU_OP, _OTHER)), device)
    first = min(starts) if starts else min(spans[k].start_ns for k in dropped)
    attrs: dict[str, Any] = {_KIND: _OTHER, _DEVICE: device or "cpu", _COUNT: count,
                             _TOTAL_NS: total}
    top = _longest(spans, dropped)
    if top:
        attrs[_TOP] = top
    return ChildSpan("other", first, first + length, attrs)


def _longest(spans: Sequence[ChildSpan], dropped: Sequence[int]) -> list[str]:
    """The :data:`OTHER_TOP` names that took longest among ``dropped`` (time summed per name, an
    op's with all it called), as ``"name: time"``: what the cap left out that mattered, by time
    only in what it lists, never in which spans stay."""
    by_name: dict[str, int] = {}
    for k in dropped:
        s = spans[k]
        if s.attributes.get(_KIND) == _OTHER:
            continue
        by_name[s.name] = by_name.get(s.name, 0) + s.end_ns - s.start_ns
    top = sorted(by_name.items(), key=lambda kv: (-kv[1], kv[0]))[:OTHER_TOP]
    return top_list([name for name, _ in top], [ns for _, ns in top])


def hand_down(children: list[ChildSpan], nested: Sequence[Any]) -> list[ChildSpan]:
    """Move op spans that ran inside a nested attnscope call into that call's children.

    ``nested``: results of the calls nested directly in this one (with ``start_ns``, ``end_ns``,
    ``children``, and ``attrs`` holding ``attnscope.module``), not yet built. An op goes down when
    it starts inside the nested call (the one that began last, where two seem to overlap), with
    all spans below it; a GPU activity goes with the op that launched it. (Its start, not its
    middle: a nested span's end is its start plus the call's duration, measured from a few µs
    later, so it can read up to ~15 µs early under the profiler, and a short last op — a decode
    step's ``o_proj`` — would stay outside.) A label
    that names a module below the nested call's module is made relative to it
    (``model.layers.0.self_attn.q_proj`` → ``q_proj``). ``children`` as :func:`build` made them
    (:class:`Children`) are shared out before the cap, and the cap is then applied to what stays
    and to each nested call's spans. Returns what stays.
    """
    limit = children.limit if isinstance(children, Children) else None
    full = children.uncapped if isinstance(children, Children) else children
    if not nested or not full:
        return children
    target = [-1] * len(full)
    for k, child in enumerate(full):
        p = child.parent
        if p >= 0 and target[p] >= 0:
            target[k] = target[p]  # below a span that moved: goes with it
        elif child.attributes.get(_KIND) == _CPU_OP:
            # Of the nested calls around its start, the one that began last: calls made one
            # after the other can seem to overlap, the earlier one's end read late (its thread
            # preempted between the call's return and the clock read), and the later one's first
            # ops are the later one's.
            start, latest = child.start_ns, None
            for r, res in enumerate(nested):
                if res.start_ns <= start <= res.end_ns and (
                        latest is None or res.start_ns > latest):
                    target[k], latest = r, res.start_ns
    if all(t < 0 for t in target):
        return children
    new_index: dict[int, int] = {}
    stay: list[ChildSpan] = []
    dests: dict[int, list[ChildSpan]] = {}
    for k, child in enumerate(full):
        r = target[k]
        if r < 0:
            new_index[k] = len(stay)
            stay.append(child._replace(parent=new_index.get(child.parent, -1)))
            continue
        dest = dests.get(r)
        if dest is None:
            before = nested[r].children
            dest = dests[r] = list(before.uncapped if isinstance(before, Children) else before)
        parent = new_index[child.parent] if child.parent >= 0 and target[child.parent] == r else -1
        if child.attributes.get(_KIND) == _CPU_OP:
            # into the nested span (its clock and the profiler's differ by microseconds)
            lo, hi = ((dest[parent].start_ns, dest[parent].end_ns) if parent >= 0
                      else (nested[r].start_ns, nested[r].end_ns))
            start = min(max(child.start_ns, lo), hi)
            child = child._replace(start_ns=start, end_ns=min(max(child.end_ns, start), hi),
                                   name=_relative(child.name, nested[r]))
        new_index[k] = len(dest)
        dest.append(child._replace(parent=parent))
    for r, dest in dests.items():
        _own_times(dest)
        nested[r].children = Children.of(dest, limit) if limit is not None else dest
    _own_times(stay)
    return Children.of(stay, limit) if limit is not None else stay


def _relative(name: str, res: Any) -> str:
    """``op (a.b.c)`` → ``op (c)`` in a nested span whose module is ``a.b``; also a label made
    relative to an enclosing span's module already (``op (b.c)`` under ``a``, then into ``a.b``)."""
    attrs = getattr(res, "attrs", None)
    module = attrs.get(_MODULE) if isinstance(attrs, dict) else None
    if not isinstance(module, str) or not module or not name.endswith(")"):
        return name
    at = name.rfind(" (")
    if at < 0:
        return name
    label = name[at + 2:]
    parts = module.split(".")
    for i in range(len(parts)):  # the whole path first, then the part below each ancestor
        prefix = ".".join(parts[i:]) + "."
        if label.startswith(prefix) and len(label) > len(prefix) + 1:
            return f"{name[:at]} ({label[len(prefix):]}"
    return name


def _own_times(spans: Iterable[ChildSpan]) -> None:
    """``self_ns`` of each op span again: its time minus its child op spans' (after clamping)."""
    spans = list(spans)
    own = [c.end_ns - c.start_ns for c in spans]
    for c in spans:
        if c.parent >= 0 and c.attributes.get(_KIND) == _CPU_OP:
            own[c.parent] -= c.end_ns - c.start_ns  # GPU activities run beside, not inside
    for k, c in enumerate(spans):
        if _SELF_NS in c.attributes:
            c.attributes[_SELF_NS] = max(0, own[k])
