"""configure(): environment, merging, validation."""

from __future__ import annotations

import inspect
import logging
import math
from pathlib import Path

import pytest

import attnscope
from attnscope import _api, _config


@pytest.mark.parametrize(
    "kwargs,needle",
    [
        ({"sample_rate": 2}, "sample_rate"),
        ({"sample_rate": math.nan}, "sample_rate"),
        ({"sample_rate": -0.1}, "sample_rate"),
        ({"sample_rate": "0.5"}, "sample_rate"),
        ({"exporter": "zipkin"}, "exporter"),
        ({"exporter": object()}, "exporter"),
        ({"profile_rate": 1.5}, "profile_rate"),
        ({"warmup_calls": -1}, "warmup_calls"),
        ({"max_spans_per_trace": 0}, "max_spans_per_trace"),
        ({"overhead_budget": 0.0}, "overhead_budget"),
        ({"profile_max_per_minute": -1}, "profile_max_per_minute"),
        ({"tracer_provider": 3}, "tracer_provider"),
        ({"no_such_setting": 1}, "no_such_setting"),
    ],
)
def test_bad_values_raise_value_error_naming_the_setting(kwargs: dict, needle: str) -> None:
    with pytest.raises(ValueError, match=needle):
        attnscope.configure(**kwargs)


def test_configure_only_overrides_what_it_is_given() -> None:
    attnscope.configure(sample_rate=0.25, warmup_calls=3)
    cfg = attnscope.configure(service_name="svc")
    assert (cfg.sample_rate, cfg.warmup_calls, cfg.service_name) == (0.25, 3, "svc")


def test_environment_is_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSCOPE_SAMPLE_RATE", "0.5")
    monkeypatch.setenv("ATTNSCOPE_WARMUP_CALLS", "0")
    monkeypatch.setenv("ATTNSCOPE_PROFILE_MAX_PER_MINUTE", "7")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "inference")
    _api.reset_defaults()
    cfg = _api.current()
    assert (cfg.sample_rate, cfg.warmup_calls, cfg.profile_max_per_minute) == (0.5, 0, 7.0)
    assert cfg.service_name == "inference"
    # keyword arguments win over the environment
    assert attnscope.configure(sample_rate=0.1).sample_rate == 0.1


def test_defaults() -> None:
    cfg = _config.Config()
    assert cfg.sample_rate == 0.01 and cfg.service_name == "attnscope" and cfg.enabled
    assert (cfg.profile_rate, cfg.profile_max_per_minute, cfg.warmup_calls) == (0.05, 2.0, 10)
    assert (cfg.max_spans_per_trace, cfg.overhead_budget, cfg.max_kernel_spans) == (512, None, 64)
    # unset, the budget is 1% on the rates left at their defaults (docs/sampling.md)
    assert _config.budgeted(cfg) == (0.01, True, True)
    assert cfg.record_command_args is False


