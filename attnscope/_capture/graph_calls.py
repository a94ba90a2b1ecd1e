"""A traced call while its thread captures a CUDA graph: kept as a template of the graph's calls.

Nothing is sampled during a capture: every instrumented call the capturing thread makes on a
capturing stream is kept (up to ``MAX_GRAPH_CALLS`` a graph), because the graph will run it on
every replay and the replays are what is sampled (:mod:`.graphs`). What is recorded into the
graph is one pair of external timing events around the call: event-record nodes that every replay
records again. Nothing else touches the device: no allocator reading, no copy, no profiler, no
value read (any of them would be captured into the graph, or synchronise and break the capture);
the call's tensors are kept as shapes only, so figures that need a value (a mask's counts, a
static cache's length) are marked not exact by the worker, as for a mask not kept. A cache
length the extractor read as a number is left out too: it is the capture's, and a decode graph is
replayed over advancing positions.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from .. import _log
from .._record.capture import NO_FACTS, TIER_TIMING, Capture, Facts, TensorMeta, error_info, next_id
from .._record.graphs import MAX_PARENTS, GraphRecord
from .._runtime import runtime
from . import args as _args
from . import device as _device
from .sampling import CallSite

__all__ = ["open_template", "close_template", "real_parent"]

_perf_ns = time.perf_counter_ns
# a cache length nothing can read: the worker's derive marks the call cache_unread
_UNKNOWN_LENGTH = TensorMeta((), None, None)


def open_template(cap: Capture, rec: GraphRecord, site: CallSite, args: tuple[Any, ...],
                  kwargs: dict[str, Any], extra: dict[str, Any] | None, device: Any,
                  parent: int | None, extract: bool = True) -> None:
    """Fill ``cap`` as a call captured into ``rec``'s graph and record its start event (none
    past the graph's cap: the call is counted instead). ``parent``: the current capture, kept
    only when it is another call of the same graph (nesting inside the graph). ``extract``:
    False for a compiled call's mark (capture.graph_marks), whose site's extractor would miss
    the module instance: the arguments' shapes only."""
    cap.capture_id = next_id()
    cap.parent_id = parent if parent in rec.ids else None
    if len(rec.parents) < MAX_PARENTS:
        rec.parents[cap.capture_id] = parent
    cap.site = site
    cap.name = site.name
    cap.tier = TIER_TIMING
    cap.extra = extra
    cap.graph = rec
    if site.kind == "method" and args:
        cap.instance = args[0]
    extractor = site.extractor if extract else None
    summary = _args.summarize(args, kwargs, site.param_names) if extractor is None else []
    if extractor is not None:
        try:  # extractors keep device tensors by reference and read none of their values
            cap.facts = _facts_shapes_only(extractor(cap.instance, args, kwargs) or NO_FACTS)
        except Exception as exc:  # the template keeps the arguments' shapes instead
            _log.internal_error("extract", exc)
        if cap.facts is NO_FACTS:
            summary.extend(_args.summarize(args, kwargs, site.param_names))
    cap.summary = _shapes_only(summary)
    if rec.device is None:
        rec.device = device
    if rec.full():
        rec.over_cap += 1
        runtime.graphs.counts["graph_calls_over_cap"] += 1
    else:
        rec.ids.add(cap.capture_id)
        pool = runtime.device.event_pool
        if pool is None:
            pool = runtime.device.event_pool = _device.CudaEventPool()
        cap.timer = pool.external(device)
        cap.timer.record_start()
    cap.start_epoch_ns = time.time_ns()
    cap.start_perf_ns = _perf_ns()


def real_parent(parent: int | None) -> int | None:
    """The parent of a call sampled as usual while its thread captures a graph: the first
    enclosing capture that is not kept for the graph (those never reach the worker: a child
    would wait for them in the span builder)."""
    rec = runtime.graphs.capturing.get(threading.get_ident())
    if rec is None:
        return parent
    parents = rec.parents
    while parent in parents:
        parent = parents[parent]
    return parent


def close_template(cap: Capture, error: BaseException | None) -> None:
    """The captured call returned: its end event, and the template joins its graph's record. A
    call that raised is left out (its graph is most likely not replayed)."""
    if cap.timer is None:
        return
    cap.timer.record_end()
    if error is not None:
        cap.error = error_info(error)
        return
    if cap.graph is not None:
        cap.graph.templates.append(cap)


def _shapes_only(summary: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    """The summary with every tensor as its shape: a replay changes the values of the graph's
    buffers, so no value read later would be the sampled replay's."""
    out: list[tuple[str, Any]] = []
    for key, value in summary:
        if not isinstance(value, (TensorMeta, int, float, bool, type(None))):
            value = _meta(value)
        out.append((key, value))
    return out


def _facts_shapes_only(facts: Facts) -> Facts:
    """An extractor's facts with every tensor as its shape (as :func:`_shapes_only`). A layer's
    traits are kept (its attention cores, chunk, band: the same on every replay), but for the
    tokens its cache had seen, which are the capture's."""
    for value in (facts.attention, facts.model):
        if value is None:
            continue
        if value.mask is not None and not isinstance(value.mask, TensorMeta):
            value.mask = _meta(value.mask)
        if value.past is not None:
            # the cache length at capture is not the replay's (a decode graph is replayed
            # over advancing positions), and a device one is not read: not known
            value.past = _UNKNOWN_LENGTH
    attention, traits = facts.attention, facts.traits
    if attention is not None:
        attention.row_counts = None
        if traits is not None and traits.seen is not None and attention.cached:
            # as the cache length above: a replay's compressed entries are not known
            return facts._replace(traits=traits._replace(seen=None))
    return facts


def _meta(value: Any) -> Any:
    try:
        return TensorMeta.of(value)
    except Exception:  # not a tensor: nothing of it is kept
        return None
