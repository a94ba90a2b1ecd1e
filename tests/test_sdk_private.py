"""attnscope reads no private field of the OpenTelemetry SDK or its exporters, but for the batch
processor's queue and the readers of a meter provider the application made (issue 39, item 5);
what it reads instead decides exactly as before."""

from __future__ import annotations

import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_OFF,
    ALWAYS_ON,
    DEFAULT_OFF,
    DEFAULT_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
    StaticSampler,
    TraceIdRatioBased,
)
from opentelemetry.trace import (
    INVALID_SPAN_CONTEXT,
    Link,
    SpanContext,
    SpanKind,
    TraceFlags,
    TraceState,
)
from opentelemetry.util.types import Attributes

from attnscope._spans import emit

ROOT = Path(__file__).resolve().parents[1]

# ---- the source: no private field read again ------------------------------------------------

# The fields item 5 replaced (the SDK's samplers, MeterProvider, OTLP exporters): read as an
# attribute (``x._root``) or by name (``getattr(x, "_root")``), anywhere in attnscope.
_REPLACED = ("_decision", "_root", "_remote_parent_sampled", "_remote_parent_not_sampled",
             "_local_parent_sampled", "_local_parent_not_sampled", "_metric_readers",
             "_endpoint", "_preferred_temporality", "_preferred_aggregation")
_READ = re.compile(r"""(?:\.|["'])(""" + "|".join(_REPLACED) + r""")\b""")

# Every private name attnscope still reads by name in a module that talks to OpenTelemetry, and
# why. The batch processor's queue (item 5, design point 1: replacing it is its own change);
# the SDK's header pattern (a module constant, read with a fallback of our own).
_ALLOWED = {
    ("attnscope/_export/pipeline.py", "_batch_processor"),  # the BSP's queue, to count it
    ("attnscope/_export/pipeline.py", "_queue"),
    ("attnscope/_export/pipeline.py", "_shutdown"),  # a span ended after shutdown is dropped
    ("attnscope/_export/pipeline.py", "_metric_readers"),  # the application's provider only
    ("attnscope/_export/otel_env.py", "_LIBERAL_HEADER_PATTERN"),
    ("attnscope/_export/otlp_status.py", "_endpoint"),  # an exporter the application made only
    # the API's current-context ContextVar, read straight on a sampled call when the runtime
    # context is the default one (else get_current()): tests/test_sampling_context.py
    ("attnscope/_capture/sampling.py", "_RUNTIME_CONTEXT"),
    ("attnscope/_capture/sampling.py", "_current_context"),
}
_BY_NAME = re.compile(r"""\b(?:getattr|hasattr)\(\s*[^,()]+(?:\([^()]*\))?\s*,\s*"""
                      r"""["'](_[A-Za-z]\w*)["']""")


def _sources() -> list[Path]:
    return sorted((ROOT / "attnscope").rglob("*.py"))


# The reads of them left, and why, both for objects the application made (attnscope knows its
# own): the readers of its meter provider have no public list, and flushing that provider whole
# would collect its pull readers too (tests/test_exemplars.py: an in-memory reader's exemplars
# spent); its OTLP exporter keeps its URL only privately, and the lines about it name the URL.
_STILL_READ = ["attnscope/_export/otlp_status.py: "
               'endpoint = getattr(exporter, "_endpoint", None)',
               "attnscope/_export/pipeline.py: "
               'readers = getattr(meter_provider, "_metric_readers", None)']


def test_no_replaced_sdk_field_is_read() -> None:
    found = [f"{path.relative_to(ROOT)}: {line.strip()}"
             for path in _sources()
             for line in path.read_text(encoding="utf-8").splitlines()
             if _READ.search(line.split("#", 1)[0])]
    assert found == _STILL_READ


def test_private_names_read_near_opentelemetry_are_the_allowed_ones() -> None:
    found = set()
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        if "opentelemetry" in text:
            found |= {(str(path.relative_to(ROOT)), m.group(1)) for m in _BY_NAME.finditer(text)}
    assert found == _ALLOWED


def test_the_scans_see_what_they_look_for() -> None:
    """The patterns match the reads item 5 removed (a scan that matches nothing proves nothing)."""
    removed = ['decision = getattr(s, "_decision", None)',
               'readers = getattr(meter_provider, "_metric_readers", None)',
               'endpoint = getattr(exporter, "_endpoint", None)',
               'preferred_temporality=getattr(inner, "_preferred_temporality", None),',
               "root = sampler._root"]
    assert all(_READ.search(line) for line in removed)
    assert [m.group(1) for m in _BY_NAME.finditer(
        'found = getattr(importlib.import_module("x.y"), "_LIBERAL_HEADER_PATTERN",')] == [
        "_LIBERAL_HEADER_PATTERN"]
    assert not _READ.search("from . import decision as _decision")  # attnscope's own name


