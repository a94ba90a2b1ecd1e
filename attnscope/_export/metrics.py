"""OpenTelemetry metrics, recorded on the worker for every emitted span.

Instruments (see docs/exporting.md):

- ``attnscope.attention.duration`` histogram, seconds (device time when measured, else wall),
  explicit buckets from 10 µs to 10 s; not of calls the profiler ran over;
- ``attnscope.attention.tokens`` observable counter (summed on the worker, read at collection),
  tokens of sampled calls divided by their sample rate;
- ``attnscope.memory.peak`` histogram, bytes;
- ``attnscope.spans.dropped`` (by ``reason``), ``attnscope.profiles.skipped`` and
  ``attnscope.internal_errors``: observable counters read from attnscope's own counts;
- ``attnscope.sampling.effective_rate`` (by ``tier``) and ``attnscope.overhead.ratio``:
  observable gauges;
- ``gen_ai.server.time_to_first_token`` and ``gen_ai.server.time_per_output_token`` histograms,
  seconds, the GenAI semantic conventions' buckets: one point per ``generate()`` call whose first
  forward was sampled (:class:`_FirstToken`), by ``gen_ai.operation.name`` and
  ``gen_ai.request.model``.

The first three carry ``attnscope.module_class`` (the span name where there is no module) /
``attnscope.backend`` / ``attnscope.device`` / ``attnscope.phase`` when the span has them.

The two histograms are recorded in the context of the span just emitted, so a meter provider with
exemplars (the SDK's default ``trace_based`` filter, ``OTEL_METRICS_EXEMPLAR_FILTER``) keeps, per
bucket, the trace and span id of a sampled call: a p99 bucket links to its trace.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple, TypeGuard

from opentelemetry import trace as otel_trace
from opentelemetry.context import Context
from opentelemetry.trace import NonRecordingSpan

from .. import _log
from .. import _schema as schema
from .._config import Config
from .._runtime import runtime
from .._version import __version__
from .destinations import meter_provider_for

__all__ = ["DURATION_BUCKETS_S", "FRACTION_BUCKETS", "MEMORY_BUCKETS_BYTES", "TPOT_BUCKETS_S",
           "TTFT_BUCKETS_S", "Recorder", "recorder"]

DURATION_BUCKETS_S = (
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)
MEMORY_BUCKETS_BYTES = tuple(float(4**k) for k in range(8, 19))  # 64 KiB .. 64 GiB
# A fraction of the roof: fine steps near the top, where tuning happens; >1 is possible (the
# bytes are a minimum only for the memory roof's side, and user-configured peaks may be low).
FRACTION_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0)
# The GenAI semantic conventions' advised boundaries (docs/attributes.md names the version).
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                  5.0, 7.5, 10.0)
TPOT_BUCKETS_S = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
_FRACTION = schema.ROOFLINE_FRACTION.name
_FALLBACK = schema.BACKEND_FALLBACK.name
# Low-cardinality labels only: the module class, not its path (one series per layer would
# multiply every histogram by the depth of the model); spans carry the path.
_DEVICE_NS, _WALL_NS, _TOKENS = schema.DEVICE_NS.name, schema.WALL_NS.name, schema.TOKENS.name
_SAMPLE_RATE, _PEAK_BYTES = schema.SAMPLE_RATE.name, schema.PEAK_BYTES.name
_MODULE_CLASS = schema.MODULE_CLASS.name
_RECOMPUTE = schema.RECOMPUTE.name
_TIER, _PROFILED_BY = schema.TIER.name, schema.PROFILED_BY.name
_OPERATION, _REQUEST_MODEL = schema.OPERATION_NAME.name, schema.REQUEST_MODEL.name
_MODULE, _BATCH, _KV_CACHE_LEN = (schema.MODULE.name, schema.BATCH_SIZE.name,
                                  schema.KV_CACHE_LEN.name)
_OUTPUT_TOKENS = schema.OUTPUT_TOKENS.name
TEXT_COMPLETION = schema.TEXT_COMPLETION
_LABELS = tuple(a.name for a in (schema.MODULE_CLASS, schema.BACKEND, schema.DEVICE, schema.PHASE))


# ---- instruments ---------------------------------------------------------------------------------


def _total(key: str, source: Any, value: int) -> int:
    """Process-lifetime total of a count that restarts (:meth:`MetricTotals.add`)."""
    return runtime.metrics.add(key, source, value)


def _current_total(key: str) -> int:
    return runtime.metrics.current(key)


# Label combinations of the token total kept per meter provider (the labels are low-cardinality;
# this bounds the table if an application's span names are not).
_MAX_TOKEN_SERIES = 2048
_DROP_REASONS = ("queue_full", "trace_cap", "export_failed", "export_queue_full")


def _observe_dropped(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    try:
        worker = runtime.worker.current
        counts: dict[str, int] = worker.drop_counts() if worker is not None else {}
        out = []
        for reason in _DROP_REASONS:
            key = "dropped:" + reason
            value = _total(key, worker, counts[reason]) if worker is not None else \
                _current_total(key)
            out.append(Observation(value, {"reason": reason}))
        return out
    except Exception as exc:
        _log.internal_error("metrics.observe", exc)
        return []


def _observe_profiles_skipped(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    try:
        with runtime.profiler.lock:
            skips = {key[len("skipped_"):]: value for key, value in runtime.profiler.counts.items()
                     if key.startswith("skipped_")}
        return [Observation(_total("profiles_skipped:" + reason, runtime.profiler, value),
                            {"reason": reason})
                for reason, value in sorted(skips.items())]
    except Exception as exc:
        _log.internal_error("metrics.observe", exc)
        return []


def _observe_internal_errors(options: Any) -> Iterable[Any]:
    from opentelemetry.metrics import Observation

    try:
        return [Observation(_total("internal_errors", runtime, _log.error_count()))]
    except Exception:
        return []


def _observe_sampling(options: Any) -> Iterable[Any]:
    """The effective (budget-scaled) sample and profile rates, by tier."""
    from opentelemetry.metrics import Observation

    try:
        s = runtime.sampler
        return [Observation(s.effective_rate, {"tier": "timing"}),
                Observation(s.effective_profile_rate, {"tier": "profile"})]
    except Exception as exc:
        _log.internal_error("metrics.observe", exc)
        return []


def _observe_overhead(options: Any) -> Iterable[Any]:
    """attnscope's measured calling-thread cost over the wrapped calls' time (last window)."""
    from opentelemetry.metrics import Observation

    try:
        return [Observation(runtime.sampler.budget.last_ratio)]
    except Exception as exc:
        _log.internal_error("metrics.observe", exc)
        return []


def _histogram(meter: Any, metric: schema.Metric, buckets: Iterable[float]) -> Any:
    """One of attnscope's histograms, named, united and described by the schema."""
    return meter.create_histogram(metric.name, unit=metric.unit, description=metric.brief,
                                  explicit_bucket_boundaries_advisory=list(buckets))


