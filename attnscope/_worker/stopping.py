"""Flushing and shutting down the process's worker, each within its timeout (calling thread).

``flush()`` waits for the workers still finishing and the current one's queue, then flushes the
exporters; ``shutdown()`` takes the worker out of service, stops it and closes its pipeline. A
Ctrl-C cutting ``shutdown()`` short puts the worker back or finishes it aside (:func:`shutdown`).
"""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from .. import _log
from .._runtime import runtime

if TYPE_CHECKING:
    from .._export.pipeline import Pipeline

__all__ = ["flush", "shutdown"]


class Worker(Protocol):
    """What stopping needs of :class:`attnscope._worker.loop.Worker` (which imports this module:
    named here, not imported, so the two make no circle)."""

    thread: threading.Thread
    engine: Any

    @property
    def pipeline(self) -> Pipeline: ...

    @property
    def stopping(self) -> bool: ...

    def wait_idle(self, deadline: float) -> bool: ...

    def stop(self, deadline: float) -> bool: ...


def flush(timeout_s: float = 5.0) -> bool:
    """Process everything captured so far and flush the exporters, within ``timeout_s``."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    ok = _join_closing(deadline)
    for retiring in list(runtime.worker.retiring):  # replaced workers still building what they took
        retiring.thread.join(max(0.0, deadline - time.monotonic()))
        ok = ok and not retiring.thread.is_alive()
    worker: Worker | None = runtime.worker.current
    if worker is None:
        return ok
    delivery = worker.pipeline.delivery if worker.engine is not None else runtime.delivery
    lost_before = delivery.lost
    ok = worker.wait_idle(deadline) and ok
    engine = worker.engine  # built once the worker has processed anything
    if engine is None:
        return False  # still importing the worker side when the time ran out
    remaining_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
    try:
        ok = engine.pipeline.force_flush(remaining_ms) and ok
    except Exception as exc:
        _log.internal_error("flush", exc)
        ok = False
    # spans failed or dropped while this flush ran: what it flushed did not all arrive
    return ok and delivery.lost == lost_before


def shutdown(timeout_s: float = 5.0, export_s: float | None = None, *,
             resume: bool = False) -> bool:
    """Flush, stop the worker and shut down a provider attnscope created. Safe to call twice.

    ``export_s``: at most this much of ``timeout_s`` goes to the exporters, once every capture
    has become a span (the exit flush: a collector that is down costs exit no more than that).

    Cut short by a Ctrl-C (raised on, after this): with ``resume``, a worker not yet told to stop
    runs on as the process's worker, as if never shut down (the public ``shutdown()``: its caller
    stopped waiting, nothing more). Otherwise, or once it was told to stop, the rest runs on a
    thread of its own within the same time, which :func:`flush` and exit wait for; spans are
    never left in a pipeline nobody closes.
    """
    deadline = time.monotonic() + max(0.0, timeout_s)
    handle = runtime.worker
    with handle.lock:
        worker = handle.current
        handle.current = None
        if worker is not None:
            handle.retiring.append(worker)  # counted in stats() until its thread has ended
    if worker is None:
        return _join_closing(deadline)
    try:
        ok = _close(worker, deadline, export_s)
        return _join_closing(deadline) and ok  # both: an earlier cut-short shutdown ends too
    except BaseException:  # a Ctrl-C while it waited: back in service, or finished aside
        with handle.lock:
            back = resume and not worker.stopping and handle.current is None
            if back:
                handle.current = worker
                if worker in handle.retiring:
                    handle.retiring.remove(worker)
        if not back:
            _finish_aside(worker, deadline, export_s)
        raise


def _close(worker: Worker, deadline: float, export_s: float | None) -> bool:
    """:func:`shutdown`'s work on one worker taken out of service."""
    delivery = worker.pipeline.delivery if worker.engine is not None else runtime.delivery
    lost_before = delivery.lost
    ok = worker.stop(deadline)
    engine = worker.engine
    if engine is None:  # still importing when the time ran out: it stops once it has built
        return False
    if export_s is not None:
        deadline = min(deadline, time.monotonic() + export_s)
    try:
        remaining_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
        ok = engine.pipeline.force_flush(remaining_ms) and ok
        # provider shutdown can block on a hanging exporter: a thread and the remaining time
        engine.pipeline.shutdown_within(deadline - time.monotonic())
    except Exception as exc:
        _log.internal_error("shutdown", exc)
        ok = False
    return ok and delivery.lost == lost_before


def _finish_aside(worker: Worker, deadline: float, export_s: float | None) -> None:
    """:func:`shutdown` cut short by a Ctrl-C, its worker not put back: the rest on a thread of
    its own, which :func:`flush` and exit wait for."""
    if runtime.worker.exiting:  # exit stopped waiting: its line says what was not delivered
        return
    try:
        closing = threading.Thread(target=_close_aside, args=(worker, deadline, export_s),
                                   name="attnscope-shutdown", daemon=True)
        with runtime.worker.lock:
            runtime.worker.closing.append(closing)
        closing.start()
    except Exception as exc:
        _log.internal_error("shutdown", exc)


def _close_aside(worker: Worker, deadline: float, export_s: float | None) -> None:
    try:
        _close(worker, deadline, export_s)
    except Exception as exc:
        _log.internal_error("shutdown", exc)
    finally:
        with runtime.worker.lock:
            closing = runtime.worker.closing
            if threading.current_thread() in closing:
                closing.remove(threading.current_thread())


def _join_closing(deadline: float) -> bool:
    """Wait (until ``deadline``) for shutdowns a Ctrl-C cut short; True when none is left."""
    for closing in list(runtime.worker.closing):
        closing.join(max(0.0, deadline - time.monotonic()))
    return not any(t.is_alive() for t in list(runtime.worker.closing))
