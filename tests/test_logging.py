"""attnscope logs like a library: stdlib logger "attnscope", never stdout, the app decides."""

from __future__ import annotations

import logging
import re
import subprocess
import sys
import textwrap

import pytest
import torch

import attnscope
from attnscope import _log, _nothing_sampled
from attnscope._capture import profiler_session as profiler
from attnscope._export import otlp_status
from attnscope._runtime import runtime
from attnscope.testing import capture_spans

# Runs every warning path attnscope has in a fresh process: a bad environment value read on first
# use, an internal error at a call site (until the site switches itself off), a bad step(), an
# unsupported OTEL_TRACES_EXPORTER, and a profile-tier call timed instead while the profiler warms.
_EVERY_WARNING = textwrap.dedent(
    """
    import logging, os, sys
    os.environ["ATTNSCOPE_SAMPLE_RATE"] = "lots"
    os.environ["OTEL_TRACES_EXPORTER"] = "carrier-pigeon"
    SETUP
    import torch
    import attnscope
    from attnscope._capture import args

    def boom(*a, **k):
        raise RuntimeError("injected")

    args.summarize_flat = boom
    attnscope.configure(sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=1.0, profile_max_per_minute=1000.0, metrics=False)
    attnscope.step("seven")

    @attnscope.trace
    def f(q):
        return q * 2

    q = torch.ones(2, 2)
    for _ in range(10):
        assert torch.equal(f(q), q * 2)
    attnscope.flush(timeout_s=10)
    """
)


def _run(setup: str) -> subprocess.CompletedProcess[str]:
    code = _EVERY_WARNING.replace("SETUP", setup)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=True)


def test_app_logging_at_error_silences_every_warning_path() -> None:
    out = _run('logging.basicConfig(level=logging.WARNING)\n'
               'logging.getLogger("attnscope").setLevel(logging.ERROR)')
    assert out.stdout == ""
    assert "attnscope" not in out.stderr, out.stderr


def test_without_configuration_warnings_go_to_stderr_one_line_each() -> None:
    out = _run("")
    assert out.stdout == ""
    lines = [line for line in out.stderr.splitlines() if line.strip()]
    assert any("attnscope internal error in capture:" in line for line in lines), out.stderr
    assert any("no longer traced" in line for line in lines), out.stderr
    assert any("ATTNSCOPE_SAMPLE_RATE" in line for line in lines), out.stderr
    assert "Traceback" not in out.stderr  # tracebacks are for DEBUG
    assert "timed instead" not in out.stderr  # normal operation: DEBUG


def test_debug_shows_the_traceback_and_normal_operation() -> None:
    out = _run('logging.basicConfig(level=logging.DEBUG)')
    assert out.stdout == ""
    assert "Traceback" in out.stderr and "RuntimeError: injected" in out.stderr