class _Instruments:
    """The instruments on one meter provider; :meth:`record` runs on the worker per span."""

    def __init__(self, meter_provider: Any) -> None:
        meter = meter_provider.get_meter("attnscope", __version__)
        self.duration = _histogram(meter, schema.ATTENTION_DURATION, DURATION_BUCKETS_S)
        # Token totals are summed here and read when metrics are collected: a synchronous
        # counter's add() costs the worker as much per span as the histogram record does.
        # Written by the worker thread only; the reader's callback takes a snapshot.
        self._token_totals: dict[tuple[tuple[str, str], ...], float] = {}
        # fallbacks counted the same way, per series (a profiled call's verdict: rare, exact)
        self._fallback_totals: dict[tuple[tuple[str, str], ...], int] = {}
        self._labels: dict[tuple[Any, ...], _Labels] = {}  # see _labels_of
        meter.create_observable_counter(
            schema.ATTENTION_TOKENS.name, callbacks=[self._observe_tokens],
            unit=schema.ATTENTION_TOKENS.unit, description=schema.ATTENTION_TOKENS.brief,
        )
        meter.create_observable_counter(
            schema.BACKEND_FALLBACKS.name, callbacks=[self._observe_fallbacks],
            unit=schema.BACKEND_FALLBACKS.unit, description=schema.BACKEND_FALLBACKS.brief,
        )
        self.memory_peak = _histogram(meter, schema.MEMORY_PEAK, MEMORY_BUCKETS_BYTES)
        self.roofline_fraction = _histogram(meter, schema.ROOFLINE_FRACTION_METRIC,
                                            FRACTION_BUCKETS)
        self.first_token = _FirstToken(meter)
        self.request_duration = _histogram(meter, schema.REQUEST_ATTENTION_DURATION,
                                           DURATION_BUCKETS_S)
        # The context argument (exemplars) exists from opentelemetry-api 1.28 on.
        self._with_context = _takes_context(self.duration.record)
        for create, metric, callback in (
            (meter.create_observable_counter, schema.SPANS_DROPPED, _observe_dropped),
            (meter.create_observable_counter, schema.PROFILES_SKIPPED, _observe_profiles_skipped),
            (meter.create_observable_counter, schema.INTERNAL_ERRORS, _observe_internal_errors),
            (meter.create_observable_gauge, schema.EFFECTIVE_RATE, _observe_sampling),
            (meter.create_observable_gauge, schema.OVERHEAD_RATIO, _observe_overhead),
        ):
            create(metric.name, callbacks=[callback], unit=metric.unit, description=metric.brief)

    def record_request(self, seconds: float, span_context: Any = None) -> None:
        """One ``attnscope.request`` span's estimated attention time, with its exemplar."""
        try:
            if span_context is not None and self._with_context and span_context.trace_flags.sampled:
                ctx = otel_trace.set_span_in_context(NonRecordingSpan(span_context), _EMPTY)
                self.request_duration.record(seconds, context=ctx)
            else:
                self.request_duration.record(seconds)
        except Exception as exc:
            _log.internal_error("metrics", exc)

    def _observe_tokens(self, options: Any) -> Iterable[Any]:
        return _observations(self._token_totals)

    def _observe_fallbacks(self, options: Any) -> Iterable[Any]:
        return _observations(self._fallback_totals)

    def record(self, result: Any, span_context: Any = None) -> None:
        """Record one built span (a ``worker.spans.Result``): its name and attributes.
        ``span_context``: the span's own, for exemplars (when sampled)."""
        try:
            ctx = None
            if span_context is not None and self._with_context and span_context.trace_flags.sampled:
                ctx = otel_trace.set_span_in_context(NonRecordingSpan(span_context), _EMPTY)
            attrs: dict[str, Any] = result.attrs
            labels, series = self._labels_of(attrs, getattr(result, "name", None))
            device_ns = attrs.get(_DEVICE_NS)
            wall_ns = attrs.get(_WALL_NS)
            ns = device_ns if _positive_int(device_ns) else wall_ns
            # not a call the profiler ran over (profiled, or inside or around a profiled call):
            # it slowed the call (5x for a prefill layer on CPU), and the grants after a slow call
            # profile a slow site's calls most, so its points would sit in the tail being watched
            if _count(ns) and attrs.get(_TIER) != "profile" and _PROFILED_BY not in attrs:
                if ctx is None:
                    self.duration.record(ns / 1e9, labels)
                else:
                    self.duration.record(ns / 1e9, labels, context=ctx)
            tokens = attrs.get(_TOKENS)
            # a forward recomputed in backward (checkpointing) passes no token through again
            if _count(tokens) and tokens > 0 and attrs.get(_RECOMPUTE) is not True:
                rate = attrs.get(_SAMPLE_RATE)
                weight = 1.0 / rate if isinstance(rate, float) and 0.0 < rate <= 1.0 else 1.0
                totals = self._token_totals
                if series in totals or len(totals) < _MAX_TOKEN_SERIES:
                    totals[series] = totals.get(series, 0.0) + tokens * weight
            peak = attrs.get(_PEAK_BYTES)
            if _count(peak):
                if ctx is None:
                    self.memory_peak.record(peak, labels)
                else:
                    self.memory_peak.record(peak, labels, context=ctx)
            fraction = attrs.get(_FRACTION)
            if isinstance(fraction, float):  # only where the span has a roofline
                self.roofline_fraction.record(fraction, labels)
            # a profiled call's own verdict: the calls around or inside it that carry it too
            # (``profiled_by``) would count the one SDPA call again
            if attrs.get(_FALLBACK) is True and attrs.get(_TIER) == "profile":
                falls = self._fallback_totals
                if series in falls or len(falls) < _MAX_TOKEN_SERIES:
                    falls[series] = falls.get(series, 0) + 1
            first_token = self.first_token
            if first_token.open or attrs.get(_OPERATION) == TEXT_COMPLETION:
                first_token.see(result, attrs, ctx)
        except Exception as exc:
            _log.internal_error("metrics", exc)

    def _labels_of(self, attrs: dict[str, Any], name: Any) -> _Labels:
        """A span's labels and their token series, kept per combination of the values they are
        read from (bounded; the dicts are the instruments' to read, never changed)."""
        get = attrs.get
        key = (*map(get, _LABELS), get(_RECOMPUTE), name)
        kept = self._labels
        try:
            found = kept.get(key)
        except TypeError:  # an unhashable value (a list: never a label), read each time
            return _labels(attrs, name)
        if found is None:
            found = kept[key] = _labels(attrs, name)
            if len(kept) > _MAX_LABEL_SETS:
                try:  # a retiring worker may record on the same instruments for a moment
                    kept.pop(next(iter(kept)), None)
                except (RuntimeError, StopIteration):
                    pass
        return found


