"""The standard OTEL_* variables choose and configure attnscope's exporters and resource."""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from opentelemetry import trace as otel_trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GRPCExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTPExporter
from opentelemetry.sdk.trace.export import ConsoleSpanExporter

import attnscope
from attnscope import _config
from attnscope._export import destinations as _destinations
from attnscope._export import otlp_exporters
from attnscope._export import pipeline as _provider
from tests.e2e.otlp_fakes import GRPCCollector, HTTPCollector


def _ours(sdk_class: type) -> type:
    """The class attnscope builds for an SDK OTLP exporter: the SDK's, its requests encoded by
    attnscope (tests/test_otlp_encode.py)."""
    ours = {GRPCExporter: otlp_exporters.grpc_exporter_class(),
            HTTPExporter: otlp_exporters.http_exporter_class()}
    found = ours.get(sdk_class, sdk_class)
    assert found is sdk_class or issubclass(found, sdk_class)
    return found


@pytest.fixture(autouse=True)
def clean(bare_env: None, monkeypatch: pytest.MonkeyPatch) -> None:
    # As if the application had not installed an SDK TracerProvider.
    monkeypatch.setattr(otel_trace, "get_tracer_provider", otel_trace.ProxyTracerProvider)


@attnscope.trace
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> Any:
    return F.scaled_dot_product_attention(q, k, v)


# ---- which exporter ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "env", "expected"),
    [
        ("otlp", {}, GRPCExporter),
        ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, GRPCExporter),
        ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, HTTPExporter),
        ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "HTTP/Protobuf "}, HTTPExporter),
        ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, HTTPExporter),  # warned
        ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, GRPCExporter),  # warned
        ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc",
                  "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"}, HTTPExporter),
        ("otlp", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                  "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}, GRPCExporter),
        ("otlp-http", {}, HTTPExporter),
        ("otlp-http", {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, HTTPExporter),
        ("otlp-grpc", {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, GRPCExporter),
        ("console", {}, ConsoleSpanExporter),
    ],
)
def test_make_exporter_honours_the_protocol(
    monkeypatch: pytest.MonkeyPatch, name: str, env: dict[str, str], expected: type
) -> None:
    expected = _ours(expected)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    exporter = _destinations.make_exporter(name)
    try:
        assert type(exporter) is expected
    finally:
        assert exporter is not None
        exporter.shutdown()


def test_none_exporter_means_no_exporter() -> None:
    assert _destinations.make_exporter("none") is None


@pytest.mark.parametrize(
    ("traces_exporter", "expected"),
    [(None, GRPCExporter), ("otlp", GRPCExporter), ("console", ConsoleSpanExporter),
     ("none", type(None)), ("zipkin", GRPCExporter), ("console,otlp", ConsoleSpanExporter)],
)
def test_otel_traces_exporter_picks_ours_when_the_app_has_no_provider(
    monkeypatch: pytest.MonkeyPatch, traces_exporter: str | None, expected: type
) -> None:
    expected = _ours(expected)
    if traces_exporter is not None:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", traces_exporter)
    pipeline = _provider.build(_config.Config(metrics=False))
    try:
        assert pipeline.owned
        assert type(pipeline.exporter) is expected
    finally:
        pipeline.shutdown()


def test_otlp_exporters_read_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "3")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "https://collector.internal:4318/x")
    exporter = _destinations.make_exporter("otlp-http")
    assert isinstance(exporter, HTTPExporter)
    # attnscope passes nothing: every setting comes from the environment (private attributes:
    # where the SDK keeps them moves between releases).
    assert exporter._endpoint == "https://collector.internal:4318/x"
    client = getattr(exporter, "_client", exporter)
    assert getattr(client, "_timeout", None) == 3
    exporter.shutdown()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
    grpc_exporter = _destinations.make_exporter("otlp")
    assert isinstance(grpc_exporter, GRPCExporter)
    assert grpc_exporter._endpoint == "127.0.0.1:9" and grpc_exporter._timeout == 3
    grpc_exporter.shutdown()


# ---- resource ------------------------------------------------------------------------------------


def test_resource_carries_service_host_process_versions_and_rank() -> None:
    attrs = _destinations.resource(_config.Config(service_name="trainer")).attributes
    assert attrs["service.name"] == "trainer"
    assert attrs["host.name"] == socket.gethostname()
    assert attrs["process.pid"] == os.getpid()
    assert attrs["process.runtime.name"] == "cpython"
    assert attrs["attnscope.version"] == attnscope.__version__
    assert attrs["attnscope.torch.version"] == str(torch.__version__)
    assert attrs["attnscope.rank"] == 0 and attrs["attnscope.world_size"] == 1
    assert attrs["telemetry.sdk.name"] == "opentelemetry"


