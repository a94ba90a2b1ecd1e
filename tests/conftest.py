"""Shared fixtures: every test starts from a clean attnscope with no exporter on the network."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

# Tests never send to a collector unless they configure one themselves.
os.environ.setdefault("ATTNSCOPE_EXPORTER", "none")
os.environ.setdefault("ATTNSCOPE_METRICS", "false")

_OURS = ("ATTNSCOPE_", "OTEL_")


@pytest.fixture(autouse=True)
def _clean_attnscope(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from attnscope import _config, _safety, _worker

    for var in list(os.environ):
        if var.startswith(_OURS) and var not in ("ATTNSCOPE_EXPORTER", "ATTNSCOPE_METRICS"):
            monkeypatch.delenv(var, raising=False)
    _worker.shutdown(timeout_s=5.0)
    _config.reset_defaults()
    _config.current()
    _safety.reset()
    yield
    _worker.shutdown(timeout_s=5.0)
    _config.reset_defaults()
    _config.current()
    _safety.reset()


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTEL_*/ATTNSCOPE_* variables at all, not even the suite's exporter/metrics defaults."""
    from attnscope import _config

    for var in list(os.environ):
        if var.startswith(_OURS):
            monkeypatch.delenv(var, raising=False)
    _config.reset_defaults()
    yield