class _Generation(NamedTuple):
    """A recorded ``generate()`` span, waiting for its first forward's span (built after it)."""

    start_ns: int
    end_ns: int
    module: Any  # the model's attnscope.module: its forwards carry the same
    single: bool  # one sequence: its output tokens are the tokens made one after another
    output_tokens: Any
    labels: dict[str, str]
    ctx: Any


class _FirstToken:
    """``gen_ai.server.time_to_first_token`` and ``time_per_output_token``, measured from spans.

    A ``generate()`` span is built before the spans nested in it, so it waits here (bounded) for
    its model's first forward: the one that found the KV cache empty (``kv_cache_len`` 0), whose
    logits give the first token. Time to first token = that forward's end (on CUDA, its start plus
    its device time when that is later: the forward returns before its kernels finish) minus the
    generate span's start; time per output token = the rest of the generate span over the output
    tokens after the first, for one sequence only (a batch's rows end at different steps, which
    one span's end cannot tell). A call whose first forward was not sampled, that failed, or that
    ran without a cache records nothing: no figure is made up.
    """

    def __init__(self, meter: Any) -> None:
        self.ttft = _histogram(meter, schema.TIME_TO_FIRST_TOKEN, TTFT_BUCKETS_S)
        self.tpot = _histogram(meter, schema.TIME_PER_OUTPUT_TOKEN, TPOT_BUCKETS_S)
        # capture id of a generate() span -> what its figures need (oldest dropped first)
        self.open: OrderedDict[int, _Generation] = OrderedDict()

    def see(self, result: Any, attrs: dict[str, Any], ctx: Any) -> None:
        """A built span: a generate() call to wait on, or a forward nested in one."""
        if attrs.get(_OPERATION) == TEXT_COMPLETION:
            capture_id = getattr(result, "capture_id", None)
            if capture_id is None or getattr(result, "error", None) is not None:
                return  # the conventions' figures are of successful responses
            labels = {_OPERATION: TEXT_COMPLETION}
            model = attrs.get(_REQUEST_MODEL)
            if isinstance(model, str) and model:
                labels[_REQUEST_MODEL] = model
            self.open[capture_id] = _Generation(
                result.start_ns, result.end_ns, attrs.get(_MODULE), attrs.get(_BATCH) == 1,
                attrs.get(_OUTPUT_TOKENS), labels, ctx)
            if len(self.open) > _MAX_OPEN_GENERATIONS:
                self.open.popitem(last=False)
            return
        parent = getattr(result, "parent_id", None)
        if not isinstance(parent, int):
            return
        gen = self.open.get(parent)
        if gen is None or attrs.get(_MODULE) != gen.module or attrs.get(_KV_CACHE_LEN) != 0:
            return  # not this model's first forward (or not under a generate() call)
        del self.open[parent]
        if getattr(result, "error", None) is not None:
            return
        first = result.end_ns
        device_ns = attrs.get(_DEVICE_NS)
        if _positive_int(device_ns):
            first = max(first, result.start_ns + device_ns)
        if not gen.start_ns <= first <= gen.end_ns:
            return  # clocks that do not nest: nothing to measure
        self._record(self.ttft, (first - gen.start_ns) / 1e9, gen)
        after = gen.output_tokens
        if gen.single and attrs.get(_BATCH) == 1 and _count(after) and after >= 2:
            self._record(self.tpot, (gen.end_ns - first) / 1e9 / (after - 1), gen)

    @staticmethod
    def _record(histogram: Any, value: float, gen: _Generation) -> None:
        if gen.ctx is None:
            histogram.record(value, gen.labels)
        else:
            histogram.record(value, gen.labels, context=gen.ctx)


