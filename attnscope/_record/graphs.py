"""What a captured CUDA graph holds of attnscope's: the calls captured into it, as templates.

Both sides read a :class:`GraphRecord`: the calling thread fills it while the graph captures and
bumps :attr:`GraphRecord.generation` before each replay; the worker reads it to build a sampled
replay's child spans, and checks the generation on both sides of reading the event pairs (a later
replay of the graph overwrites the timestamps its event nodes hold).
"""

from __future__ import annotations

from typing import Any

__all__ = ["GraphRecord", "MAX_GRAPH_CALLS", "MAX_PARENTS", "GRAPH_KEY", "REPLAY_NAME"]

# Event pairs one graph holds: calls captured past it run in the graph untimed, counted on the
# record (``over_cap``) and on each replay span (docs/profiling.md, "CUDA graphs").
MAX_GRAPH_CALLS = 1024
MAX_PARENTS = 4 * MAX_GRAPH_CALLS
# The graph object's attribute that holds its record (the graph keeps it alive, no registry does)
GRAPH_KEY = "_attnscope_graph"
REPLAY_NAME = "cuda_graph.replay"


class GraphRecord:
    """One graph's captured calls and replay count.

    ``templates``: the captured calls' :class:`~attnscope._record.capture.Capture`, in the order
    they ran, each with its external event pair as ``timer`` (none past ``MAX_GRAPH_CALLS``) and
    its tensors replaced by their shapes (values change from replay to replay); ``complete``: the
    capture ended without an error (only then are replays recorded); ``site``: the call site its
    replays are sampled by; ``device``: the device the graph captured on.
    """

    __slots__ = ("templates", "ids", "parents", "over_cap", "generation", "complete", "site",
                 "device", "thread", "marks", "__weakref__")

    def __init__(self, site: Any, thread: int) -> None:
        self.templates: list[Any] = []
        self.ids: set[int] = set()  # the templates' capture ids (nesting inside the graph)
        # capture id of a call kept for the graph -> the capture current when it began: a call
        # sampled inside it during the capture goes under that one (at most MAX_PARENTS)
        self.parents: dict[int, int | None] = {}
        self.over_cap = 0  # calls captured past MAX_GRAPH_CALLS: in the graph, untimed
        self.generation = 0  # replays launched so far: written by the replaying thread only
        self.complete = False
        self.site = site
        self.device: Any = None
        self.thread = thread  # the capturing thread's ident
        # compiled calls' templates opened by a begin mark, closed by the end mark
        # (capture.graph_marks; None: a mark whose call is not kept), innermost last
        self.marks: list[Any] = []

    def full(self) -> bool:
        """Every event pair is taken (counted when opened: a call nested in another is kept
        before the one around it)."""
        return len(self.ids) >= MAX_GRAPH_CALLS
