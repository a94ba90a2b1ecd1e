"""CUDA graph state: the patched capture/replay methods, the threads capturing, replay counts, and
the marks compiled code carries (attnscope._capture.graphs, .graph_marks)."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._record.graphs import GraphRecord
    from .sampler import CallSite

__all__ = ["Graphs", "GRAPH_COUNT_KEYS"]

# attnscope.stats() keys of CUDA graph replays (docs/profiling.md, "CUDA graphs")
GRAPH_COUNT_KEYS = ("graph_replays_sampled", "graph_replays_lost", "graph_calls_over_cap")


class Graphs:
    """What attnscope knows about CUDA graphs in this process.

    ``reset()`` keeps the hooks and the marks: the hooks are installed in torch, the mark op is
    registered with it, and wrappers and compiled code carry the mark numbers.
    """

    def __init__(self) -> None:
        # the class whose capture and replay attnscope patched -> the methods it replaced
        self.hooks: dict[type, dict[str, Callable[..., Any]]] = {}
        # the mark op once defined, the number a wrapper's marks carry -> its call site, and the
        # number a compiled call's marks carry -> ((site number, module id, tensor names,
        # constants), weak module) (at most graph_marks.MAX_CALLS)
        self.mark_op: Any = None
        self.mark_sites: weakref.WeakValueDictionary[int, CallSite] = (
            weakref.WeakValueDictionary())
        self.mark_calls: dict[int, tuple[Any, Any]] = {}
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()  # installing and removing the hooks
        # thread ident -> the graph that thread is capturing; while it is not empty every call
        # site's countdown stays at 1 (capture.graphs)
        self.capturing: dict[int, GraphRecord] = {}
        # replays sampled, replays whose calls were read too late (a later replay overwrote
        # them), calls captured past a graph's event pairs: attnscope.stats()
        self.counts: dict[str, int] = dict.fromkeys(GRAPH_COUNT_KEYS, 0)

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self.capturing = {}  # the parent's capturing threads do not exist here