# ---- the sampler: asked once per kind of parent, the same decisions as per span ---------------

_STATE = TraceState([("k", "v")])
_PARENTS: dict[str, SpanContext | None] = {
    "none": None,
    "invalid": INVALID_SPAN_CONTEXT,
    "remote sampled": SpanContext(5, 6, is_remote=True, trace_flags=TraceFlags(1),
                                  trace_state=_STATE),
    "remote unsampled": SpanContext(5, 6, is_remote=True, trace_flags=TraceFlags(0),
                                    trace_state=_STATE),
    "local sampled": SpanContext(7, 8, is_remote=False, trace_flags=TraceFlags(1),
                                 trace_state=TraceState([("a", "b")])),
    "local unsampled": SpanContext(7, 8, is_remote=False, trace_flags=TraceFlags(0)),
}


class _UserSampler(Sampler):
    """The application's own: samples even trace ids, and says so in an attribute."""

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None,
                      trace_state: TraceState | None = None) -> SamplingResult:
        if trace_id % 2:
            return SamplingResult(Decision.DROP)
        return SamplingResult(Decision.RECORD_AND_SAMPLE, {"user.sampled": True})

    def get_description(self) -> str:
        return "UserSampler"


class _Subclass(StaticSampler):
    pass


_FIXED: dict[str, Any] = {
    "ALWAYS_ON": ALWAYS_ON, "ALWAYS_OFF": ALWAYS_OFF, "RECORD_ONLY": StaticSampler(
        Decision.RECORD_ONLY),
    "ParentBased(ALWAYS_ON)": ParentBased(ALWAYS_ON),
    "ParentBased(ALWAYS_OFF)": ParentBased(ALWAYS_OFF),
    "DEFAULT_ON": DEFAULT_ON, "DEFAULT_OFF": DEFAULT_OFF,
    "ParentBased(inverted)": ParentBased(ALWAYS_OFF, remote_parent_sampled=ALWAYS_OFF,
                                         remote_parent_not_sampled=ALWAYS_ON,
                                         local_parent_sampled=ALWAYS_OFF,
                                         local_parent_not_sampled=ALWAYS_ON),
}
_PER_SPAN: dict[str, Any] = {
    "TraceIdRatioBased(0.5)": TraceIdRatioBased(0.5),
    "ParentBased(TraceIdRatioBased(0.5))": ParentBased(TraceIdRatioBased(0.5)),
    "user": _UserSampler(), "ParentBased(user)": ParentBased(_UserSampler()),
    "ParentBased(ALWAYS_ON, local sampled: user)": ParentBased(
        ALWAYS_ON, local_parent_sampled=_UserSampler()),
    "StaticSampler subclass": _Subclass(Decision.RECORD_AND_SAMPLE),
}


class _Processor:
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.spans.append(span)


class _Delivery:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.to_export = 0


def _emitter(sampler: Any) -> tuple[emit.DirectEmitter, _Processor]:
    processor = _Processor()
    return emit.DirectEmitter(TracerProvider(sampler=sampler), processor, "t", "0",
                              _Delivery()), processor


def _expected(sampler: Any, parent: SpanContext | None, trace_id: int,
              attrs: dict[str, Any]) -> tuple[bool, bool, Any, dict[str, Any]]:
    """What the sampler says for this span, asked the public way (the SDK's ``start_span``)."""
    result = sampler.should_sample(emit._parent_context(parent), trace_id, "s",
                                   SpanKind.INTERNAL, attrs, ())
    state = result.trace_state if result.trace_state is not None else TraceState()  # SpanContext's
    return (result.decision.is_sampled(), result.decision.is_recording(), state,
            {**attrs, **(result.attributes or {})})


def _emitted(sampler: Any, parent: SpanContext | None) -> list[tuple[Any, ...]]:
    """Spans emitted under ``parent``, each with what the sampler said for it."""
    direct, processor = _emitter(sampler)
    out = []
    for i in range(64):
        attrs = {"i": i}
        sc = direct.emit("s", parent, attrs, 1, 2)
        assert sc is not None
        recorded = processor.spans[-1] if processor.spans and \
            processor.spans[-1].context == sc else None
        got = (sc.trace_flags.sampled, recorded is not None, sc.trace_state,
               dict(recorded.attributes or {}) if recorded is not None else None)
        want = _expected(sampler, parent, sc.trace_id, attrs)
        out.append((got, want[:3] + ((want[3] if want[1] else None),)))
    return out


