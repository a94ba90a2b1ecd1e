"""Spans captured before the interpreter exits are exported, within a bound.

``shutdown`` is :func:`attnscope._worker.stopping.shutdown`, passed in by the loop when it starts
the first worker (this module does not import the loop).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from .._runtime import runtime

__all__ = ["register", "exit_exporting", "export_window"]

# Exit waits for attnscope at most _EXIT_TIMEOUT_S in all (building the pipeline if not built yet,
# turning captures into spans, writing a file exporter's file: local work) and, of that, at most
# _EXIT_EXPORT_S on exporters that send over the network. An OTLP endpoint where nothing listens
# for certain (tried once more at exit: refused, or no such host or network; a connection that
# has not answered within _EXIT_PROBE_S is given the usual wait) gets only _EXIT_REFUSED_S: the
# exporter would retry there until the time ran out, and the spans are lost either way (issue 38
# §1). Not 0: the metrics' flush collects its callbacks within the window, and 0 fails it.
_EXIT_TIMEOUT_S = 5.0
_EXIT_EXPORT_S = 2.0
_EXIT_PROBE_S = 0.2
_EXIT_REFUSED_S = 0.2


def register(shutdown: Callable[..., bool]) -> None:
    """Export at exit: the pipeline built while the interpreter still accepts work, then flushed.

    ``atexit`` handlers run after ``threading._shutdown()``, which has already run
    ``concurrent.futures``' own exit hook: from then on no executor accepts work, and the
    OpenTelemetry SDK's resource detection (``Resource.create``, part of building the pipeline)
    submits to one. A worker still building its pipeline then lost every span. So
    :func:`_before_threads_join` goes where ``concurrent.futures`` puts its own hook,
    ``threading._register_atexit`` (CPython 3.9+; hooks run in reverse order of registration,
    before non-daemon threads are joined), and waits for the build; ``concurrent.futures.thread`` is
    imported first so that its hook runs after ours. The flush stays in ``atexit``
    (:func:`_at_exit`): spans of non-daemon threads running after the main thread are exported.
    """
    import concurrent.futures.thread  # noqa: F401  (registers its exit hook now, before ours)

    runtime.worker.exit_flush = shutdown  # for a forked child's os._exit (exit_exporting)

    register = getattr(threading, "_register_atexit", None)
    if register is not None:
        try:
            register(_before_threads_join)
        except Exception:  # RuntimeError: threading's shutdown has begun
            pass
    atexit.register(_at_exit, shutdown)


def _before_threads_join() -> None:
    """Wait (bounded) until the worker has built its pipeline; never raises (a hook of threading's
    shutdown that raised would skip the hooks after it and the joining of threads)."""
    try:
        worker = runtime.worker.current
        if worker is not None:
            started = time.monotonic()
            worker.built.wait(_EXIT_TIMEOUT_S)
            runtime.worker.exit_wait_s = time.monotonic() - started
    except BaseException:
        pass


def _at_exit(shutdown: Callable[..., bool]) -> None:
    """Export what was captured, within what is left of ``_EXIT_TIMEOUT_S``; never raises. No
    worker starts after this (a daemon thread still tracing): it could not build a pipeline."""
    runtime.worker.exiting = True
    try:
        _export_at_exit(shutdown)
    finally:
        try:
            runtime.worker.exit_done.set()  # a multiprocessing child's SIGTERM waits for this
        except BaseException:  # noqa: BLE001  (a Ctrl-C: the process ends regardless)
            pass


def _export_at_exit(shutdown: Callable[..., bool]) -> None:
    worker = None
    try:
        worker = runtime.worker.current
        pipeline = worker.engine.pipeline if worker is not None and worker.engine is not None \
            else None
        shutdown(timeout_s=max(0.0, _EXIT_TIMEOUT_S - runtime.worker.exit_wait_s),
                 export_s=export_window(pipeline))
    except BaseException:  # a second Ctrl-C included: exit goes on, after its line below
        pass
    try:
        if worker is not None and worker.engine is not None:  # spans lost at exit: one line
            from .._export.pipeline import report_undelivered

            report_undelivered(worker.engine.pipeline, unbuilt=runtime.span_counts()["pending"])
    except BaseException:  # noqa: BLE001  (a third Ctrl-C: the process ends regardless)
        pass


def export_window(pipeline: Any) -> float | None:
    """How long exit waits on the exporters: None (no limit but the exit's) for a file, the
    console or nowhere; ``_EXIT_REFUSED_S`` for an OTLP endpoint that refuses connections now;
    else ``_EXIT_EXPORT_S``. Never raises."""
    try:
        if pipeline is not None and pipeline.local:
            return None  # a file: no collector to wait on
        from .._export import otlp_status

        endpoint = otlp_status.endpoint_of(getattr(pipeline, "exporter", None))
        if endpoint is not None and otlp_status.refused(endpoint, _EXIT_PROBE_S):
            # said now, not by the export thread after exit's own line about the spans
            # (export.pipeline.report_undelivered stays quiet once this is said)
            otlp_status.report_unreachable(endpoint)
            return _EXIT_REFUSED_S
    except Exception:  # noqa: BLE001  (unsure: the usual wait)
        pass
    return _EXIT_EXPORT_S


# A forked child's os._exit: exported first. -------------------------------------------------------


def exit_exporting() -> None:
    """In a forked child (``os.register_at_fork``): ``os._exit`` exports what the child captured
    before it ends the process, within the exit flush's bound (``_EXIT_TIMEOUT_S``, of it at
    most ``_EXIT_EXPORT_S`` on a collector). Never raises.

    ``os._exit`` runs no ``atexit`` handler, and forked children end with it: ``multiprocessing``'s
    ``fork`` children once their target returns, pre-forking servers' workers, daemonising code.
    Their spans were lost in no count (the counts die with the process: 60 of 100 in issue 35
    §18). The program called ``os._exit`` to skip the interpreter's clean-up, so nothing else of
    it runs: a child that captured nothing (no worker) exits at once, as it would without
    attnscope, and one that did waits for its own spans only. What the child still could not
    deliver (a collector that is down) gets the exit's line on stderr; counts cannot outlive it.
    """
    try:
        real = os._exit
        if getattr(real, "_attnscope", False):  # a child of a child: already in place
            return

        def _exit(status: int) -> NoReturn:
            """``os._exit``, after attnscope exported this process's spans (bounded)."""
            try:
                shutdown = runtime.worker.exit_flush
                if (shutdown is not None and runtime.worker.current is not None
                        and not runtime.worker.exiting):
                    _at_exit(shutdown)
            except BaseException:  # noqa: BLE001  (the process ends whatever happened)
                pass
            real(status)

        _exit._attnscope = True  # type: ignore[attr-defined]
        os._exit = _exit
    except Exception:  # noqa: BLE001  (a child must start whatever happens here)
        pass


if hasattr(os, "register_at_fork"):  # after the runtime's handler: the child's state is fresh
    os.register_at_fork(after_in_child=exit_exporting)
