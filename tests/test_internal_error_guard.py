"""The suite's internal-error guard (tests/conftest.py): attnscope swallows its own errors by
design, so a test that logged one fails unless it declares that it expects one."""

from __future__ import annotations

import logging
import textwrap
from pathlib import Path

import pytest

pytest_plugins = ("pytester",)

_CONFTEST = Path(__file__).with_name("conftest.py")

_TESTS = textwrap.dedent(
    """
    import logging
    import threading
    import time

    import pytest
    import torch

    import attnscope
    from attnscope import _log
    from attnscope._worker import engine


    def test_undeclared():
        _log.internal_error("unit", ValueError("bad"))


    def test_undeclared_with_the_logger_off():
        logger = logging.getLogger("attnscope")
        logger.setLevel(logging.ERROR)  # no record: the count still tells
        try:
            _log.internal_error("unit", ValueError("bad"))
        finally:
            logger.setLevel(logging.NOTSET)


    @pytest.mark.internal_errors
    def test_marked():
        _log.internal_error("unit", ValueError("bad"))


    @pytest.mark.internal_errors("unit")
    def test_marked_for_its_stage():
        _log.internal_error("unit", ValueError("bad"))


    @pytest.mark.internal_errors("export")
    def test_marked_for_another_stage():
        _log.internal_error("unit", ValueError("bad"))


    def test_fixture(internal_errors):
        _log.internal_error("unit", ValueError("bad"))
        assert [r.attnscope["stage"] for r in internal_errors] == ["unit"]


    def test_none():
        pass


    def test_worker_logs_after_the_body_returned(monkeypatch):
        entered = threading.Event()

        def finish(*args, **kwargs):
            entered.set()
            time.sleep(0.3)  # the body has returned by now; the guard waits for the worker
            raise RuntimeError("late worker failure")

        monkeypatch.setattr(engine.Engine, "finish", finish)
        attnscope.configure(sample_rate=1.0, warmup_calls=0)

        @attnscope.trace
        def f(x):
            return x + 1

        f(torch.ones(1))
        assert entered.wait(30)
    """
)


def test_guard_fails_undeclared_internal_errors(pytester: pytest.Pytester,
                                                 internal_errors: list[logging.LogRecord]) -> None:
    # In-process: the inner tests' errors go to this process's "attnscope" logger too, hence this
    # test's own internal_errors fixture.
    pytester.makeconftest(_CONFTEST.read_text())
    pytester.makeini("[pytest]\nmarkers =\n    internal_errors(*stages): expected\n")
    pytester.makepyfile(test_inner=_TESTS)
    result = pytester.runpytest("-p", "no:cacheprovider", "-W", "error::pytest.PytestWarning")
    result.assert_outcomes(passed=8, errors=4)
    errors = {line.split("::")[1].split(" ")[0]
              for line in result.outlines if line.startswith("ERROR ")}
    assert errors == {"test_undeclared", "test_undeclared_with_the_logger_off",
                      "test_marked_for_another_stage", "test_worker_logs_after_the_body_returned"}
    out = result.stdout.str()
    assert "counted by stage: {'unit': 1}" in out
    assert "late worker failure" in out
    assert internal_errors  # the inner runs' records reached this process's logger
