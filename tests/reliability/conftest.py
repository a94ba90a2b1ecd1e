"""Fixtures of the reliability suite: the figures each test records, and its outcome."""

from __future__ import annotations

import time
from collections.abc import Generator, Iterator
from typing import Any

import pytest

from tests.reliability.harness import Figures, write_figures


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    report = outcome.get_result()
    if report.when == "call":
        item.stash[_REPORT] = report


_REPORT = pytest.StashKey[Any]()


@pytest.fixture
def figures(request: pytest.FixtureRequest) -> Iterator[Figures]:
    """Record this test's row of the figures table (``ATTNSCOPE_RELIABILITY_OUT``)."""
    fig = Figures()
    start = time.monotonic()
    yield fig
    report = request.node.stash.get(_REPORT, None)
    if report is None:
        outcome, reason = "error", "setup failed"
    elif report.passed:
        outcome, reason = "pass", ""
    elif report.skipped:
        outcome, reason = "skip", str(report.longrepr)[-300:]
    else:
        outcome = "FAIL"
        crash = getattr(report.longrepr, "reprcrash", None)
        reason = crash.message if crash is not None else str(report.longrepr)[-300:]
    write_figures(fig, request.node.nodeid, outcome, reason, time.monotonic() - start)