@pytest.mark.parametrize("parent", list(_PARENTS), ids=list(_PARENTS))
@pytest.mark.parametrize("name", list(_FIXED), ids=list(_FIXED))
def test_fixed_samplers_are_asked_once_and_decide_as_per_span(name: str, parent: str) -> None:
    sampler = _FIXED[name]
    direct, _ = _emitter(sampler)
    assert direct._fixed is not None  # decided once, not asked per span
    for got, want in _emitted(sampler, _PARENTS[parent]):
        assert got == want


@pytest.mark.parametrize("parent", list(_PARENTS), ids=list(_PARENTS))
@pytest.mark.parametrize("name", list(_PER_SPAN), ids=list(_PER_SPAN))
def test_other_samplers_are_asked_per_span(name: str, parent: str) -> None:
    sampler = _PER_SPAN[name]
    direct, _ = _emitter(sampler)
    assert direct._fixed is None
    for got, want in _emitted(sampler, _PARENTS[parent]):
        assert got == want


def test_per_span_samplers_do_decide_per_span() -> None:
    """The ratio and the user's sampler reach both decisions among 64 root spans (so the
    comparisons above cover a sampled and an unsampled span for each)."""
    for sampler in (TraceIdRatioBased(0.5), _UserSampler()):
        assert {got[0] for got, _ in _emitted(sampler, None)} == {True, False}


def test_a_sampler_that_fails_when_probed_is_asked_per_span() -> None:
    probed = ParentBased(ALWAYS_ON)
    calls: list[int] = []

    def should_sample(*args: Any, **kwargs: Any) -> SamplingResult:
        calls.append(1)
        raise RuntimeError("probe")

    probed.should_sample = should_sample  # type: ignore[method-assign]
    assert emit._fixed_decisions(probed) is None and calls == [1]


# ---- the OTLP endpoint: kept as attnscope resolved it, the URL the exporter uses ---------------

_ENDPOINT_ENV: list[dict[str, str]] = [
    {},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "https://collector.internal:4318/base/"},
    {"OTEL_EXPORTER_OTLP_ENDPOINT": "collector.internal:4317"},
    {"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT": "https://collector.internal:4318/x"},
    {"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT": "http://10.0.0.1:5555",
     "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"},
    {"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT": "", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:1/"},
]


def _sdk_exporter(signal: str, grpc: bool) -> Any:
    """The exporter the SDK makes from the environment alone (what attnscope's used to be)."""
    if signal == "TRACES":
        if grpc:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
            return OTLPSpanExporter()
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HTTPSpanExporter,
        )
        return HTTPSpanExporter()
    if grpc:
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        return OTLPMetricExporter()
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import (
        OTLPMetricExporter as HTTPMetricExporter,
    )
    return HTTPMetricExporter()


@pytest.mark.parametrize("grpc", [True, False], ids=["grpc", "http"])
@pytest.mark.parametrize("signal", ["TRACES", "METRICS"])
@pytest.mark.parametrize("env", _ENDPOINT_ENV, ids=range(len(_ENDPOINT_ENV)))
def test_the_endpoint_named_is_the_one_the_exporter_uses(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], signal: str, grpc: bool) -> None:
    from attnscope._export.otel_env import otlp_endpoint

    for var, value in env.items():
        monkeypatch.setenv(var.format(signal=signal), value)
    exporter = _sdk_exporter(signal, grpc)
    try:
        used = exporter._endpoint  # the private field the line was once read from
        assert otlp_endpoint(signal, grpc) == (used if "://" in used else "http://" + used)
    finally:
        exporter.shutdown()


