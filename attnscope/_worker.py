"""The background worker: a bounded queue in, spans out.

The calling thread only appends a Capture to a deque (dropping and counting when full). The worker
thread resolves device timers without blocking anyone, derives attributes, parses profiles and
builds spans. ``flush()`` and ``shutdown()`` wait at most their timeout.
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry.trace import NoOpTracer

from . import _config, _inspect, _memory, _metrics, _profile, _provider, _safety
from ._capture import Capture
from ._spans import SpanBuilder, capture_attributes
from ._timing import Resolver

__all__ = ["Worker", "submit", "flush", "shutdown", "get", "stats"]

_IDLE_WAIT_S = 0.05
_BUSY_WAIT_S = 0.002


class Worker:
    """One background thread that turns captures into spans."""

    def __init__(self, cfg: _config.Config,
                 build: Callable[[_config.Config], _provider.Pipeline] = _provider.build) -> None:
        # The real pipeline (exporter imports, gRPC channel: up to hundreds of ms) is built on the
        # worker thread, never on the calling thread of the first sampled call.
        self.pipeline = _provider.Pipeline(NoOpTracer(), None, owned=False)
        self._cfg = cfg
        self._build = build
        self.max_queue = cfg.queue_size
        self.queue: deque[Capture] = deque()
        self.dropped_ids: deque[int] = deque(maxlen=1024)
        self.submitted = 0
        self.processed = 0
        self.dropped_queue = 0
        self.worker_errors = 0
        self.builder = SpanBuilder(self.pipeline.tracer, cfg.max_spans_per_trace, None)
        self.resolver: Resolver[Capture] = Resolver(lambda cap: cap.timer)
        self._cond = threading.Condition()
        self._submit_lock = threading.Lock()
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="attnscope-worker", daemon=True)
        self.thread.start()

    # -- calling thread --------------------------------------------------------------------------
    def submit(self, cap: Capture) -> bool:
        with self._submit_lock:  # exact counts: stats promise emitted + dropped == captured
            self.submitted += 1
            if len(self.queue) < self.max_queue and not self._stop.is_set():
                self.queue.append(cap)
                return True
            self.dropped_queue += 1
        self.dropped_ids.append(cap.capture_id)
        if cap.timer is not None:
            cap.timer.release()
        return False

    # -- worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            pipeline = self._build(self._cfg)
            self.builder = SpanBuilder(pipeline.tracer, self._cfg.max_spans_per_trace,
                                       _metrics.recorder(self._cfg, pipeline))
            self.pipeline = pipeline
        except Exception as exc:  # spans go nowhere, but captures are still drained and counted
            _safety.internal_error("pipeline", exc)
        _profile.on_worker_start()  # the profiler's first-use cost lands here, not on a user's call
        while True:
            worked = self._step()
            if self._stop.is_set() and not self.queue:
                break
            if not worked:
                self._stop.wait(_BUSY_WAIT_S if len(self.resolver) else _IDLE_WAIT_S)

    def _step(self) -> bool:
        worked = False
        while self.dropped_ids:
            self.builder.parent_dropped(self.dropped_ids.popleft())
        while self.queue:
            cap = self.queue.popleft()
            worked = True
            if cap.timer is not None:
                self.resolver.add(cap)
            else:
                self._finish(cap, False)
                # Hand the GIL back after each span: a calling thread waits for at most one span's
                # work, not for the interpreter's 5 ms switch interval.
                time.sleep(0)
        if len(self.resolver):
            for cap, timed_out in self.resolver.poll():
                worked = True
                self._finish(cap, timed_out)
        self.builder.expire()
        with self._cond:
            self._cond.notify_all()
        return worked

    def _finish(self, cap: Capture, timed_out: bool) -> None:
        try:
            derived = _inspect.derive(cap.summary, cap.instance)
            cap.summary = []
            cap.instance = None
            if cap.timer is not None:
                if not timed_out:
                    derived["device_ns"] = cap.timer.elapsed_ns()
                cap.timer.release()
                cap.timer = None
            if cap.memory is not None:
                derived["memory.delta_bytes"] = cap.memory.delta_bytes
                peak = cap.memory.peak_bytes
                if peak is not None:
                    derived["memory.peak_bytes"] = peak
            rss = _memory.host_rss_bytes()
            if rss is not None:
                derived["memory.host_rss_bytes"] = rss
            children: list[Any] = []
            if cap.profile is not None:
                found, children = _profile.finish(cap)
                derived.update(found)
                cap.profile = None
            attrs = capture_attributes(cap, derived)
            self.builder.add(cap, attrs, children)
        except Exception as exc:
            self.worker_errors += 1
            _safety.internal_error("worker", exc)
        finally:
            self.processed += 1

    def wait_idle(self, deadline: float) -> bool:
        target = self.submitted
        with self._cond:
            while self.processed + self.dropped_queue < target or len(self.resolver):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.thread.is_alive():
                    return False
                self._cond.wait(min(remaining, 0.05))
        return True

    def stop(self, deadline: float) -> bool:
        done = self.wait_idle(deadline)
        self._stop.set()
        self.thread.join(max(0.0, deadline - time.monotonic()))
        if not self.thread.is_alive():
            for cap, _ in self.resolver.drain():
                self._finish(cap, True)
        return done and not self.thread.is_alive()


# ---- the process's worker ------------------------------------------------------------------------

_lock = threading.Lock()
_worker: Worker | None = None
_atexit_registered = False


def get() -> Worker | None:
    return _worker


def _start() -> Worker:
    global _worker, _atexit_registered
    with _lock:
        if _worker is None:
            _worker = Worker(_config.current())
            if not _atexit_registered:
                atexit.register(_at_exit)
                _atexit_registered = True
        return _worker


def submit(cap: Capture) -> bool:
    """Hand a capture to the worker (starting it on first use). False: dropped, queue full."""
    worker = _worker or _start()
    return worker.submit(cap)


def flush(timeout_s: float = 5.0) -> bool:
    """Process everything captured so far and flush the exporters, within ``timeout_s``."""
    deadline = time.monotonic() + max(0.0, timeout_s)
    worker = _worker
    if worker is None:
        return True
    ok = worker.wait_idle(deadline)
    remaining_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
    try:
        ok = worker.pipeline.force_flush(remaining_ms) and ok
    except Exception as exc:
        _safety.internal_error("flush", exc)
        ok = False
    return ok


def shutdown(timeout_s: float = 5.0) -> bool:
    """Flush, stop the worker and shut down a provider attnscope created. Safe to call twice."""
    global _worker
    deadline = time.monotonic() + max(0.0, timeout_s)
    with _lock:
        worker, _worker = _worker, None
    if worker is None:
        return True
    ok = worker.stop(deadline)
    try:
        remaining_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
        ok = worker.pipeline.force_flush(remaining_ms) and ok
        _shutdown_pipeline(worker.pipeline, deadline)
    except Exception as exc:
        _safety.internal_error("shutdown", exc)
        ok = False
    return ok


def _shutdown_pipeline(pipeline: _provider.Pipeline, deadline: float) -> None:
    """Provider shutdown can block on a hanging exporter: give it a thread and the remaining time."""
    t = threading.Thread(target=pipeline.shutdown, name="attnscope-shutdown", daemon=True)
    t.start()
    t.join(max(0.0, deadline - time.monotonic()))


def _at_exit() -> None:
    try:
        shutdown(timeout_s=5.0)
    except Exception:
        pass


def stats() -> dict[str, int]:
    worker = _worker
    if worker is None:
        return {}
    b = worker.builder.stats
    return {
        "captured": worker.submitted,
        "emitted": b.emitted,
        "dropped_queue_full": worker.dropped_queue,
        "dropped_trace_cap": b.dropped_trace_cap,
        "orphaned": b.orphaned,
        "pending": len(worker.queue) + len(worker.resolver) + worker.builder.pending(),
        "worker_errors": worker.worker_errors,
    }


def _after_fork_in_child() -> None:
    # The worker thread does not exist in the child; a new one starts on the next capture.
    global _worker, _lock
    _worker = None
    _lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
