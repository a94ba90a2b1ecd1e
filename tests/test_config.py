"""configure(): environment, merging, validation."""

from __future__ import annotations

import math

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
    assert (cfg.max_spans_per_trace, cfg.overhead_budget, cfg.max_kernel_spans) == (512, 0.01, 64)


def test_bad_environment_raises_in_configure_but_not_on_first_use(monkeypatch: pytest.MonkeyPatch) -> None:
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


def test_exporter_names_are_accepted() -> None:
    for name in ("otlp", "otlp-http", "console", "none", "jaeger-json:/tmp/x.json", "otlp-json:/tmp/x"):
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