@pytest.mark.internal_errors("unit")
def test_records_carry_the_fields(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    _log.internal_error("unit", ValueError("bad"))
    _log.internal_error("unit", ValueError("rate-limited"))
    [record] = [r for r in caplog.records if r.name == "attnscope"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        "attnscope internal error in unit: ValueError('bad'); the call proceeds uninstrumented")
    assert record.attnscope == {"stage": "unit", "error": "ValueError('bad')"}  # type: ignore[attr-defined]
    assert (record.stage, record.error) == ("unit", "ValueError('bad')")  # type: ignore[attr-defined]
    assert record.exc_info is None
    assert _log.error_count("unit") == 2  # counted even when not logged


def test_profile_skips_are_debug(caplog: pytest.LogCaptureFixture,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG, logger="attnscope")
    monkeypatch.setattr(runtime.profiler, "warm_cpu", False)
    monkeypatch.setattr(profiler, "warm_up_async", lambda cuda=None: None)

    @attnscope.trace
    def f(q: torch.Tensor) -> torch.Tensor:
        return q + 1

    with capture_spans(profile_rate=1.0, profile_max_per_minute=1000.0):
        f(torch.ones(1))
    skips = [r for r in caplog.records if "timed instead" in r.getMessage()]
    assert skips and all(r.levelno == logging.DEBUG for r in skips)


def test_import_adds_no_handler_and_leaves_logging_alone() -> None:
    code = ("import logging; before = list(logging.getLogger().handlers); import attnscope; "
            "assert logging.getLogger('attnscope').handlers == []; "
            "assert logging.getLogger().handlers == before; "
            "import sys; assert 'structlog' not in sys.modules, 'structlog loads on first log'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.internal_errors("unit-locals")
def test_debug_tracebacks_are_text_without_locals(caplog: pytest.LogCaptureFixture) -> None:
    """A formatter given the exception (rich, structlog's) could print the frames' locals."""
    caplog.set_level(logging.DEBUG, logger="attnscope")
    marker = 1234567.25

    def failing(x: torch.Tensor) -> None:
        held = x * 2  # noqa: F841  (a local a locals-printing formatter would show)
        raise RuntimeError("inside attnscope")

    try:
        failing(torch.full((3,), marker))
    except RuntimeError as exc:
        _log.internal_error("unit-locals", exc)
    [record] = [r for r in caplog.records if "unit-locals" in r.getMessage()]
    assert record.exc_info is None and record.exc_text is None
    text = record.getMessage()
    assert "Traceback" in text and "in failing" in text
    assert "1234567" not in text and "2469134" not in text


# ---- issue 38 §3: a sentence for people, the fields on the record ----------------------------

_TRAILING_FIELD = re.compile(r"\s[a-z_]+=\S+$")


def _records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "attnscope"]


def test_nothing_listening_is_a_sentence_and_the_endpoint_an_attribute(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    otlp_status.report_unreachable("http://localhost:4317")
    [record] = _records(caplog)
    text = record.getMessage()
    # was: "... attnscope.configure(exporter='jaeger-json:attnscope-trace.json')
    # endpoint='http://localhost:4317'"
    assert text.endswith("attnscope.configure(exporter='jaeger-json:attnscope-trace.json')"), text
    assert not _TRAILING_FIELD.search(text), text
    assert record.endpoint == "http://localhost:4317"  # type: ignore[attr-defined]
    assert record.attnscope == {"endpoint": "http://localhost:4317"}  # type: ignore[attr-defined]


def test_nothing_sampled_is_a_sentence_and_the_settings_attributes(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="attnscope")
    attnscope.configure(exporter="none")
    _nothing_sampled.at_exit()
    [record] = [r for r in _records(caplog) if "no call was sampled" in r.getMessage()]
    text = record.getMessage()
    # was: "... ATTNSCOPE_SAMPLE_RATE=1 ATTNSCOPE_WARMUP_CALLS=0 sample_rate=0.01 warmup_calls=10"
    assert text.endswith("ATTNSCOPE_SAMPLE_RATE=1 ATTNSCOPE_WARMUP_CALLS=0"), text
    assert "warmup_calls=10 calls" in text and "sample_rate=0.01 of calls" in text
    assert (record.sample_rate, record.warmup_calls) == (0.01, 10)  # type: ignore[attr-defined]


def test_a_field_the_sentence_does_not_state_is_said_in_words(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    _log.warn_once("t-words", "attnscope: unknown OTLP protocol; using grpc", value="thrift",
                   queue_size=7)
    _log.warn_once("t-reserved", "attnscope: a field named like a record attribute",
                   module="mine")
    words, reserved = _records(caplog)
    assert words.getMessage() == ("attnscope: unknown OTLP protocol; using grpc "
                                  "(value: 'thrift'; queue size: 7)")
    assert (words.value, words.queue_size) == ("thrift", 7)  # type: ignore[attr-defined]
    # makeRecord cannot take it as an attribute: it stays with the others in record.attnscope
    assert reserved.module != "mine"
    assert reserved.attnscope == {"module": "mine"}  # type: ignore[attr-defined]


def test_an_invalid_environment_value_is_named_in_the_sentence(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    monkeypatch.setenv("ATTNSCOPE_SAMPLE_RATE", "lots")
    monkeypatch.setenv("ATTNSCOPE_WARMUP_CALLS", "-3")
    attnscope._api.reset_defaults()
    attnscope._api.current()
    texts = sorted(r.getMessage() for r in _records(caplog))
    assert texts[0].startswith("attnscope: ignoring the environment variable "
                               "ATTNSCOPE_SAMPLE_RATE='lots': "), texts
    assert texts[1].startswith("attnscope: ignoring the environment variable "
                               "ATTNSCOPE_WARMUP_CALLS=-3: not a valid warmup_calls"), texts
    assert not any(_TRAILING_FIELD.search(t) for t in texts), texts
