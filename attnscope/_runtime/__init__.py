"""attnscope's process state: one :class:`Runtime` of owned components, one reset, one fork hook.

Modules keep no mutable globals of their own (a test walks them to make sure): what must outlive
a call lives on :data:`runtime`, in the component that owns it. Each component is a small class
that owns its fields and its locks and has ``reset()`` (tests: everything back as at import, but
what lives in user code and in torch) and ``after_fork()`` (a forked child: threads and sessions
of the parent do not exist there, and a lock another parent thread held would stay held for
ever, so every lock is new). Context variables are keys, not state, and stay with the code that
sets them. The logger's rate limits are :data:`attnscope._log.limits` (``_log`` is a leaf): the
runtime resets and renews them with the rest.

Nothing here imports the calling side (``_capture``) or the worker side (``_worker``): both
import this. The worker is started through a starter the API installs
(:meth:`WorkerHandle.set_starter`).
"""

from __future__ import annotations

import os

from .. import _log
from .config import ConfigHolder
from .delivery import Delivery
from .device import DeviceState
from .dynamo import DynamoWatch
from .grants import Grants
from .graphs import GRAPH_COUNT_KEYS, Graphs
from .host import HostMemory
from .ids import IdSource
from .instrumentation import Instrumentation
from .masks import MaskMemo
from .metrics import MetricTotals
from .profiler import ProfilerGate
from .retention import KEEP_TOTAL_BYTES, Retention
from .sampler import Sampler, SpanSites
from .worker import WorkerHandle

__all__ = ["Runtime", "runtime", "Delivery", "COUNT_KEYS", "GRAPH_COUNT_KEYS", "KEEP_TOTAL_BYTES"]

# The span counts of attnscope.stats(), over every worker of the process (docs/sampling.md).
COUNT_KEYS = ("captured", "emitted", "dropped_queue_full", "dropped_trace_cap", "orphaned",
              "pending", "worker_errors", "spans_to_export", "exported", "export_failed",
              "export_dropped", "export_in_flight")


# Components replaced by a new object rather than reset in place (see Runtime.reset).
_NEW_ON_RESET = frozenset({"grants", "span_sites", "delivery"})
_NEW_ON_FORK = frozenset({"grants", "delivery"})


class Runtime:
    """attnscope's process state, one component per concept. One instance, :data:`runtime`."""

    def __init__(self) -> None:
        self.config = ConfigHolder()
        # calling thread: sampling, span() call sites, profile-tier grants (docs/live.md)
        self.sampler = Sampler()
        self.grants = Grants()
        self.span_sites = SpanSites()
        self.profiler = ProfilerGate()
        self.device = DeviceState()
        self.retention = Retention()
        self.dynamo = DynamoWatch()
        self.graphs = Graphs()
        self.instrumentation = Instrumentation()
        # worker side: the worker's lifetime, export outcomes, host memory, metric totals
        self.worker = WorkerHandle()
        self.delivery = Delivery()
        self.host = HostMemory()
        self.metrics = MetricTotals()
        self.masks = MaskMemo()  # recent masks' numbers, for the next equal mask
        self.ids = IdSource()  # span and trace ids (export.ids)
        self.log = _log.limits

    def reset(self) -> None:
        """Everything back to its state at import, but call sites, torch hooks and warm-up (tests).

        Stop the worker first (``attnscope.shutdown()``): a running one is forgotten, not
        stopped. Every component is reached (none can be left out by a list to keep up to date):
        those in ``_NEW_ON_RESET`` are new objects, a pipeline or a site of before may still
        hold the old ones; every other one resets itself.
        """
        for name, part in list(vars(self).items()):
            if name in _NEW_ON_RESET:
                setattr(self, name, type(part)())
            else:
                part.reset()

    def after_fork(self) -> None:
        """In a forked child: no worker, no session, no warm-up thread, every lock new. The
        parent's grants and export counts are the parent's: the child gets new ones."""
        for name, part in list(vars(self).items()):
            if name in _NEW_ON_FORK:
                setattr(self, name, type(part)())
            else:
                part.after_fork()

    def span_counts(self) -> dict[str, int]:
        """The span counts of ``attnscope.stats()`` (``COUNT_KEYS``): workers shut down, the
        running and retiring ones, and the process's export outcomes."""
        totals = self.worker.counts()
        delivery = self.delivery
        return ({k: totals.get(k, 0) for k in COUNT_KEYS} | delivery.counts()
                | {"spans_to_export": delivery.to_export})


runtime = Runtime()

if hasattr(os, "register_at_fork"):
    # bound methods of the one instance: reset() never replaces the components they reach
    os.register_at_fork(before=runtime.worker.before_fork,
                        after_in_parent=runtime.worker.after_fork_in_parent,
                        after_in_child=runtime.after_fork)