@pytest.mark.parametrize("name", ["otlp-grpc", "otlp-http"])
def test_otlp_exporters_name_their_endpoint_attnscopes_without_a_private_read(
        monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    """attnscope's exporters name the URL it resolved; an OTLP exporter the application made
    still names its own (read privately: the one allow-listed ``_endpoint`` read)."""
    from attnscope._export import destinations, otlp_status
    from attnscope._export.pipeline import destination_of

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    made = destinations.make_exporter(name)
    url = "http://127.0.0.1:9" if name == "otlp-grpc" else "http://127.0.0.1:9/v1/traces"
    mine = _sdk_exporter("TRACES", name == "otlp-grpc")  # the application's own
    try:
        assert otlp_status.endpoint_of(made) == url
        assert destination_of(made, name) == url
        assert getattr(made, "attnscope_endpoint", None) == url  # no private read for it
        assert otlp_status.endpoint_of(mine) == url and not hasattr(mine, "attnscope_endpoint")
        assert destination_of(mine, None) == url
    finally:
        assert made is not None
        made.shutdown()
        mine.shutdown()
    guard = destinations._otlp_metric_exporter(name)
    try:
        assert otlp_status.endpoint_of(guard.inner) == url.replace("traces", "metrics")
    finally:
        guard.shutdown()


# ---- the metric exporter's preferences: those attnscope gave it, in its guard too ----------------

_PREFERENCES: list[dict[str, str]] = [
    {},
    {"TEMPORALITY_PREFERENCE": "delta"},
    {"TEMPORALITY_PREFERENCE": " LowMemory "},
    {"TEMPORALITY_PREFERENCE": "cumulative", "DEFAULT_HISTOGRAM_AGGREGATION":
     "base2_exponential_bucket_histogram"},
    {"TEMPORALITY_PREFERENCE": "bogus", "DEFAULT_HISTOGRAM_AGGREGATION":
     "BASE2_EXPONENTIAL_BUCKET_HISTOGRAM"},
    {"DEFAULT_HISTOGRAM_AGGREGATION": " base2_exponential_bucket_histogram"},
    {"DEFAULT_HISTOGRAM_AGGREGATION": "bogus"},
]


@pytest.mark.parametrize("grpc", [True, False], ids=["grpc", "http"])
@pytest.mark.parametrize("env", _PREFERENCES, ids=range(len(_PREFERENCES)))
def test_the_guard_prefers_what_the_exporter_would_alone(
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], grpc: bool) -> None:
    from attnscope._export import destinations

    for var, value in env.items():
        monkeypatch.setenv(f"OTEL_EXPORTER_OTLP_METRICS_{var}", value)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    alone = _sdk_exporter("METRICS", grpc)  # the exporter as the SDK makes it from the env
    guard = destinations._otlp_metric_exporter("otlp-grpc" if grpc else "otlp-http")
    try:
        for made in (guard, guard.inner):  # the reader asks the guard; the inner agrees
            assert made._preferred_temporality == alone._preferred_temporality
            assert {k: type(v) for k, v in made._preferred_aggregation.items()} == {
                k: type(v) for k, v in alone._preferred_aggregation.items()}
    finally:
        alone.shutdown()
        guard.shutdown()


# ---- metric readers: attnscope's own flushed one by one, the application's as before ---------

class _PullReader:
    """Counts how it is flushed (a pull reader must not be: Prometheus would queue a copy)."""

    def __init__(self) -> None:
        self.flushed = 0

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        self.flushed += 1
        return True


def test_own_readers_are_flushed_one_by_one_and_pull_readers_not(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    from opentelemetry import metrics as otel_metrics
    from opentelemetry.sdk.metrics.export import (
        ConsoleMetricExporter,
        PeriodicExportingMetricReader,
    )

    from attnscope import _config
    from attnscope._export import pipeline as _pipeline

    flushed: list[str] = []

    class Periodic(PeriodicExportingMetricReader):
        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            flushed.append("periodic")
            return True

    periodic = Periodic(ConsoleMetricExporter(out=io.StringIO()), export_interval_millis=60_000)
    pull = _PullReader()
    assert _pipeline._flush_metrics(object(), 100, [periodic, pull]) is True
    assert flushed == ["periodic"] and pull.flushed == 0
    periodic.shutdown()

    class Provider:  # not the SDK's, made by the application: flushed whole, as ever
        calls: list[float] = []

        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            self.calls.append(timeout_millis)
            return True

    assert _pipeline._flush_metrics(Provider(), 100, None) is True and Provider.calls == [100]

    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    class Pull(InMemoryMetricReader):
        def force_flush(self, timeout_millis: float = 10_000) -> bool:
            flushed.append("pull")
            return True

    flushed.clear()
    periodic = Periodic(ConsoleMetricExporter(out=io.StringIO()), export_interval_millis=60_000)
    applications = MeterProvider(metric_readers=[periodic, Pull()])  # the application's SDK one
    try:
        assert _pipeline._flush_metrics(applications, 100, None) is True
        assert flushed == ["periodic"]  # its pull reader is left for the application to read
    finally:
        applications.shutdown(timeout_millis=1_000)

    monkeypatch.setattr(otel_metrics, "get_meter_provider", otel_metrics.NoOpMeterProvider)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "console")
    built = _pipeline.build(_config.Config(exporter="none", metrics=True))
    try:
        assert built.meter_owned and len(built.meter_readers) == 1
        assert isinstance(built.meter_readers[0], PeriodicExportingMetricReader)
        assert built.force_flush(5_000)
    finally:
        built.shutdown(timeout_ms=1_000)
