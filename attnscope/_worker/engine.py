"""What the worker thread does with a capture, and the pipeline its spans leave through.

This is the heavy half of the worker side: importing it brings in the OpenTelemetry SDK, the
exporters (gRPC among them) and the profile parser, and building the pipeline can open a channel
(together 100 ms and more). Only the worker's own thread imports it (:mod:`.loop` does, in the
thread), so no calling thread ever pays for it, not even the first sampled call's.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from opentelemetry.trace import NoOpTracer

from .. import _log
from .. import _schema as schema
from .._config import Config
from .._derive import call as derive
from .._derive.result import Derived, Measured
from .._export import metrics, pipeline
from .._profiles import session as profile
from .._record.batches import BatchRecord
from .._record.capture import TIER_PROFILE, Capture
from .._runtime import runtime
from .._spans import emit, requests
from .._spans.calls import implementation_of, result_of, site_attributes
from .._spans.spans import SpanBuilder, is_attention_call
from .._version import __version__
from . import apportion
from .shapecache import ShapeCache, summary_key

if TYPE_CHECKING:
    from .cuda import DeviceAccess
    from .latency import Escalator

__all__ = ["Engine", "MetricsBatch"]

# At most this many built spans wait for their metrics (MetricsBatch): a bound on what is held and
# on how late a value is recorded when captures arrive faster than the worker's batches end.
_METRICS_BATCH_MAX = 1024
_IMPLS_MAX = 4096  # modules whose implementation one batch keeps
# Calls still to arrive that hold a profiled call (Engine._around): a call arrives after the calls
# nested in it, so one that never does (its capture dropped) must not be waited for forever.
_AROUND_MAX = 4096
# What a profiled call's span says of the attention that ran, told to the attention call it ran in
_RAN = tuple(a.name for a in (schema.BACKEND, schema.BACKEND_FALLBACK, schema.BACKEND_EXPECTED,
                              schema.BACKEND_REASON, schema.IMPLEMENTATION_RAN))
_PREFIX, _TOP_NAMES = schema.PREFIX, schema.KERNEL_TOP_NAMES.name


class Engine:
    """The pipeline the worker built and the span builder over it; turns captures into spans."""

    def __init__(self, cfg: Config,
                 build: Callable[[Config], pipeline.Pipeline] | None = None) -> None:
        self._cfg = cfg
        self.metrics: MetricsBatch | None = None
        # a call site's attributes, cleaned once (sites are weakly held: they live in user code)
        self._sites: weakref.WeakKeyDictionary[Any, dict[str, Any]] = weakref.WeakKeyDictionary()
        self._shapes = ShapeCache()  # derive's attributes per summary of plain values (bounded)
        self.ledger = apportion.Ledger()  # batch() blocks' calls split by row, until each ends
        # A module's configured implementation, read once per batch: the read goes through
        # transformers' config __getattribute__ (four Python calls, a tenth of a layer span's
        # build), for the same answer on every layer call of the batch. Holds the modules (by
        # id, with the module, so an id is never another's) until the batch ends.
        self._impls: dict[int, tuple[Any, str | None]] = {}
        # what every span of one shape, site, tier and rate starts with (spans.capture_attributes)
        self._bases: dict[tuple[Any, ...], Any] = {}
        # capture id -> what the profiled call nested in it found of the attention that ran
        self._around: dict[int, dict[str, Any]] = {}
        try:
            built = (build or pipeline.build)(cfg)
            recorder = metrics.recorder(cfg, built)
            self.metrics = (MetricsBatch(recorder.span, recorder.request)
                            if recorder is not None else None)
            self.builder = SpanBuilder(
                emit.for_pipeline(built, pipeline.INSTRUMENTATION_NAME, __version__),
                cfg.max_spans_per_trace, self.metrics.add if self.metrics is not None else None)
            self.pipeline = built
        except Exception as exc:  # spans go nowhere, but captures are still drained and counted
            _log.internal_error("pipeline", exc)
            self.metrics = None
            self.pipeline = pipeline.Pipeline(NoOpTracer(), None, owned=False)
            self.builder = SpanBuilder(emit.NowhereEmitter(self.pipeline.delivery),
                                       cfg.max_spans_per_trace)

    def finish(self, cap: Capture, timed_out: bool, cuda: DeviceAccess,
               escalator: Escalator) -> None:
        """Derive what the capture says, parse its profile and hand its span to the builder."""
        cap.expand()  # a traced call's summary came flat
        # derive's attributes for a summary of plain values, kept (.shapecache); else per call
        key = summary_key(cap.summary, cap.instance, cap.facts, runtime.masks,
                          not timed_out) if cap.profile is None else None
        shape = self._shapes.get(key) if key is not None else None
        derived: Derived | None = None
        if shape is None:
            derived = self._derive(cap, timed_out, cuda)
            shape = derived.attributes()
            if key is not None:  # kept: shared by every span of this summary, never written
                self._shapes.put(key, shape)
        found = Measured()
        if cap.timer is not None:
            if not timed_out:
                found.device_ns = cap.timer.elapsed_ns()
            cap.timer.release()
        if cap.memory is not None:
            found.delta_bytes = cap.memory.delta_bytes
            found.peak_bytes = cap.memory.peak_bytes
        found.host_rss_bytes = derive.host_rss_bytes()
        children: list[Any] = []
        # in force now: profile_dir and max_kernel_spans at once
        cfg = runtime.config.current or self._cfg
        if cap.profile is not None:
            # the attention calls timed inside it: their kernels are among its events
            inside = [r for r in self.builder.waiting_under(cap.capture_id)
                      if is_attention_call(r.attrs) and _TOP_NAMES not in r.attrs]
            found.profile, children, kernels = profile.finish(
                cap, cfg, derived, [(r.start_ns, r.end_ns) for r in inside])
            for r, got in zip(inside, kernels, strict=True):
                r.attrs.update({_PREFIX + k: v for k, v in got.items()})
        held = self._around.pop(cap.capture_id, None) if self._around else None
        if held is not None:  # its nested call's profiler slowed it: neither slow nor a sample
            cap.in_profile = True
        # slow? arm the site; a granted call says why
        found.trigger, found.slow_quantile = escalator.observe(
            cap, found.device_ns, cfg.slow_call_quantile,
            cfg.profile_rate > 0 and cfg.profile_max_per_minute > 0)
        found.extra = cap.grant is not None and cap.grant.extra
        result = result_of(cap, shape, found, children, self._site_attrs(cap.site),
                           self._implementation, self._bases)
        if held is not None or cap.tier == TIER_PROFILE:
            self._tell_around(cap, result.attrs, held)
        if cap.batch is not None:  # inside attnscope.batch(): the call's share of each row
            try:
                padding = self.ledger.observe(
                    cap, shape, found.device_ns if found.device_ns is not None else cap.wall_ns,
                    not timed_out)
                if padding is not None:
                    result.add_padding_fraction(padding)
            except Exception as exc:  # the call's span goes out unsplit
                _log.internal_error("apportion", exc)
        self.builder.add(result)

    def _tell_around(self, cap: Capture, attrs: dict[str, Any],
                     held: dict[str, Any] | None) -> None:
        """A call that holds a profiled call ran under the profiler too: its span says so
        (``profiled_by`` ``nested``, as ``attnscope report`` reads it), and an attention call
        whose SDPA call was profiled names the backend that ran, as a profiled one does. Its
        parent, when it arrives, holds one as well."""
        if held is not None:
            attrs[schema.PROFILED_BY.name] = "nested"
            if schema.BACKEND.name not in attrs and is_attention_call(attrs):
                attrs.update(held)
        if cap.parent_id is None:
            return
        around = self._around
        if len(around) >= _AROUND_MAX:
            del around[next(iter(around))]
        # the first profiled call a parent holds names what ran; a deeper one only marks it
        ran = {k: attrs[k] for k in _RAN if k in attrs} if held is None else {}
        around.setdefault(cap.parent_id, ran)

    def end_block(self, block: BatchRecord) -> None:
        """An ended ``batch`` block whose calls have all arrived: its request spans."""
        requests.emit_block(self.builder, block, self.ledger.take(block), self.record_request)

    def record_request(self, seconds: float, parent: Any) -> None:
        """One request's estimated attention time, in the request span's trace (exemplars)."""
        if self.metrics is not None:
            self.metrics.request(seconds, parent)

    def end_batch(self) -> None:
        """The worker has taken what had arrived: record the metrics of the spans it built."""
        self._impls.clear()  # a configuration changed meanwhile is read in the next batch
        if self.metrics is not None:
            self.metrics.drain()

    def metrics_pending(self) -> bool:
        """Spans built whose metrics are not recorded yet (``flush()`` waits for them)."""
        return self.metrics is not None and bool(self.metrics.held)

    @staticmethod
    def _derive(cap: Capture, timed_out: bool, cuda: DeviceAccess) -> Derived:
        if cap.timer is None:
            return derive.derive(cap.summary, cap.instance, facts=cap.facts)
        with cuda.reading(cap.timer.device):
            return derive.derive(cap.summary, cap.instance, device_reads=not timed_out,
                                 facts=cap.facts)

    def _implementation(self, instance: Any) -> str | None:
        """:func:`attnscope._spans.calls.implementation_of`, once per module per batch."""
        found = self._impls.get(id(instance))
        if found is None or found[0] is not instance:
            if len(self._impls) >= _IMPLS_MAX:
                self._impls.clear()
            found = self._impls[id(instance)] = (instance, implementation_of(instance))
        return found[1]

    def _site_attrs(self, site: Any) -> dict[str, Any]:
        found = self._sites.get(site)
        if found is None:
            found = self._sites[site] = site_attributes(site.attributes)
        return found


class MetricsBatch:
    """Built spans' metrics, recorded a batch at a time rather than one span at a time.

    Same values, labels and exemplar contexts, only later: at the end of the worker's batch (what
    had arrived when it woke), or once ``_METRICS_BATCH_MAX`` spans wait. Measured with
    ``benchmarks/bench_worker.py`` (worker CPU per span): interleaved with span building, the
    recorder cost 15-21 µs a span; in a run of records, 10-11 µs, 7-8 of them the SDK's
    ``Histogram.record`` (as in a tight loop) — the two long call chains most likely evicting each
    other from the CPU's caches. Never held across the worker's sleep, and ``flush()`` waits for
    what is held (:meth:`Engine.metrics_pending`).
    """

    __slots__ = ("record", "record_request", "held")

    def __init__(self, record: Callable[[Any, Any], None],
                 record_request: Callable[[float, Any], None] | None = None) -> None:
        self.record = record
        self.record_request = record_request
        self.held: list[tuple[Any, Any]] = []

    def add(self, result: Any, span_context: Any) -> None:
        held = self.held
        held.append((result, span_context))
        if len(held) >= _METRICS_BATCH_MAX:
            self.drain()

    def request(self, seconds: float, span_context: Any) -> None:
        """A request's estimated attention time: recorded at once (one per request, not per
        call)."""
        if self.record_request is not None:
            self.record_request(seconds, span_context)

    def drain(self) -> None:
        held = self.held
        if not held:
            return
        record = self.record
        try:
            for result, span_context in held:
                record(result, span_context)  # catches and logs its own errors
        finally:
            # cleared after, not before: flush() sees the batch pending until it is recorded
            held.clear()
