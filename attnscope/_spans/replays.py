"""The captures a sampled CUDA graph replay's spans are made from: the replay's, and its calls'.

The worker reads the replay's event pairs (:mod:`attnscope._worker.replays`); from those figures
this makes the replay's capture (a copy, with the graph's attributes) and one capture per call
captured into the graph, placed on the replay's host clock; the span builder turns them into
spans as it does any capture's.
"""

from __future__ import annotations

from typing import Any

from .. import _schema as schema
from .._record.capture import TIER_TIMING, Capture, next_id
from .._record.graphs import GraphRecord

__all__ = ["children", "replay_capture"]

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


def children(cap: Capture, rec: GraphRecord, times: list[tuple[int, int]]) -> list[Capture]:
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


def replay_capture(cap: Capture, rec: GraphRecord, generation: int,
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