@pytest.mark.parametrize(
    ("env", "configured", "expected"),
    [
        ({}, None, "attnscope"),
        ({"OTEL_SERVICE_NAME": "svc-env"}, None, "svc-env"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=svc-attrs"}, None, "svc-attrs"),
        ({"OTEL_SERVICE_NAME": "svc-env", "OTEL_RESOURCE_ATTRIBUTES": "service.name=svc-attrs"},
         None, "svc-env"),
        ({"OTEL_SERVICE_NAME": "svc-env"}, "svc-code", "svc-code"),
        ({"OTEL_RESOURCE_ATTRIBUTES": "service.name=svc-attrs"}, "svc-code", "svc-code"),
    ],
)
def test_service_name_precedence(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], configured: str | None, expected: str
) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    cfg = attnscope.configure(service_name=configured)
    assert _destinations.resource(cfg).attributes["service.name"] == expected


def test_otel_resource_attributes_are_added_and_override_detected_ones(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES",
                       "deployment.environment=staging,host.name=node-7,team=ml%20infra")
    attrs = _destinations.resource(_config.Config()).attributes
    assert attrs["deployment.environment"] == "staging"
    assert attrs["host.name"] == "node-7"
    assert attrs["team"] == "ml infra"
    assert attrs["attnscope.version"] == attnscope.__version__


# ---- on the wire -------------------------------------------------------------------------------


