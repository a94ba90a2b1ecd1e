"""A sampled CUDA graph replay, read: its event pairs, then its spans (the replay's and its calls').

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

from typing import TYPE_CHECKING

from .. import _log
from .._record.capture import Capture
from .._record.graphs import GraphRecord
from .._runtime import runtime
from .._spans import replays as _captures

if TYPE_CHECKING:
    from .cuda import DeviceAccess
    from .engine import Engine
    from .latency import Escalator

__all__ = ["finish", "read"]


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
    children = _captures.children(cap, rec, times) if times is not None else []
    replay_ns = None if timed_out or cap.timer is None else cap.timer.elapsed_ns()
    head = _captures.replay_capture(cap, rec, generation, times, replay_ns, children)
    engine.finish(head, timed_out, cuda, escalator)
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
