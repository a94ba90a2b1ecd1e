"""device_peaks / ATTNSCOPE_PEAK_TFLOPS / ATTNSCOPE_PEAK_GBPS: validation and defaults."""

from __future__ import annotations

import logging
import math

import pytest

import attnscope
from attnscope import _api, _config


def test_configured_peaks_are_kept_read_only() -> None:
    cfg = attnscope.configure(device_peaks={"tflops": 100, "gbps": 2000.5})
    assert dict(cfg.device_peaks or {}) == {"tflops": 100.0, "gbps": 2000.5}
    with pytest.raises(TypeError):
        cfg.device_peaks["tflops"] = 1.0  # type: ignore[index]


@pytest.mark.parametrize("value", [
    {"tflops": 1.0}, {"tflops": 1.0, "gbps": 1.0, "x": 1.0}, {"tflops": 0, "gbps": 1.0},
    {"tflops": -1.0, "gbps": 1.0}, {"tflops": math.nan, "gbps": 1.0},
    {"tflops": math.inf, "gbps": 1.0}, {"tflops": 1.0, "gbps": "2"}, {"tflops": True, "gbps": 1},
    {"tflops": 1.0, "gbps": 2e9}, (1.0, 2.0), "100,2000",
])
def test_bad_peaks_raise_naming_the_setting(value: object) -> None:
    with pytest.raises(ValueError, match="device_peaks"):
        attnscope.configure(device_peaks=value)


def test_none_restores_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    attnscope.configure(device_peaks={"tflops": 1.0, "gbps": 2.0})
    assert attnscope.configure(device_peaks=None).device_peaks is None
    monkeypatch.setenv("ATTNSCOPE_PEAK_TFLOPS", "50")
    monkeypatch.setenv("ATTNSCOPE_PEAK_GBPS", "400")
    attnscope.configure(device_peaks={"tflops": 1.0, "gbps": 2.0})
    restored = attnscope.configure(device_peaks=None).device_peaks
    assert dict(restored or {}) == {"tflops": 50.0, "gbps": 400.0}


def test_environment_gives_both_peaks() -> None:
    cfg = _config.from_env({"ATTNSCOPE_PEAK_TFLOPS": " 989.4 ", "ATTNSCOPE_PEAK_GBPS": "3350"})
    assert dict(cfg.device_peaks or {}) == {"tflops": 989.4, "gbps": 3350.0}
    assert _config.from_env({}).device_peaks is None


@pytest.mark.parametrize("env", [
    {"ATTNSCOPE_PEAK_TFLOPS": "100"},
    {"ATTNSCOPE_PEAK_GBPS": "100"},
    {"ATTNSCOPE_PEAK_TFLOPS": "lots", "ATTNSCOPE_PEAK_GBPS": "100"},
    {"ATTNSCOPE_PEAK_TFLOPS": "-1", "ATTNSCOPE_PEAK_GBPS": "100"},
    {"ATTNSCOPE_PEAK_TFLOPS": "nan", "ATTNSCOPE_PEAK_GBPS": "100"},
])
def test_bad_environment_raises_strict_and_warns_otherwise(env: dict[str, str]) -> None:
    with pytest.raises(ValueError, match="ATTNSCOPE_PEAK"):
        _config.from_env(env)
    warned: list[str] = []
    cfg = _config.from_env(env, strict=False, warn=lambda key, msg, fields: warned.append(key))
    assert cfg.device_peaks is None
    assert warned == ["env:ATTNSCOPE_PEAK"]


def test_bad_environment_on_first_use_warns_and_falls_back(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("ATTNSCOPE_PEAK_TFLOPS", "100")
    _api.reset_defaults()
    with caplog.at_level(logging.WARNING, logger="attnscope"):
        assert _api.current().device_peaks is None
    assert "ATTNSCOPE_PEAK" in caplog.text
    _api.reset_defaults()  # configure() reads the environment only while nothing is configured
    with pytest.raises(ValueError, match="ATTNSCOPE_PEAK_GBPS"):
        attnscope.configure()
