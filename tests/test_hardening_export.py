"""Exporters under hostile settings (issue 35 §11, §14, §15, §17, §20).

- §11: ``OTEL_TRACES_EXPORTER=console`` / ``OTEL_METRICS_EXPORTER=console`` write to stderr,
  never to the program's stdout (``attnscope run -- python app.py | jq .``).
- §14: an explicit destination that cannot be used (``ATTNSCOPE_EXPORTER=jaeger-json:`` in a
  missing directory, an ``OTEL_EXPORTER_OTLP_ENDPOINT`` that is not a URL) sends nowhere, counts
  the spans as failed and says so once, instead of sending them to the default OTLP endpoint.
- §15: a malformed ``OTEL_*_LIMIT`` is replaced by the SDK's default (it lost every span).
- §17: a Jaeger JSON file reopened through another spelling keeps the spans already in it.
- §20: malformed ``OTEL_EXPORTER_OTLP_HEADERS`` / ``OTEL_RESOURCE_ATTRIBUTES``: one attnscope
  line each, not the SDK's line per entry per exporter or detection.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import attnscope
from tests.reliability.collectors import FaultyGRPC
from tests.reliability.harness import clean_env

CALLS = 12


def _traffic(n: int = CALLS) -> None:
    f = attnscope.trace(name="hardened")(lambda x: x + 1)
    for i in range(n):
        assert f(i) == i + 1


def _attnscope_lines(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "attnscope" and text in
            r.getMessage()]


def _run(code: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "app.py"
    script.write_text(textwrap.dedent(code))
    return subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, env=clean_env(OMP_NUM_THREADS="1", **env))


# ---- §11 ---------------------------------------------------------------------------------------


def test_console_exporters_never_write_to_stdout(tmp_path: Path) -> None:
    proc = _run("""
        import attnscope
        attnscope.configure(sample_rate=1.0, warmup_calls=0, overhead_budget=1.0, profile_rate=0.0)
        f = attnscope.trace(name="on-the-console")(lambda x: x + 1)
        for i in range(5):
            f(i)
        attnscope.flush(10)
        print("the program's own output")
    """, tmp_path, OTEL_TRACES_EXPORTER="console", OTEL_METRICS_EXPORTER="console")
    assert proc.returncode == 0, proc.stderr[-2000:]
    # before: the spans' and the metrics' JSON came first on stdout
    assert proc.stdout == "the program's own output\n"
    assert '"name": "on-the-console"' in proc.stderr
    assert "resource_metrics" in proc.stderr


def test_the_console_span_exporter_follows_a_replaced_stderr(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("ATTNSCOPE_EXPORTER")
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    attnscope.configure(exporter=None, sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    _traffic(3)
    assert attnscope.flush(10)
    out, err = capsys.readouterr()
    assert out == ""
    assert err.count('"name": "hardened"') == 3


# ---- §14 ---------------------------------------------------------------------------------------


@pytest.fixture
def grpc_collector(monkeypatch: pytest.MonkeyPatch) -> Any:
    """A collector where spans would go by default (OTLP/gRPC at OTEL_EXPORTER_OTLP_ENDPOINT)."""
    collector = FaultyGRPC("ok").start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{collector.port}")
    try:
        yield collector
    finally:
        collector.stop()


def test_an_unusable_attnscope_exporter_sends_nowhere(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path,
        grpc_collector: Any) -> None:
    from attnscope import _api

    missing = tmp_path / "nonexistent" / "x.json"
    monkeypatch.setenv("ATTNSCOPE_EXPORTER", f"jaeger-json:{missing}")
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        _api.reset_defaults()
        _api.current()  # as at import: the environment, an invalid value skipped with a line
        attnscope.configure(sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0, profile_rate=0.0, metrics=False)
        _traffic()
        assert attnscope.flush(10) is False
    stats = attnscope.stats()
    # before: every span was delivered to the OTLP collector nobody named
    assert len(grpc_collector.spans) == 0
    assert stats["export_failed"] == CALLS and stats["exported"] == 0
    said = _attnscope_lines(caplog, "exported nowhere")
    assert len(said) == 1 and "ATTNSCOPE_EXPORTER" in said[0] and "x.json" in said[0]
    assert not missing.parent.exists()


@pytest.mark.parametrize(("name", "endpoint"), [("otlp-http", "http://[::1"),
                                                ("otlp-http", "localhost:4318"),
                                                ("otlp-grpc", "not a url")])
def test_an_endpoint_that_is_not_a_url_sends_nowhere(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, name: str,
        endpoint: str) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        attnscope.configure(exporter=name, sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0, profile_rate=0.0,
                            metrics=False)
        _traffic()
        attnscope.flush(10)
        from attnscope._runtime import runtime

        pipeline = runtime.worker.current.engine.pipeline
        # before: an OTLP exporter sending to localhost:4317 / 4318
        assert type(pipeline.exporter).__name__ == "NowhereExporter"
        assert pipeline.destination == "nowhere"
    stats = attnscope.stats()
    assert stats["export_failed"] == CALLS and stats["export_in_flight"] == 0
    said = _attnscope_lines(caplog, "exported nowhere")
    assert len(said) == 1 and "OTEL_EXPORTER_OTLP_ENDPOINT" in said[0]


def test_a_metrics_endpoint_that_is_not_a_url_exports_no_metrics(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope._export import destinations

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://[::1")
    assert destinations._otlp_metric_exporter("otlp-http") is None


# ---- §15 ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("setting", ["OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT=abc",
                                     "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT=-1",
                                     "OTEL_SPAN_EVENT_COUNT_LIMIT="])
def test_a_malformed_limit_loses_no_span(tmp_path: Path, setting: str) -> None:
    var, _, value = setting.partition("=")
    out = tmp_path / "spans.jsonl"
    proc = _run(f"""
        import attnscope
        attnscope.configure(sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0, profile_rate=0.0, metrics=False,
                            exporter="otlp-json:{out}")
        f = attnscope.trace(name="limited")(lambda x: x + 1)
        for i in range({CALLS}):
            f(i)
        assert attnscope.flush(10)
        s = attnscope.stats()
        print(s["exported"], s["worker_errors"], s["internal_errors"])
    """, tmp_path, **{var: value})
    assert proc.returncode == 0, proc.stderr[-2000:]
    # before: 0 exported, every span a worker error (or the SDK not importable at all)
    assert proc.stdout.split() == [str(CALLS), "0", "0"], proc.stderr[-2000:]
    spans = [s for line in out.read_text().splitlines()
             for rs in json.loads(line)["resourceSpans"] for ss in rs["scopeSpans"]
             for s in ss["spans"]]
    assert len(spans) == CALLS
    named = [line for line in proc.stderr.splitlines() if var in line]
    assert len(named) == (1 if value else 0), proc.stderr


def test_a_malformed_limit_takes_the_default_it_would_have(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope._export.otel_env import span_limits

    assert span_limits() is None  # nothing set: the SDK reads the variables itself
    monkeypatch.setenv("OTEL_ATTRIBUTE_COUNT_LIMIT", "50")
    monkeypatch.setenv("OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT", "abc")
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "-1")
    monkeypatch.setenv("OTEL_SPAN_LINK_COUNT_LIMIT", "7")
    limits = span_limits()
    assert limits.max_span_attributes == 50  # the valid global count, as the SDK would take
    assert limits.max_attribute_length is None and limits.max_span_attribute_length is None
    assert limits.max_links == 7  # valid: read by the SDK as usual


# ---- §17 ---------------------------------------------------------------------------------------


def test_a_jaeger_file_reopened_through_a_linked_directory_keeps_its_spans(
        tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    attnscope.configure(exporter=f"jaeger-json:{real / 't.json'}", sample_rate=1.0,
                        warmup_calls=0, overhead_budget=1.0, profile_rate=0.0, metrics=False)
    _traffic()
    assert attnscope.shutdown(10)
    attnscope.configure(exporter=f"jaeger-json:{link / 't.json'}")
    _traffic()
    assert attnscope.shutdown(10)
    document = json.loads((real / "t.json").read_text())
    in_file = sum(len(t["spans"]) for t in document["data"])
    stats = attnscope.stats()
    # before: 12 in the file, 24 counted exported
    assert stats["exported"] == 2 * CALLS
    assert in_file == 2 * CALLS


def test_same_path_compares_files_not_spellings(tmp_path: Path) -> None:
    from attnscope._export.files import same_path

    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "f").write_text("x")
    (tmp_path / "l").symlink_to(tmp_path / "d")
    assert same_path(str(tmp_path / "l" / "f"), [str(tmp_path / "d" / "f")])
    assert same_path(str(tmp_path / "d" / ".." / "d" / "f"), [str(tmp_path / "d" / "f")])
    assert not same_path(str(tmp_path / "d" / "g"), [str(tmp_path / "d" / "f")])
    (tmp_path / "d" / "g").write_text("y")
    assert not same_path(str(tmp_path / "d" / "g"), [str(tmp_path / "d" / "f")])


# ---- §20 ---------------------------------------------------------------------------------------

_SDK_LOGGERS = ("opentelemetry.util.re", "opentelemetry.sdk.resources",
                "opentelemetry.attributes")


@pytest.mark.parametrize(("var", "value"), [
    ("OTEL_EXPORTER_OTLP_HEADERS", "bad header,,=x,api-key=secret-b7f3c2"),
    ("OTEL_RESOURCE_ATTRIBUTES", "a,b=,=c,team=ml"),
])
def test_a_malformed_variable_gets_one_attnscope_line(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        grpc_collector: Any, var: str, value: str) -> None:
    monkeypatch.setenv(var, value)
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")  # a second exporter reads the headers
    with caplog.at_level(logging.WARNING):
        attnscope.configure(exporter="otlp-grpc", sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0,
                            profile_rate=0.0, metrics=True)
        _traffic()
        attnscope.flush(10)  # the metrics may fail: the fake collector takes traces only
    sdk = [r.getMessage() for r in caplog.records if r.name in _SDK_LOGGERS]
    # before: 4 lines for the headers (2 entries x 2 exporters), 4-6 for the resource
    assert sdk == []
    named = _attnscope_lines(caplog, var)
    assert len(named) == 1, named
    assert "secret" not in named[0]  # header values may be credentials
    assert len(grpc_collector.spans) == CALLS


def test_the_sdk_lines_pass_when_the_application_configured_their_logger(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from attnscope._export import otlp_status

    logger = logging.getLogger("opentelemetry.util.re")
    monkeypatch.setattr(logger, "level", logging.WARNING)  # the application asked for them
    with caplog.at_level(logging.WARNING), otlp_status.sdk_quiet():
        logger.warning("Header format invalid! %s", "x")
    assert [r.name for r in caplog.records] == ["opentelemetry.util.re"]
    with caplog.at_level(logging.WARNING):
        # outside sdk_quiet nothing is filtered
        logging.getLogger("opentelemetry.sdk.resources").warning("outside")
    assert "outside" in caplog.text
