"""The handle on the worker side: the running worker, the ones retiring, the spare thread, exit.

The one seam between the two sides: the calling side hands a Capture to :meth:`WorkerHandle.submit`,
which starts the worker through a starter the worker side installed (attnscope._api wires it), so
neither side imports the other.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _interrupt_safe

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from .._record.capture import Capture
    from .._worker.loop import Worker
    from .._worker.spare import Spare

__all__ = ["WorkerHandle"]

_FORK_WAIT_S = 5.0


class WorkerHandle:
    """The worker and everything about its lifetime: start, retire, spare thread, exit.

    ``reset()`` forgets a running worker (stop it first: ``attnscope.shutdown()``) and keeps the
    starter and the parked spare thread (one per process is enough). ``after_fork()``: the
    parent's threads do not exist in the child, and the child counts its own spans.
    """

    def __init__(self) -> None:
        self._start: Callable[[], Worker | None] | None = None
        self.spare: Spare | None = None  # a worker thread configure() started, for the first worker
        self.reset()

    def reset(self) -> None:
        self.lock = threading.Lock()
        self.current: Worker | None = None
        # held while attnscope imports its worker side or builds a pipeline (imports), so that a
        # fork waits for the import to finish (see before_fork)
        self.import_lock = threading.Lock()
        self.fork_held: list[bool] = []  # filled from C (_interrupt_safe.take)
        self.atexit_registered = False
        # worker.stopping.shutdown, kept by worker.at_exit.register: a forked child's os._exit
        # exports through it (_worker/at_exit.py)
        self.exit_flush: Callable[..., bool] | None = None
        self.exiting = False  # the exit flush has begun: no new worker (it could not export)
        self.exit_done = threading.Event()  # ... and has ended (a child's SIGTERM waits for it)
        # an exporter instance the application gave, kept across a reconfigure that rebuilds
        # the pipeline: the old pipeline's shutdown flushes it instead of shutting it down
        self.kept_exporter: SpanExporter | None = None
        self.exit_wait_s = 0.0  # what exit already spent waiting for the worker's pipeline
        self.retired_counts: dict[str, int] = {}  # stats() counts of workers already shut down
        self.retiring: list[Worker] = []  # workers shut down whose thread has not ended yet
        # threads finishing a shutdown() a Ctrl-C cut short (flush() and exit wait for them)
        self.closing: list[threading.Thread] = []

    def after_fork(self) -> None:
        self.lock = threading.Lock()
        self.import_lock = threading.Lock()
        self.current = None
        self.exit_done = threading.Event()  # the child's own exit flush, if any
        self.spare = None  # the parent's thread does not exist here
        self.fork_held = []
        self.retired_counts = {}  # the child counts its own spans
        self.retiring = []
        self.closing = []

    def before_fork(self) -> None:
        """Wait (bounded) for attnscope's own imports in other threads: a child forked while a
        thread imports a module would wait for that module's import lock for ever."""
        self.fork_held = []  # a Ctrl-C as the lock is taken must not lose that it was
        _interrupt_safe.take(self.import_lock, self.fork_held, _FORK_WAIT_S)

    def after_fork_in_parent(self) -> None:
        held, self.fork_held = self.fork_held, []
        if True in held:
            self.import_lock.release()

    def set_starter(self, start: Callable[[], Worker | None]) -> None:
        """Install the function that starts the worker on the first :meth:`submit`."""
        self._start = start

    def submit(self, cap: Capture) -> bool:
        """Hand a capture to the worker (starting it on first use). False: dropped."""
        worker = self.current
        if worker is None:
            if self._start is None:
                # A capture from a site made through a private module path, before any public
                # name loaded the API (attnscope/__init__.py loads it lazily): ask the package
                # for a public name now, once, rather than drop the capture unseen. Its loader
                # imports every public home, attnscope._api among them, which installs the
                # starter. The package is loaded (it is this module's parent): no import here.
                getattr(sys.modules[__name__.partition(".")[0]], "configure", None)
            if self._start is None:
                return False
            worker = self._start()
            if worker is None:  # the process is exiting
                return False
        return bool(worker.submit(cap))

    def end_block(self, block: Any) -> None:
        """Tell the running worker a ``batch`` block ended (its request spans are due); with no
        worker none of its calls is waiting either."""
        worker = self.current
        if worker is not None:
            worker.end_block(block)

    def counts(self) -> dict[str, int]:
        """Span counts of every worker of the process: shut down, running and retiring."""
        with self.lock:
            workers = [w for w in (self.current, *self.retiring) if w is not None]
            totals = dict(self.retired_counts)
        for worker in workers:
            for key, value in worker.counts().items():
                totals[key] = totals.get(key, 0) + value
        return totals
