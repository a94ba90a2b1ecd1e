"""attnscope's one logger: structlog over the standard library logger ``attnscope``.

A library logs like a library: every line goes through ``logging.getLogger("attnscope")``, so the
application's logging configuration decides what is shown and where. attnscope adds no handler
and never writes to stdout: with no configuration at all, Python's last-resort handler prints
WARNING and above to stderr. One line per event, ``message key=value ...``, with the same
key/values in ``record.attnscope`` for structured handlers; tracebacks only when the logger is
enabled for DEBUG, as text (never local variables). structlog is imported on the first line
actually logged, not at import.

Everything attnscope does around a user's call reports failures through :func:`internal_error`:
counted, logged once per stage (then at most once a minute), and the call proceeds.
"""

from __future__ import annotations

import functools
import logging
import time
import traceback
from collections.abc import MutableMapping
from typing import Any

from ._state import state

__all__ = ["LOGGER_NAME", "internal_error", "warn_once", "info_once", "debug_once", "error_count",
           "logger"]

LOGGER_NAME = "attnscope"
# One line per key per interval, so a failing hot loop cannot flood the application's logs.
_LOG_INTERVAL_S = 60.0

logger = logging.getLogger(LOGGER_NAME)


def _should_log(key: str) -> bool:
    now = time.monotonic()
    with state.log_lock:
        last = state.last_logged.get(key)
        if last is not None and now - last < _LOG_INTERVAL_S:
            return False
        state.last_logged[key] = now
        return True


def _render(_: Any, __: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog's last processor: hand stdlib one line and the fields beside it."""
    message = str(event.pop("event", ""))
    exc = event.pop("exc_info", None)
    fields = {k: v for k, v in event.items() if not k.startswith("_")}
    line = " ".join([message, *(f"{k}={v!r}" if isinstance(v, str) else f"{k}={v}"
                                for k, v in fields.items())])
    # A traceback is many lines: only when asked for DEBUG. As text, never the exception: a
    # formatter given the frames (rich, structlog's) may print their local variables, the call's
    # tensors among them.
    if isinstance(exc, BaseException) and logger.isEnabledFor(logging.DEBUG):
        line += "\n" + "".join(traceback.format_exception(exc)).rstrip()
    return {"msg": line, "extra": {"attnscope": fields}}


@functools.cache
def _structlog() -> Any:
    import structlog

    return structlog.wrap_logger(logger, processors=[_render],
                                 wrapper_class=structlog.stdlib.BoundLogger)


def _emit(level: int, message: str, fields: dict[str, Any]) -> None:
    if not logger.isEnabledFor(level):
        return
    _structlog().log(level, message, **fields)


def internal_error(stage: str, exc: BaseException) -> None:
    """Count an internal failure in ``stage`` and log it (rate-limited). Never raises."""
    try:
        with state.log_lock:
            state.errors_by_stage[stage] = state.errors_by_stage.get(stage, 0) + 1
        if _should_log("error:" + stage):
            _emit(logging.WARNING, "attnscope internal error; the call proceeds uninstrumented",
                  {"stage": stage, "error": repr(exc)[:300], "exc_info": exc})
    except Exception:  # logging itself failed: nothing more we can safely do
        pass


def warn_once(key: str, message: str, **fields: object) -> None:
    """Log ``message`` as a WARNING at most once per minute for ``key``. Never raises."""
    _once(logging.WARNING, key, message, fields)


def info_once(key: str, message: str, **fields: object) -> None:
    """Worth knowing, nothing wrong: INFO, at most once per minute per key. Never raises."""
    _once(logging.INFO, key, message, fields)


def debug_once(key: str, message: str, **fields: object) -> None:
    """Normal operation worth a line when debugging: DEBUG, at most once per minute per key."""
    _once(logging.DEBUG, key, message, fields)


def _once(level: int, key: str, message: str, fields: dict[str, object]) -> None:
    try:
        if logger.isEnabledFor(level) and _should_log("log:" + key):
            _emit(level, message, dict(fields))
    except Exception:
        pass


def error_count(stage: str | None = None) -> int:
    """Internal errors counted so far (all stages, or one)."""
    with state.log_lock:
        if stage is None:
            return sum(state.errors_by_stage.values())
        return state.errors_by_stage.get(stage, 0)
