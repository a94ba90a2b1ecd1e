"""A sampled CUDA graph replay's spans: the replay's own, and one per call captured into the graph.

The replay's capture arrives once its own event pair (recorded around the launch, on the
replaying stream) has passed: by then every node of that replay ran, the captured calls' event
pairs included. Those pairs are event nodes of the graph, recorded again by every replay, so the
replay after this one overwrites them: they are read only while the graph's generation is still
the sampled replay's, checked before and after reading. A replay launched meanwhile makes the
figures unknowable: the replay's span goes out without children, its calls counted lost
(``attnscope.graph.calls_lost``, ``stats()["graph_replays_lost"]``) — never a number from the
wrong replay. Nothing here waits for the device: ``query()`` and ``elapsed_time()`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _log
from .. import _schema as schema
from .._runtime import runtime
from .._record.capture import TIER_TIMING, Capture, next_id
from .._record.graphs import GraphRecord

if TYPE_CHECKING:
    from .cuda import DeviceAccess
    from .engine import Engine
    from .latency import Escalator

__all__ = ["finish", "read"]

_REPLAYED = schema.REPLAYED.name
_REPLAY, _CALLS, _OVER_CAP, _LOST = (schema.GRAPH_REPLAY.name, schema.GRAPH_CALLS.name,
                                     schema.GRAPH_CALLS_OVER_CAP.name, schema.GRAPH_CALLS_LOST.name)
_ATTENTION_NS, _SHARE = schema.GRAPH_ATTENTION_NS.name, schema.GRAPH_ATTENTION_SHARE.name


class _Read:
    """A captured call's device time, read already: what the engine asks of a timer."""

    __slots__ = ("ns", "device")
    start = None  # no event of its own: the graph's pair was read already

    def __init__(self, ns: int, device: Any) -> None:
        self.ns = ns
        self.device = device

    def ready(self) -> bool:
        return True

    def elapsed_ns(self) -> int:
        return self.ns

    def release(self) -> None:
        """Nothing to give back: the pair belongs to the graph."""

    # a replay's child is never on the calling side: nothing is recorded on it
    def record_start(self) -> None: ...

    def record_end(self) -> None: ...

    def record_after(self) -> None: ...


def finish(engine: Engine, cap: Capture, timed_out: bool, cuda: DeviceAccess,
           escalator: Escalator) -> int:
    """Hand the replay's span and its calls' spans to ``engine``; the calls' count (captures the
    worker made: the loop counts them as captured and processed)."""
    if cap.replay is None:  # not a replay: a call's span, as for any
        engine.finish(cap, timed_out, cuda, escalator)
        return 0
    rec, generation = cap.replay
    times = None if timed_out else read(cap, rec, generation)
    counts = runtime.graphs.counts
    counts["graph_replays_sampled"] += 1
    if times is None:
        counts["graph_replays_lost"] += 1
    children = _children(cap, rec, times) if times is not None else []
    replay_ns = None if timed_out or cap.timer is None else cap.timer.elapsed_ns()
    engine.finish(_replay(cap, rec, generation, times, replay_ns, children), timed_out, cuda,
                  escalator)
    for child in children:
        engine.finish(child, False, cuda, escalator)
    return len(children)


def read(cap: Capture, rec: GraphRecord, generation: int) -> list[tuple[int, int]] | None:
    """Each captured call's (offset from the replay's start, device time) in ns, in capture order;
    None when a later replay was launched before the reading ended, or an event was not passed."""
    if rec.generation != generation:
        return None
    if cap.timer is None:  # a replay is always timed: nothing to read otherwise
        return None
    start = cap.timer.start
    out: list[tuple[int, int]] = []
    try:
        for template in rec.templates:
            timer = template.timer
            if not timer.ready():
                return None
            offset = int(start.elapsed_time(timer.start) * 1_000_000)
            out.append((max(0, offset), timer.elapsed_ns()))
    except RuntimeError as exc:  # an event the driver will not time: no figures for this replay
        _log.warn_once("graph-events", "attnscope: a CUDA graph's event pair could not be read; "
                       "its replay's calls are counted lost", error=repr(exc)[:200])
        return None
    if rec.generation != generation:  # launched while reading: any of them may be the next's
        return None
    return out


def _children(cap: Capture, rec: GraphRecord, times: list[tuple[int, int]]) -> list[Capture]:
    """One capture per call of the graph, under the replay (or the graph call it ran inside)."""
    new_ids = {t.capture_id: next_id() for t in rec.templates}
    out = []
    for template, (offset, ns) in zip(rec.templates, times, strict=True):
        child = Capture()
        child.capture_id = new_ids[template.capture_id]
        child.parent_id = new_ids.get(template.parent_id, cap.capture_id)
        child.site = template.site
        child.name = template.name
        child.tier = TIER_TIMING
        child.sample_rate = cap.sample_rate
        child.otel_parent = cap.otel_parent
        child.step_no = cap.step_no
        child.summary = template.summary
        child.facts = template.facts
        child.instance = template.instance
        child.extra = {_REPLAYED: True, **(template.extra or {})}
        # placed at the replay's host start plus its offset on the device; its length is its
        # device time: no host call ran
        child.start_epoch_ns = cap.start_epoch_ns + offset
        child.start_perf_ns = cap.start_perf_ns + offset
        child.end_perf_ns = child.start_perf_ns + ns
        child.timer = _Read(ns, template.timer.device)
        out.append(child)
    return out


def _replay(cap: Capture, rec: GraphRecord, generation: int,
            times: list[tuple[int, int]] | None, replay_ns: int | None,
            children: list[Capture]) -> Capture:
    """The replay's capture as its span shows it: a copy (the worker writes only its own
    objects) with the graph's figures as attributes."""
    head = Capture()
    for name in Capture.__slots__:
        setattr(head, name, getattr(cap, name))
    extra: dict[str, Any] = {_REPLAY: generation, _CALLS: len(rec.templates)}
    if rec.over_cap:
        extra[_OVER_CAP] = rec.over_cap
    if times is None:
        extra[_LOST] = len(rec.templates)
    else:
        outer = sum(child.end_perf_ns - child.start_perf_ns for child in children
                    if child.parent_id == cap.capture_id)
        extra[_ATTENTION_NS] = outer
        if replay_ns:
            extra[_SHARE] = round(outer / replay_ns, 4)
    head.extra = {**extra, **(cap.extra or {})}
    return head
