"""The background worker: a bounded queue in, spans out.

The calling thread only appends a Capture to a deque (dropping and counting when full). The worker
thread resolves device timers without blocking anyone, derives attributes, parses profiles and
builds spans. It sleeps on an event while there is nothing to do, and polls (every 2 ms) only
while CUDA events are pending. Flushing and shutting it down: :mod:`.stopping`.

Light (the standard library, attnscope's state): the first sampled call creates the
:class:`Worker` and returns; its thread imports :mod:`.engine` (the SDK, exporters, profile
parser) and builds the pipeline while captures wait in the bounded queue.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from .. import _log
from .._config import Config
from .._record.batches import BatchRecord
from .._record.capture import Capture
from .._runtime import runtime
from .._runtime.retention import KEEP_TOTAL_BYTES
from . import at_exit, replays
from .control import ControlFile
from .cuda import DeviceAccess
from .latency import Escalator
from .resolve import Resolver
from .spare import Spare
from .stopping import shutdown

if TYPE_CHECKING:
    from .._export.pipeline import Pipeline
    from .._spans.spans import SpanBuilder
    from .engine import Engine

__all__ = ["Worker", "start", "stats"]

_BUSY_WAIT_S = 0.002  # poll interval while CUDA events are pending
_STASH_CHECK_S = 1.0  # children waiting for a parent: look at their age this often
# A batch gathered for up to a second is milliseconds of work: handed back every 2 ms, it kept
# a thread of the application waiting up to 2 ms at a time (bench_worker_stall.py --tier
# timing); every 0.5 ms costs no throughput that bench_model --every-call resolves.
_YIELD_EVERY_S = 0.0005
_GATHER_S = 1.0
_GATHER_SLICE_S = 0.1  # how often a gather looks at the queue's length
_HAND_BACK_S = 0.001
_MAX_DROP_NOTICES = 65_536
_MAX_ENDED_BLOCKS = 65_536  # batch() blocks waiting for their request spans
_BLOCK_WAIT_S = 10.0  # an ended block whose calls have not all arrived is emitted after this


class Worker:
    """One background thread that turns captures into spans."""

    def __init__(self, cfg: Config,
                 build: Callable[[Config], Pipeline] | None = None,
                 on_start: Callable[[Config], None] | None = None) -> None:
        self._cfg = cfg
        self._build = build  # None: export.pipeline.build, looked up on the worker thread
        self._on_start = on_start
        # The pipeline and span builder: made on the worker thread (see the module docstring).
        self.engine: Engine | None = None
        self.max_queue = cfg.queue_size
        self.queue: deque[Capture] = deque()
        self.batch: deque[Capture] = deque()  # what the worker took from the queue, in hand
        # ids of dropped captures, for their children waiting in the builder; past the bound a
        # notice would be lost (a child waiting for good), so the waiting children give up instead
        self.dropped_ids: deque[int] = deque()
        self.notices_lost = False
        # notices applied by the worker (a dropped capture's children settled), or skipped: a
        # flush waits for those of the drops before it, or the children would still be pending
        self.notices_applied = self.notices_skipped = 0
        self.submitted = 0
        self.processed = 0
        self.dropped_queue = 0
        self._drops_told = 0  # dropped_queue when the worker last said so (_tell_drops)
        self.worker_errors = 0
        # ended attnscope.batch() blocks, due their request spans (appended by calling threads)
        # (block, monotonic time the worker was told of its end)
        self.ended_blocks: deque[tuple[BatchRecord, float]] = deque()
        self.blocks_dropped = 0
        # each block's calls the worker has finished (its own count: the record is the calling
        # side's); weak, so a block whose end never came takes its entry with it
        self.blocks_seen: weakref.WeakKeyDictionary[BatchRecord, int] = weakref.WeakKeyDictionary()
        self.resolver: Resolver[Capture] = Resolver(lambda cap: cap.timer)
        self.cuda = DeviceAccess()
        self.escalator = Escalator()  # slow calls, and the trigger file (docs/live.md)
        self.control = ControlFile()
        self._cond = threading.Condition()
        self._submit_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._hurry = threading.Event()
        self._sleeping = False
        self.built = threading.Event()  # set once the engine exists (its pipeline built or failed)
        spare, runtime.worker.spare = runtime.worker.spare, None
        if isinstance(spare, Spare) and spare.take(self._run):
            self.thread = spare.thread  # started by configure(): nothing to start on this call
        else:
            self.thread = threading.Thread(target=self._run, name="attnscope-worker",
                                           daemon=True)
            self.thread.start()

    @property
    def pipeline(self) -> Pipeline:
        """The pipeline the worker built (only once :attr:`built` is set)."""
        return self._engine().pipeline

    @property
    def builder(self) -> SpanBuilder:
        """The span builder (only once :attr:`built` is set)."""
        return self._engine().builder

    def _engine(self) -> Engine:
        if self.engine is None:
            raise RuntimeError("attnscope's worker has not built its pipeline yet")
        return self.engine

    # -- calling thread --------------------------------------------------------------------------
    def submit(self, cap: Capture) -> bool:
        with self._submit_lock:  # exact counts: stats promise emitted + dropped == captured
            stopped = self._stop.is_set()
            if not stopped:
                accepted = len(self.queue) + len(self.batch) < self.max_queue
                if accepted:
                    self._put(cap)
                else:
                    if len(self.dropped_ids) < _MAX_DROP_NOTICES:
                        self.dropped_ids.append(cap.capture_id)
                    else:  # its children are given up on wholesale: as good as applied
                        self.notices_lost = True
                        self.notices_skipped += 1
                    # both counts in one statement that calls nothing: a Ctrl-C either comes
                    # before (the capture never counted) or after (counted dropped); a notice
                    # without its drop only sends children up a level, as the lost parent would
                    self.submitted, self.dropped_queue, cap.counted = (
                        self.submitted + 1, self.dropped_queue + 1, True)
        if stopped:
            # Taken for this worker just before it was replaced (configure(), shutdown()): the
            # next worker builds it, and its children already there find their parent.
            return runtime.worker.submit(cap)
        if not accepted and cap.timer is not None:
            cap.timer.release()
        # Read after the append: a worker that saw an empty queue has already said it sleeps.
        # Only the first capture after it fell asleep wakes it: waking costs this thread a
        # lock hand-over, and the worker takes whatever has arrived by the time it runs.
        if self._sleeping:
            self._sleeping = False
            self._wake.set()
        return accepted

    def _put(self, cap: Capture) -> None:
        """Queue ``cap`` and count it, both or neither (the submit lock held).

        A ``KeyboardInterrupt`` from a signal handler can come between any two lines (and after
        any call): one that cut in here left a capture counted and never queued (waited for by
        every flush, pending for ever) or queued and never counted. The worker takes captures
        the queue as a whole under the same lock, so its last item says whether the append
        happened.
        """
        queue = self.queue
        before = self.submitted
        try:
            self.submitted = before + 1
            queue.append(cap)
            cap.counted = True
        except BaseException:
            cap.counted = bool(queue) and queue[-1] is cap
            self.submitted = before + 1 if cap.counted else before
            raise

    def end_block(self, block: BatchRecord) -> None:
        """A ``batch`` block in which some call was sampled has ended (calling thread)."""
        if len(self.ended_blocks) >= _MAX_ENDED_BLOCKS:
            self.blocks_dropped += 1
            _log.warn_once("batch-blocks", "attnscope.batch: too many ended blocks wait for the "
                           "worker; their request spans are not emitted")
            return
        self.ended_blocks.append((block, time.monotonic()))
        if self._sleeping:
            self._sleeping = False
            self._wake.set()

    # -- worker thread ---------------------------------------------------------------------------
    def _run(self) -> None:
        # thread.start() returned to the calling thread only once this thread ran; left to run,
        # this thread would keep the GIL for the interpreter's switch interval (5 ms) of import
        # work while the first sampled call waits to return. Hand it straight back.
        time.sleep(_HAND_BACK_S)
        try:
            # importing the worker side and building the pipeline import modules: no fork meanwhile
            with runtime.worker.import_lock:
                from .engine import Engine

                _log.preload()  # the first line logged, often on a user's call, imports nothing
                self.engine = Engine(self._cfg, self._build)
        except Exception as exc:  # the worker side cannot load: captures are counted as errors
            _log.internal_error("worker", exc)
        finally:
            self.built.set()
        try:
            if self._on_start is not None:
                self._on_start(self._cfg)  # the profiler's first-use cost: here, not in a call
            while True:
                worked = self._step()
                if self._stop.is_set() and not self.queue:
                    break
                if not worked:
                    self._idle()
        finally:  # stopped: captures still waiting on device timers get their spans, then counts
            for cap, _ in self.resolver.drain():
                self._finish(cap, True)
            self._end_blocks(final=True)
            if self.engine is not None:
                self.engine.builder.give_up()
                self.engine.end_batch()
            runtime.masks.reset()  # the copies of recent masks go with the worker
            _retire(self)

    def _idle(self) -> None:
        if len(self.resolver):
            self._stop.wait(_BUSY_WAIT_S)
            return
        self._wake.clear()
        self._hurry.clear()  # a flush that asked earlier has been served
        self._sleeping = True
        try:
            if not self.queue and not self.dropped_ids and not self._stop.is_set():
                waiting = bool(self.ended_blocks) or (
                    self.engine is not None and bool(self.engine.builder.pending()))
                self._wake.wait(_STASH_CHECK_S if waiting else None)
        finally:
            self._sleeping = False
        if self.queue and not self._stop.is_set():
            self._gather()

    def _gather(self) -> None:
        """Woken by a capture: let more arrive before taking the GIL, up to ``_GATHER_S``. A
        program making captures back to back is interrupted once per batch, not once per
        capture, and the batch runs warm: a capture handled alone cost this thread several times
        its share of a batch of ten (its code and data cold in the CPU's caches; figures in
        docs/benchmarks.md). flush() and shutdown() cut it short, and so do a quarter-full
        queue or retention budget (a fast model sampled at every call)."""
        enough = max(1, self.max_queue // 4)
        for _ in range(max(1, round(_GATHER_S / _GATHER_SLICE_S))):
            if (self._hurry.wait(_GATHER_SLICE_S) or len(self.queue) >= enough
                    or runtime.retention.kept_bytes >= KEEP_TOTAL_BYTES // 4):
                return

    def _step(self) -> bool:
        worked = False
        cfg = runtime.config.current or self._cfg  # both read from the configuration in force now
        if cfg.live_trigger:  # once a second at most, and only when awake anyway
            trigger = self.control.poll(cfg.trigger_dir)
            if trigger is not None:
                runtime.grants.set_trigger(*trigger)
        engine = self.engine
        if self.dropped_queue != self._drops_told:
            self._tell_drops()
        while self.dropped_ids:
            notice = self.dropped_ids.popleft()
            if engine is not None:
                engine.builder.parent_dropped(notice)
            self.notices_applied += 1
        if self.notices_lost:
            self.notices_lost = False
            if engine is not None:
                engine.builder.give_up(final=False)  # parents opened early may still come
        yielded = time.perf_counter()
        if self.queue:
            # taken whole, under the submit lock (see _put), once a pass rather than per capture:
            # a lock taken per capture convoys with a calling thread that submits in a loop
            with self._submit_lock:
                self.batch, self.queue = self.queue, deque()
        batch = self.batch
        while batch:
            cap = batch.popleft()
            worked = True
            if cap.timer is not None:
                self.cuda.prepare(cap.timer.device)  # before this thread's first CUDA call
                self.resolver.add(cap)
            else:
                self._finish(cap, False)
                # Hand the GIL back now and then: a calling thread waits at most _YIELD_EVERY_S
                # of the worker's work, not the 5 ms switch interval. Not after every span: each
                # hand-over costs both threads more CPU (futex, scheduler) than a span does.
                now = time.perf_counter()
                if now - yielded > _YIELD_EVERY_S:
                    time.sleep(0)
                    yielded = now
        if len(self.resolver):
            for cap, timed_out in self.resolver.poll():
                worked = True
                self._finish(cap, timed_out)
        if self.ended_blocks:
            # asked to flush with nothing left to arrive: every ended block is due now
            self._end_blocks(final=self._hurry.is_set() and not self.queue
                             and not len(self.resolver))
        if engine is not None:
            engine.builder.expire()
            engine.end_batch()
        with self._cond:
            self._cond.notify_all()
        return worked

    def _tell_drops(self) -> None:
        """One line (at most a minute apart) while the capture queue overflows, as for the
        export queue's; said here, not by the calling thread that dropped the capture."""
        self._drops_told = dropped = self.dropped_queue
        _log.warn_once("capture-queue-full", "attnscope: the capture queue is full; sampled calls "
                       "are dropped (counted in attnscope.stats()['dropped_queue_full']). The "
                       "worker falls behind the sampled calls: lower sample_rate, or raise "
                       "queue_size", dropped=dropped, queue_size=self.max_queue)

    def _end_blocks(self, final: bool = False) -> None:
        """Request spans of the ended blocks whose calls have all arrived (or waited too long)."""
        now = time.monotonic()
        for _ in range(len(self.ended_blocks)):
            block, ended_at = ended = self.ended_blocks.popleft()
            if not (final or self.blocks_seen.get(block, 0) + block.lost >= block.sampled
                    or now - ended_at > _BLOCK_WAIT_S):
                self.ended_blocks.append(ended)
                continue
            try:
                if self.engine is not None:
                    self.engine.end_block(block)
            except Exception as exc:
                _log.internal_error("batch-end", exc)
            self.blocks_seen.pop(block, None)

    def _finish(self, cap: Capture, timed_out: bool) -> None:
        try:
            if self.engine is None:
                if cap.timer is not None:
                    cap.timer.release()
                raise RuntimeError("attnscope's worker side could not be loaded")
            if cap.replay is None:
                self.engine.finish(cap, timed_out, self.cuda, self.escalator)
            else:  # a CUDA graph replay: its span, and one per call captured into the graph
                made = replays.finish(self.engine, cap, timed_out, self.cuda, self.escalator)
                with self._submit_lock:  # stats: captured == emitted + lost, children included
                    self.submitted, self.processed = self.submitted + made, self.processed + made
        except Exception as exc:
            self.worker_errors += 1
            _log.internal_error("worker", exc)
        finally:
            runtime.retention.give(cap.kept_bytes)  # its tensors are let go with it
            self.processed += 1
            if cap.batch is not None:
                self.blocks_seen[cap.batch] = self.blocks_seen.get(cap.batch, 0) + 1

    def drop_counts(self) -> dict[str, int]:
        """Spans lost so far, by reason (read by the metrics callbacks)."""
        engine = self.engine
        delivery = engine.pipeline.delivery if engine is not None else runtime.delivery
        return {
            "queue_full": self.dropped_queue,
            "trace_cap": engine.builder.stats.dropped_trace_cap if engine is not None else 0,
            "export_failed": delivery.export_failed,
            "export_queue_full": delivery.export_queue_full + delivery.no_pipeline,
        }

    def counts(self) -> dict[str, int]:
        """This worker's counters of :func:`attnscope.stats` (the export counts are the
        process's: ``runtime.delivery``)."""
        engine = self.engine
        with self._submit_lock:  # the two a submit changes together, read together
            captured, dropped = self.submitted, self.dropped_queue
        # queued, waiting on a device timer, or being built (taken from the queue, not yet
        # counted processed): what a reader on another thread would otherwise find nowhere
        unfinished = max(0, captured - dropped - self.processed)
        emitted = trace_cap = orphaned = building = errors = 0
        if engine is not None:
            b = engine.builder.stats
            emitted, trace_cap, orphaned, errors = (b.emitted, b.dropped_trace_cap, b.orphaned,
                                                    b.errors)
            building = engine.builder.pending()
        return {
            "captured": captured,
            "emitted": emitted,
            "dropped_queue_full": dropped,
            "dropped_trace_cap": trace_cap,
            "orphaned": orphaned,
            "pending": unfinished + building,
            "worker_errors": self.worker_errors + errors,
        }

    def wait_idle(self, deadline: float) -> bool:
        # no submit lock: a flush() in a signal handler may have interrupted submit() holding it
        target, drops = self.submitted, self.dropped_queue
        with self._cond:
            while (self.processed + self.dropped_queue < target or len(self.resolver)
                   or self.ended_blocks or self.notices_applied + self.notices_skipped < drops
                   or (self.engine is not None and self.engine.metrics_pending())):
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self.thread.is_alive():
                    return False
                self._hurry.set()
                self._wake.set()
                self._cond.wait(min(remaining, 0.05))
        return True

    @property
    def stopping(self) -> bool:
        """Told to stop: it takes no more captures and its thread ends once its queue is done."""
        return self._stop.is_set()

    def stop(self, deadline: float) -> bool:
        done = self.wait_idle(deadline)
        with self._submit_lock:  # a capture is either queued before the stop or dropped, counted
            self._stop.set()
        self._hurry.set()
        self._wake.set()
        self.thread.join(max(0.0, deadline - time.monotonic()))
        return done and not self.thread.is_alive()


