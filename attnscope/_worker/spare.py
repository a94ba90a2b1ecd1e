"""A worker thread started ahead of the worker, at set-up time (``configure()``).

It imports the worker side (:mod:`.engine`: the SDK, the exporters, the profile parser),
structlog (the first line logged, often on a user's call, imports nothing) and what the
configured pipeline will import (the metrics SDK, the OTLP exporter), then waits to run the first
worker the process starts: that worker's first sampled call neither imports nor starts a thread,
and the worker builds its pipeline without importing. ``configure()`` waits for the import (at
most ``LOAD_WAIT_S``): left to run on while the program went on, it held the GIL for 100 ms and
more of imports, and a first request made then paid for them (the first instrumented
``generate()`` right after ``configure()`` took 2.1x a later one on CPU,
``benchmarks/bench_first_call.py --generate``; issue 37 goal 1). Set-up is where that cost
belongs. Light, like :mod:`.loop`.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable

from .. import _log
from .._runtime import runtime

__all__ = ["LOAD_WAIT_S", "Spare", "preload"]

# Polled, from every 50 ms at first to every 0.5 s once the program has gone a while without a
# sampled call: an idle process is woken twice a second, a busy one starts its worker at once.
_POLL_FIRST_S = 0.05
_POLL_MAX_S = 0.5
# configure() waits this long at most for the worker side's import (a bound, not a deadline: an
# import that takes longer goes on in the background, as before)
LOAD_WAIT_S = 10.0


class Spare:
    """A thread named like the worker's that imports the worker side, then runs the job given."""

    def __init__(self) -> None:
        self._job: Callable[[], None] | None = None
        self._lock = threading.Lock()
        self._never = threading.Event()  # only waited on, with a timeout: the poll's clock
        self.loaded = threading.Event()  # the import is over (done or failed)
        self.thread = threading.Thread(target=self._run, name="attnscope-worker", daemon=True)
        self.thread.start()

    def take(self, job: Callable[[], None]) -> bool:
        """Give this thread ``job`` (a worker's loop); False if it is not there to run it."""
        with self._lock:
            if self._job is not None or not self.thread.is_alive():
                return False
            self._job = job
        return True

    def _run(self) -> None:
        try:
            with runtime.worker.import_lock:  # no fork while a module is half imported
                from .._export import destinations
                from . import engine  # noqa: F401

                _log.preload()  # the first line logged, often on a user's call, imports nothing
                cfg = runtime.config.current
                if cfg is not None:  # and the worker's pipeline builds with no import of its own
                    destinations.preload_imports(cfg)
        except Exception as exc:  # the worker imports again when it runs, and says why
            _log.internal_error("preload", exc)
        finally:
            self.loaded.set()
        # Polled, not woken: waking a waiting thread cost the first sampled call 0.2 ms here
        # (a futex hand-over under load); a worker that starts a little later costs nothing
        # (its captures wait in the bounded queue).
        interval = _POLL_FIRST_S
        while self._job is None:
            self._never.wait(interval)
            interval = min(interval * 2, _POLL_MAX_S)
        self._job()


def preload(wait_s: float = LOAD_WAIT_S) -> None:
    """``configure()``: start the spare worker thread (once, while no worker runs) and wait, at
    most ``wait_s``, for it to have imported the worker side; never raises (a Ctrl-C while it
    waits goes through: the thread imports on)."""
    # Asked before the spare starts: its own import of the worker side, under way an instant
    # later, looked like the caller's, and configure() did not wait at all (most runs)
    inside = wait_s > 0 and _inside_an_import()
    try:
        with runtime.worker.lock:
            if runtime.worker.spare is None and runtime.worker.current is None:
                runtime.worker.spare = Spare()
            spare = runtime.worker.spare
    except Exception as exc:  # no thread now: the first sampled call starts one
        _log.internal_error("preload", exc)
        return
    if isinstance(spare, Spare) and wait_s > 0 and not inside:
        spare.loaded.wait(wait_s)


def _inside_an_import() -> bool:
    """True while a module is still executing its import (``configure()`` called from module
    code, or from ``attnscope run``'s hook right after torch executed): that import's lock may
    be one the spare thread's import needs (torch's, under ``attnscope run``), and waiting for
    it would wait out the whole bound (10 s added to every ``attnscope run``). The spare then
    imports in the background, as it would past the bound."""
    try:
        for module in list(sys.modules.values()):
            if getattr(getattr(module, "__spec__", None), "_initializing", False):
                return True
    except Exception as exc:  # unknown: not waiting is the side that cannot hang
        _log.internal_error("preload", exc)
        return True
    return False