# generate() calls waiting for their first forward's span: it is built right after theirs
_MAX_OPEN_GENERATIONS = 64


def _observations(totals: Mapping[tuple[tuple[str, str], ...], float]) -> list[Any]:
    """A snapshot of per-series totals (written by the worker) as the reader's observations."""
    from opentelemetry.metrics import Observation

    try:
        return [Observation(total, dict(key)) for key, total in list(totals.items())]
    except Exception as exc:
        _log.internal_error("metrics.observe", exc)
        return []


_Labels = tuple[dict[str, str], tuple[tuple[str, str], ...]]
_MAX_LABEL_SETS = 256


def _labels(attrs: dict[str, Any], name: Any) -> _Labels:
    labels: dict[str, str] = {}
    for key in _LABELS:
        value = attrs.get(key)
        if isinstance(value, str) and value:
            labels[key] = value
    if attrs.get(_RECOMPUTE) is True:  # its latency apart from the forward's own
        labels[_RECOMPUTE] = "true"
    if _MODULE_CLASS not in labels and name:
        labels[_MODULE_CLASS] = str(name)[:128]
    return labels, tuple(sorted(labels.items()))


_EMPTY = Context()


def _takes_context(record: Callable[..., Any]) -> bool:
    try:
        return "context" in inspect.signature(record).parameters
    except (TypeError, ValueError):
        return False


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _count(value: Any) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _instruments_for(meter_provider: Any) -> _Instruments:
    """One set of instruments per provider: a restarted worker reuses them (no duplicates)."""
    with runtime.metrics.lock:
        try:
            found: _Instruments | None = runtime.metrics.instruments.get(meter_provider)
        except TypeError:  # not weak-referenceable: build each time
            return _Instruments(meter_provider)
        if found is None:
            found = runtime.metrics.instruments[meter_provider] = _Instruments(meter_provider)
        return found


class Recorder(NamedTuple):
    """What the worker records metrics with: ``span(result, span_context)`` per built span,
    ``request(seconds, span_context)`` per request span (both catch and log their own errors)."""

    span: Callable[[Any, Any], None]
    request: Callable[[float, Any], None]


def recorder(cfg: Config, pipeline: Any = None) -> Recorder | None:
    """What records built spans' and request spans' metrics; None when metrics are off.

    ``pipeline`` (an ``export.pipeline.Pipeline``) supplies the meter provider it resolved, which it
    also flushes and shuts down. Without one, only ``meter_provider=`` or the app's global SDK
    provider is used: a provider nobody would shut down is never created here.
    """
    if not cfg.metrics:
        return None
    try:
        if pipeline is not None:
            meter_provider = pipeline.meter_provider
        else:
            meter_provider, _, _ = meter_provider_for(cfg, None, None, own=False)
        if meter_provider is None:
            return None
        instruments = _instruments_for(meter_provider)
        return Recorder(instruments.record, instruments.record_request)
    except Exception as exc:
        _log.internal_error("metrics", exc)
        return None
