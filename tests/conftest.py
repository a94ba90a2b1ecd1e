"""Shared fixtures: every test starts from a clean attnscope with no exporter on the network."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator

import pytest

# A shell without job control starts a background command (`pytest &`, a CI step run under
# `nohup`) with SIGINT ignored, and children inherit that: Python then installs no
# KeyboardInterrupt handler, and the tests that send a child Ctrl-C wait for one in vain. A
# handler of ours is reset to the default in every child, so children get the usual Ctrl-C.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Tests never send to a collector unless they configure one themselves.
os.environ.setdefault("ATTNSCOPE_EXPORTER", "none")
os.environ.setdefault("ATTNSCOPE_METRICS", "false")

_OURS = ("ATTNSCOPE_", "OTEL_")


@pytest.fixture(autouse=True)
def _clean_attnscope(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    from attnscope import _api

    for var in list(os.environ):
        if var.startswith(_OURS) and var not in ("ATTNSCOPE_EXPORTER", "ATTNSCOPE_METRICS"):
            monkeypatch.delenv(var, raising=False)
    from attnscope._state import state

    _api.reset_defaults()  # stops the worker, resets every piece of attnscope's state
    _api.current()
    # register_attention() classes outlive reset (they are user code's): a test's go with it
    registered = dict(state.attention_registry)
    yield
    state.attention_registry.clear()
    state.attention_registry.update(registered)
    _api.reset_defaults()
    _api.current()


@pytest.fixture
def bare_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """No OTEL_*/ATTNSCOPE_* variables at all, not even the suite's exporter/metrics defaults."""
    from attnscope import _api

    for var in list(os.environ):
        if var.startswith(_OURS):
            monkeypatch.delenv(var, raising=False)
    _api.reset_defaults()
    yield
