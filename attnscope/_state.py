"""Every piece of attnscope's process state, in one object, with one reset and one fork handler.

Modules keep no mutable globals of their own (a test walks them to make sure): what must outlive
a call lives on :data:`state`, either as a plain field here or in an object this module holds
(the sampler). Context variables are keys, not state, and stay with the code that sets them.

:func:`reset` puts everything back as at import (tests); the call sites, the hooks installed in
torch and the profiler's warm-up survive it, because they live in user code and in torch.
:func:`after_fork` runs in a forked child: threads and sessions of the parent do not exist there,
and any lock another parent thread held would stay held forever, so every lock is new.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ._capture.grants import Grants
from ._capture.sampling import CallSite, Sampler

if TYPE_CHECKING:
    from ._config import Config
    from ._record.capture import Capture, ProfileSession

__all__ = ["State", "ProfilerState", "Delivery", "state", "reset", "after_fork", "submit",
           "end_block", "COUNT_KEYS", "GRAPH_COUNT_KEYS", "span_counts", "take_bytes",
           "give_bytes", "KEEP_TOTAL_BYTES"]

_FORK_WAIT_S = 5.0
# Tensors all captures together may keep alive by reference (masks until the worker counts them).
KEEP_TOTAL_BYTES = 64 << 20

# The span counts of attnscope.stats(), over every worker of the process (docs/sampling.md).
COUNT_KEYS = ("captured", "emitted", "dropped_queue_full", "dropped_trace_cap", "orphaned",
              "pending", "worker_errors", "spans_to_export", "exported", "export_failed",
              "export_dropped", "export_in_flight")

# attnscope.stats() keys of CUDA graph replays (docs/profiling.md, "CUDA graphs")
GRAPH_COUNT_KEYS = ("graph_replays_sampled", "graph_replays_lost", "graph_calls_over_cap")

# "nested": attnscope's own session was running on this thread (a traced call inside a profiled
# one), not the user's profiler
_PROFILE_SKIP_REASONS = ("warming", "user_profiler", "nested", "busy", "sync_debug", "error")


class ProfilerState:
    """The profile tier's process-wide facts.

    One session at a time, the user's profiler, warm-up.
    """

    def __init__(self) -> None:
        self.session_lock = threading.Lock()  # held for the whole of one attnscope session
        self.lock = threading.Lock()  # counters and the warm-up thread
        self.owner: int | None = None  # thread ident of the running session
        self.active: ProfileSession | None = None
        self.foreign = False  # a user's profiler is prepared or running (seen through the hooks)
        self.warming: threading.Thread | None = None
        self.reset_counts()
        # Process-lifetime facts, kept by reset(): torch's pieces, and what warm-up learnt.
        self.torch: Any = None
        self.entry_points: dict[str, Callable[..., Any]] = {}
        self.configs: dict[bool, tuple[Any, Any]] = {}
        self.hooked = False
        self.warm_cpu = False
        self.warm_cuda = False
        self.broken: dict[bool, str] = {}  # on_cuda -> why kineto refused at warm-up
        self.kineto_ran = False  # attnscope started a kineto session (capture.fork_exit)

    def reset_counts(self) -> None:
        self.counts: dict[str, int] = {"profiled": 0,
                                       **{"skipped_" + r: 0 for r in _PROFILE_SKIP_REASONS}}

    def after_fork(self) -> None:
        self.session_lock = threading.Lock()
        self.lock = threading.Lock()
        self.owner = None
        self.active = None
        self.warming = None


class Delivery:
    """What happened to spans after attnscope built them (our own provider only), over every
    pipeline of the process.

    Counts spans, kernel child spans included. A provider attnscope does not own delivers the
    application's way: its losses are the application's exporter's to report. Every span handed
    to the batch processor is in exactly one of ``in_flight``, ``exported``, ``export_failed``,
    ``export_queue_full``: it enters ``in_flight`` and leaves it once, under ``lock`` (several
    threads move spans: the worker, the batch processor's thread, flush and shutdown helpers).
    """

    __slots__ = ("export_failed", "export_queue_full", "exported", "in_flight", "lock",
                 "no_pipeline", "to_export", "written_paths")

    def __init__(self) -> None:
        # spans the worker handed to the pipeline (worker.emit, under ``lock``): each ends in
        # exactly one of the counts below
        self.to_export = 0
        self.exported = 0  # spans the exporter delivered (a file exporter: once in the file)
        self.export_failed = 0  # spans the exporter reported as failed, or lost before the file
        self.export_queue_full = 0  # spans the batch processor dropped: its queue was full, or
        # it had shut down, or its shutdown gave up on them
        self.no_pipeline = 0  # spans built while no pipeline could be built: sent nowhere
        self.in_flight = 0  # handed to the batch processor, neither delivered nor lost yet
        self.lock = threading.Lock()
        # trace files attnscope's file exporters wrote in this process: an exporter opened on
        # one again (a restarted worker) keeps what the file holds
        self.written_paths: set[str] = set()

    def queued(self) -> None:
        """One span entered the batch processor's queue."""
        with self.lock:
            self.in_flight += 1

    def settle(self, exported: int = 0, failed: int = 0, dropped: int = 0) -> None:
        """Spans in flight reached their end: delivered, failed, or dropped unexported."""
        with self.lock:
            self.exported += exported
            self.export_failed += failed
            self.export_queue_full += dropped
            self.in_flight -= exported + failed + dropped

    def counts(self) -> dict[str, int]:
        """The export keys of ``attnscope.stats()``."""
        with self.lock:
            return {"exported": self.exported, "export_failed": self.export_failed,
                    "export_dropped": self.export_queue_full + self.no_pipeline,
                    "export_in_flight": self.in_flight}

    @property
    def lost(self) -> int:
        return self.export_failed + self.export_queue_full + self.no_pipeline


class State:
    """attnscope's process state. One instance, :data:`state`."""

    def __init__(self) -> None:
        # configuration: the effective Config (None until first use)
        self.config_lock = threading.RLock()
        self.config: Config | None = None
        # calling thread: sampling, span() call sites, CUDA events, torch.compile registration
        self.sampler = Sampler()
        self.grants = Grants()  # profile-tier grants: after slow calls, on demand (docs/live.md)
        self.span_sites: dict[str, CallSite] = {}
        self.span_sites_lock = threading.Lock()
        self.kept_lock = threading.Lock()
        self.kept_bytes = 0  # bytes of tensors captures keep by reference, within KEEP_TOTAL_BYTES
        self.event_pool: Any = None  # capture.device.CudaEventPool, made on the first CUDA call
        # (device index, "stats" | "reset-peak"): what the CUDA allocator refused (pluggable ones)
        self.allocator_off: set[tuple[int, str]] = set()
        # Until the program imports Dynamo nothing can be compiling: method wrappers skip the
        # is_compiling() call (~50 ns) until capture.compile's import hook sets this.
        self.dynamo_loaded = "torch._dynamo" in sys.modules
        # wrapper -> the function it wraps, until Dynamo loads; weak: a wrapper the program lets go
        # of (a runtime trace(fn) per request) leaves no trace here
        self.dynamo_pending: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = (
            weakref.WeakKeyDictionary())
        self.dynamo_hook: Any = None
        self.profiler = ProfilerState()
        # worker side: the running worker and what it reads per span
        self.worker: Any = None  # worker.loop.Worker
        self.worker_lock = threading.Lock()
        # held while attnscope imports its worker side or builds a pipeline (imports), so that a
        # fork waits for the import to finish (see _before_fork)
        self.import_lock = threading.Lock()
        # worker.spare.Spare: a worker thread configure() started, waiting for the first worker
        self.spare_thread: Any = None
        self.fork_held = False
        self.atexit_registered = False
        # worker.loop.shutdown, kept by worker.at_exit.register: a forked child's os._exit
        # exports through it (_worker/at_exit.py)
        self.exit_flush: Callable[..., bool] | None = None
        self.exiting = False  # the exit flush has begun: no new worker (it could not export)
        # an exporter instance the application gave, kept across a reconfigure that rebuilds
        # the pipeline: the old pipeline's shutdown flushes it instead of shutting it down
        self.kept_exporter: Any = None
        self.exit_wait_s = 0.0  # what exit already spent waiting for the worker's pipeline
        self.delivery = Delivery()  # export outcomes, counted by attnscope's own pipelines
        self.retired_counts: dict[str, int] = {}  # stats() counts of workers already shut down
        self.retiring: list[Any] = []  # workers shut down whose thread has not ended yet
        self.process: Any = None  # psutil.Process, for host RSS
        self.rss_bytes: int | None = None  # the last reading, and when (monotonic seconds)
        self.rss_read_at = float("-inf")
        # logging: rate limits and internal-error counts
        self.log_lock = threading.Lock()
        self.last_logged: dict[str, float] = {}
        self.errors_by_stage: dict[str, int] = {}
        # metrics: totals that survive worker restarts, instruments per meter provider
        self.metrics_lock = threading.Lock()
        self.metric_last: dict[str, tuple[Any, int]] = {}
        self.metric_totals: dict[str, int] = {}
        self.instruments: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
        self.prometheus_started = False
        # instrumentation: register_attention() classes, the original SDPA function
        self.registry_lock = threading.Lock()
        self.attention_registry: dict[type, Any] = {}
        self.sdpa_lock = threading.Lock()
        self.sdpa_original: Any = None
        # CUDA graphs (capture.graphs): the class whose capture and replay attnscope patched ->
        # the methods it replaced (process lifetime, kept by reset(): they are installed in torch)
        self.graph_hooks: dict[type, dict[str, Callable[..., Any]]] = {}
        # thread ident -> the record.graphs.GraphRecord of the graph that thread is capturing;
        # while it is not empty every call site's countdown stays at 1 (capture.graphs)
        self.graph_capturing: dict[int, Any] = {}
        # replays sampled, replays whose calls were read too late (a later replay overwrote
        # them), calls captured past a graph's event pairs: attnscope.stats()
        self.graph_counts: dict[str, int] = dict.fromkeys(GRAPH_COUNT_KEYS, 0)
        # capture.graph_marks (kept by reset(): wrappers and compiled code carry them): the mark
        # op once defined, the number a wrapper's marks carry -> its call site, and the number a
        # compiled call's marks carry -> ((site number, module id, tensor names, constants),
        # weak module) (at most graph_marks.MAX_CALLS)
        self.graph_mark_op: Any = None
        self.graph_mark_sites: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        self.graph_mark_calls: dict[int, tuple[Any, Any]] = {}


state = State()
# The one seam between the two sides: the capture side hands a Capture to whatever the worker
# side installed here (attnscope._api wires it), so neither imports the other.
_start_worker: Callable[[], Any] | None = None


def set_worker_starter(start: Callable[[], Any]) -> None:
    """Install the function that starts the worker on the first :func:`submit`."""
    global _start_worker
    _start_worker = start


def submit(cap: Capture) -> bool:
    """Hand a capture to the worker (starting it on first use). False: dropped."""
    worker = state.worker
    if worker is None:
        if _start_worker is None:
            # A capture from a site made through a private module path, before any public
            # name loaded the API (attnscope/__init__.py loads it lazily): load it now, once,
            # rather than drop the capture unseen. A name-based import: _api imports this module.
            importlib.import_module(__package__ + "._api")
        if _start_worker is None:
            return False
        worker = _start_worker()
        if worker is None:  # the process is exiting
            return False
    return bool(worker.submit(cap))


def end_block(block: Any) -> None:
    """Tell the running worker a ``batch`` block ended (its request spans are due); with no
    worker none of its calls is waiting either."""
    worker = state.worker
    if worker is not None:
        worker.end_block(block)


def span_counts() -> dict[str, int]:
    """The span counts of ``attnscope.stats()`` (``COUNT_KEYS``): workers shut down, the running
    and retiring ones (anything with ``counts()``), and the process's export outcomes."""
    with state.worker_lock:
        workers = [w for w in (state.worker, *state.retiring) if w is not None]
        totals = dict(state.retired_counts)
    for worker in workers:
        for key, value in worker.counts().items():
            totals[key] = totals.get(key, 0) + value
    delivery = state.delivery
    return ({k: totals.get(k, 0) for k in COUNT_KEYS} | delivery.counts()
            | {"spans_to_export": delivery.to_export})


def take_bytes(n: int) -> bool:
    """Reserve ``n`` bytes of the tensor-keeping budget; False if that would exceed it."""
    with state.kept_lock:
        if state.kept_bytes + n > KEEP_TOTAL_BYTES:
            return False
        state.kept_bytes += n
        return True


def give_bytes(n: int) -> None:
    """Return bytes reserved with :func:`take_bytes` (the tensors are no longer kept)."""
    if n:
        with state.kept_lock:
            state.kept_bytes = max(0, state.kept_bytes - n)


def reset() -> None:
    """Everything back to its state at import, but call sites, torch hooks and warm-up (tests).

    Stop the worker first (``attnscope.shutdown()``): a running one is forgotten, not stopped.
    """
    fresh = State()
    sampler, profiler = state.sampler, state.profiler
    # The sampler knows every call site (decorated functions live on in user code) and the
    # instrumentation registry and SDPA wrapper are installed in user-visible places.
    keep = {"sampler", "profiler", "dynamo_loaded", "dynamo_pending", "dynamo_hook",
            "attention_registry", "sdpa_original", "instruments", "prometheus_started",
            "graph_hooks", "graph_mark_op", "graph_mark_sites",
            "graph_mark_calls",
            "spare_thread"}  # a parked thread: one per process is enough
    for name, value in vars(fresh).items():
        if name not in keep:
            setattr(state, name, value)
    sampler.reset()
    profiler.reset_counts()


def after_fork() -> None:
    """In a forked child: no worker, no session, no warm-up thread, every lock new."""
    for name, value in list(vars(state).items()):
        if isinstance(value, type(threading.Lock())):
            setattr(state, name, threading.Lock())
        elif isinstance(value, type(threading.RLock())):
            setattr(state, name, threading.RLock())
    state.worker = None
    state.spare_thread = None  # the parent's thread does not exist here
    state.fork_held = False
    state.retired_counts = {}  # the child counts its own spans
    state.delivery = Delivery()
    state.retiring = []
    state.event_pool = None  # CUDA events of the parent are not valid in a child
    state.graph_capturing = {}  # the parent's capturing threads do not exist here
    state.sampler.after_fork()
    state.profiler.after_fork()
    state.grants = Grants()  # the parent's trigger and grants are the parent's


def _before_fork() -> None:
    """Wait (bounded) for attnscope's own imports in other threads: a child forked while a thread
    imports a module would wait for that module's import lock for ever."""
    state.fork_held = state.import_lock.acquire(timeout=_FORK_WAIT_S)


def _after_fork_in_parent() -> None:
    if state.fork_held:
        state.fork_held = False
        state.import_lock.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_before_fork, after_in_parent=_after_fork_in_parent,
                        after_in_child=after_fork)