def test_bad_environment_raises_in_configure_but_not_on_first_use(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSCOPE_SAMPLE_RATE", "lots")
    _api.reset_defaults()
    with pytest.raises(ValueError, match="ATTNSCOPE_SAMPLE_RATE"):
        attnscope.configure(service_name="x")
    _api.reset_defaults()
    assert _api.current().sample_rate == 0.01  # implicit configuration falls back

    @attnscope.trace
    def f(x: int) -> int:
        return x

    assert f(1) == 1


def test_out_of_range_environment_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSCOPE_SAMPLE_RATE", "3")
    _api.reset_defaults()
    with pytest.raises(ValueError, match="sample_rate"):
        attnscope.configure()


def test_exporter_names_are_accepted(tmp_path: Path) -> None:
    # file paths under tmp_path: a fixed /tmp name may be a directory on someone's machine
    for name in ("otlp", "otlp-http", "console", "none", f"jaeger-json:{tmp_path / 'x.json'}",
                 f"otlp-json:{tmp_path / 'x'}"):
        assert attnscope.configure(exporter=name).exporter == name


@pytest.mark.parametrize("settings,named", [
    ({"metrics": "false"}, "metrics"),  # a truthy string would have turned metrics on
    ({"reset_peak_memory_stats": "false"}, "reset_peak_memory_stats"),
    ({"enabled": 1}, "enabled"),
    ({"sample_rate": 10**400}, "sample_rate"),  # was OverflowError
    ({"profile_rate": float("nan")}, "profile_rate"),
    ({"profile_max_per_minute": 10**400}, "profile_max_per_minute"),
    ({"profile_max_per_minute": float("nan")}, "profile_max_per_minute"),
])
def test_wrong_types_and_values_raise_value_error_naming_the_setting(
    settings: dict[str, object], named: str
) -> None:
    with pytest.raises(ValueError, match=named) as info:
        attnscope.configure(**settings)
    assert len(str(info.value)) < 200  # a huge value is not printed whole


def test_an_exporter_class_instead_of_an_instance_is_refused() -> None:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    with pytest.raises(ValueError, match=r"InMemorySpanExporter\(\.\.\.\)"):
        attnscope.configure(exporter=InMemorySpanExporter)
    attnscope.configure(exporter=InMemorySpanExporter())


def test_unparsable_otel_sdk_disabled_warns_and_stays_enabled(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import logging

    caplog.set_level(logging.WARNING, logger="attnscope")
    monkeypatch.setenv("OTEL_SDK_DISABLED", "maybe")
    _api.reset_defaults()
    assert _api.current().enabled is True
    [record] = [r for r in caplog.records if "OTEL_SDK_DISABLED" in r.getMessage()]
    assert "maybe" in record.getMessage()


# ---- None puts a setting back to its default (issue 20) ------------------------------------------


def test_none_restores_the_built_in_default(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ATTNSCOPE_EXPORTER", raising=False)
    attnscope.configure(profile_dir=str(tmp_path), exporter="console", sample_rate=0.5,
                        run_id="job-1", warmup_calls=3)
    cfg = attnscope.configure(profile_dir=None, exporter=None, sample_rate=None, run_id=None)
    assert (cfg.profile_dir, cfg.exporter, cfg.run_id) == (None, None, None)
    assert cfg.sample_rate == _config.Config().sample_rate
    assert cfg.warmup_calls == 3  # not given: kept
    assert _api.current() == cfg


def test_none_restores_the_environments_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTNSCOPE_EXPORTER", "otlp-http")
    monkeypatch.setenv("ATTNSCOPE_SAMPLE_RATE", "0.25")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "inference")
    _api.reset_defaults()
    attnscope.configure(exporter="console", sample_rate=1.0, service_name="svc", enabled=False)
    cfg = attnscope.configure(exporter=None, sample_rate=None, service_name=None, enabled=None)
    assert (cfg.exporter, cfg.sample_rate, cfg.service_name, cfg.enabled) == (
        "otlp-http", 0.25, "inference", True)


def test_none_with_an_invalid_environment_value_falls_back_with_a_warning(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    attnscope.configure(sample_rate=0.5)
    monkeypatch.setenv("ATTNSCOPE_SAMPLE_RATE", "lots")
    assert attnscope.configure(sample_rate=None).sample_rate == _config.Config().sample_rate
    assert any("ATTNSCOPE_SAMPLE_RATE" in r.getMessage() for r in caplog.records)


def test_not_given_is_not_none() -> None:
    attnscope.configure(exporter="console", tracer_provider=None)
    assert attnscope.configure(sample_rate=0.5).exporter == "console"
    assert "not given" in repr(inspect.signature(attnscope.configure).parameters["exporter"])


def test_a_run_id_whose_repr_raises_gets_the_value_error() -> None:
    class Broken:
        def __repr__(self) -> str:
            raise RuntimeError("broken __repr__")

    with pytest.raises(ValueError, match=r"run_id must be a non-empty string, got <.*Broken obj"):
        attnscope.configure(run_id=Broken())
    assert "Broken object" in _config.shown(Broken())