# ---- the process's worker ------------------------------------------------------------------------


def start(cfg: Config, on_start: Callable[[Config], None] | None = None) -> Worker | None:
    """The process's worker, started now if there is none; None once the process is exiting.

    Exiting: the main thread has returned or the exit flush has begun. A worker started then (a
    daemon thread still tracing) could not build its pipeline, as ``concurrent.futures`` refuses
    work by then: its captures are dropped and counted nowhere.
    """
    with runtime.worker.lock:
        if runtime.worker.current is None:
            if runtime.worker.exiting or not threading.main_thread().is_alive():
                return None
            runtime.worker.current = Worker(cfg, on_start=on_start)
            if not runtime.worker.atexit_registered:
                at_exit.register(shutdown)
                runtime.worker.atexit_registered = True
        worker: Worker = runtime.worker.current
        return worker


def _retire(worker: Worker) -> None:
    """A worker's thread has ended: its counts join the totals of every earlier worker."""
    counts = worker.counts()
    with runtime.worker.lock:
        if worker in runtime.worker.retiring:
            runtime.worker.retiring.remove(worker)
        for key, value in counts.items():
            if key != "pending":
                retired = runtime.worker.retired_counts
                retired[key] = retired.get(key, 0) + value


def stats() -> dict[str, int]:
    """Counts over every worker of this process: every key of ``COUNT_KEYS``."""
    return runtime.span_counts()