def _resource_of(request: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in request.resource_spans[0].resource.attributes:
        out[kv.key] = getattr(kv.value, kv.value.WhichOneof("value"))
    return out


def _send_one() -> None:
    attnscope.configure(sample_rate=1.0, warmup_calls=0, overhead_budget=1.0, profile_rate=0.0)
    q = torch.randn(1, 2, 4, 4)
    attention(q, q, q)
    assert attnscope.flush(timeout_s=10.0)


def _wait(predicate: Any, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_http_endpoint_headers_compression_and_resource_on_the_wire(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    collector = HTTPCollector("ok").start()
    try:
        monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                           f"{collector.endpoint}/custom/traces")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=secret,x-tenant=t1")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "wire-http")
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=ci")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
        _send_one()
        assert _wait(lambda: collector.trace_requests)
    finally:
        collector.stop()
    assert collector.paths[0] == "/custom/traces"
    headers = collector.headers[0]
    assert headers["x-api-key"] == "secret" and headers["x-tenant"] == "t1"
    assert headers["content-encoding"] == "gzip"
    assert headers["content-type"] == "application/x-protobuf"
    (span,) = collector.spans
    assert span.name == "attention"
    resource = _resource_of(collector.trace_requests[0])
    assert resource["service.name"] == "wire-http"
    assert resource["deployment.environment"] == "ci"
    assert resource["attnscope.version"] == attnscope.__version__
    assert resource["host.name"] == socket.gethostname()


def test_grpc_endpoint_and_headers_on_the_wire(monkeypatch: pytest.MonkeyPatch) -> None:
    collector = GRPCCollector("ok").start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "x-api-key=secret")
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_COMPRESSION", "gzip")
        monkeypatch.setenv("OTEL_SERVICE_NAME", "wire-grpc")
        monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
        _send_one()
        assert _wait(lambda: collector.trace_requests)
    finally:
        collector.stop()
    assert collector.headers[0]["x-api-key"] == "secret"
    (span,) = collector.spans
    assert span.name == "attention"
    assert _resource_of(collector.trace_requests[0])["service.name"] == "wire-grpc"


def test_flush_makes_file_exporters_write(tmp_path: Any) -> None:
    """The SDK never calls an exporter's force_flush; attnscope.flush() does."""
    path = tmp_path / "spans.json"
    attnscope.configure(exporter=f"jaeger-json:{path}", metrics=False)
    _send_one()  # the first export writes at once (the exporter's interval has not started)
    assert path.read_text().count('"operationName":"attention"') == 1
    _send_one()  # within the 5 s interval: only force_flush writes it
    assert path.read_text().count('"operationName":"attention"') == 2


def test_flush_is_bounded_when_the_exporter_hangs() -> None:
    import threading

    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    release = threading.Event()

    class Stuck(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            release.wait(10)
            return SpanExportResult.SUCCESS

        def shutdown(self) -> None:
            release.set()

    attnscope.configure(exporter=Stuck(), metrics=False, sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    q = torch.randn(1, 2, 4, 4)
    try:
        attention(q, q, q)
        t0 = time.monotonic()
        assert attnscope.flush(timeout_s=0.5) is False
        assert attnscope.flush(timeout_s=0.3) is False  # the first flush is still stuck
        assert time.monotonic() - t0 < 1.5
        t0 = time.monotonic()
        attnscope.shutdown(timeout_s=1.0)
        assert time.monotonic() - t0 < 2.0
    finally:
        release.set()


def test_file_exporters_given_as_objects_count_as_local_at_exit(tmp_path: Path) -> None:
    """Exit waits on local work (writing a file) longer than on a network exporter: an exporter
    object that writes files is local too, like the ``jaeger-json:`` setting."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from attnscope._config import Config
    from attnscope._export import pipeline
    from attnscope._export.jaeger_json import JaegerJSONFileExporter

    class Remote(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    files = JaegerJSONFileExporter(str(tmp_path / "t.json"))
    built = [pipeline.build(Config(exporter=e, metrics=False)) for e in (files, Remote())]
    try:
        assert [p.local for p in built] == [True, False]
    finally:
        for p in built:
            p.provider.shutdown()


# ---- issue 38 §4: the command line is opt-in ----------------------------------------------------


@pytest.mark.parametrize("argv,kept", [
    (["python"], ["python"]),
    (["python", "app.py", "--api-key=k", "--prompt", "my words"], ["python", "app.py"]),
    (["python", "-u", "-W", "ignore", "app.py", "a"], ["python", "app.py"]),
    (["python", "-Wignore", "-X", "utf8", "-m", "pkg.serve", "--prompt", "hi"],
     ["python", "-m", "pkg.serve"]),
    (["python", "-c", "key = 'k'; run(key)", "x"], ["python", "-c"]),
    (["python", "-Bc", "key = 'k'"], ["python", "-c"]),
    (["python", "-mpkg", "x"], ["python", "-m", "pkg"]),
    (["python", "-", "x"], ["python", "-"]),
    (["python", "--check-hash-based-pycs", "always", "s.py", "x"], ["python", "s.py"]),
    (["python", "-E", "--", "s.py", "x"], ["python", "s.py"]),
    (["/v/bin/python", "/v/bin/accelerate", "launch", "t.py", "--api-key", "k"],
     ["/v/bin/python", "/v/bin/accelerate"]),
])
def test_by_default_the_resource_keeps_the_program_only(argv: list[str],
                                                       kept: list[str]) -> None:
    assert _destinations.program_of(argv) == kept


_COMMAND_PROGRAM = """
import json
from attnscope import _api
from attnscope._export.destinations import resource_attributes
print(json.dumps(resource_attributes(_api.current())["process.command_args"]))
# SECRET-IN-PROGRAM
"""


@pytest.mark.parametrize("opt_in", [False, True])
def test_the_whole_command_line_only_when_asked(opt_in: bool) -> None:
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env.update(OMP_NUM_THREADS="1", ATTNSCOPE_EXPORTER="none")
    if opt_in:
        env["ATTNSCOPE_RECORD_COMMAND_ARGS"] = "1"
    argv = [sys.executable, "-c", _COMMAND_PROGRAM, "--api-key=SECRET-KEY", "--prompt",
            "SECRET PROMPT"]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, done.stderr
    recorded = json.loads(done.stdout)
    if opt_in:
        assert recorded == argv
    else:
        assert recorded == [sys.executable, "-c"]
        assert "SECRET" not in done.stdout


def test_configure_turns_the_command_line_on() -> None:
    import sys

    cfg = attnscope.configure(record_command_args=True)
    assert _destinations.resource_attributes(cfg)["process.command_args"] == \
        _destinations.command_args(list(sys.orig_argv))
    cfg = attnscope.configure(record_command_args=False)
    assert _destinations.resource_attributes(cfg)["process.command_args"] == \
        _destinations.program_of(list(sys.orig_argv))
    with pytest.raises(ValueError, match="record_command_args"):
        attnscope.configure(record_command_args="yes")


def test_configure_turns_the_command_line_on_for_a_running_pipeline() -> None:
    """The resource is built with the pipeline: a pipeline already running when the setting
    changed kept the old command line until the process ended."""
    import sys

    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from attnscope._runtime import runtime

    before, after = InMemorySpanExporter(), InMemorySpanExporter()
    attnscope.configure(exporter=before, record_command_args=False)
    _send_one()
    running = runtime.worker.current
    attnscope.configure(record_command_args=True)
    assert runtime.worker.current is not running  # before: the running pipeline kept its resource
    attnscope.configure(exporter=after)
    _send_one()
    first, second = (list(e.get_finished_spans()[0].resource.attributes["process.command_args"])
                     for e in (before, after))
    assert first == _destinations.program_of(list(sys.orig_argv))
    assert second == _destinations.command_args(list(sys.orig_argv))


def test_a_reconfigure_keeps_the_applications_exporter_working() -> None:
    """A setting that rebuilds the pipeline (here the service name) while the application's own
    exporter instance stays named: the old pipeline shut that exporter down, and every span
    after the change failed to export (counted, but lost)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, service_name="before")
    _send_one()
    attnscope.configure(service_name="after")
    _send_one()
    names = [s.resource.attributes["service.name"] for s in exporter.get_finished_spans()]
    assert names == ["before", "after"]
    assert attnscope.stats()["export_failed"] == 0
