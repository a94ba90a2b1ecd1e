"""attnscope's one logger: structlog over the standard library logger ``attnscope``.

A library logs like a library: every line goes through ``logging.getLogger("attnscope")``, so the
application's logging configuration decides what is shown and where. attnscope adds no handler
and never writes to stdout: with no configuration at all, Python's last-resort handler prints
WARNING and above to stderr. One line per event, a sentence for people; its fields are attributes
of the record (and together in ``record.attnscope``) for structured handlers; tracebacks only when
the logger is enabled for DEBUG, as text (never local variables). structlog is imported on the
first line actually logged, not at import.

Everything attnscope does around a user's call reports failures through :func:`internal_error`:
counted, logged once per stage (then at most once a minute), and the call proceeds.

A leaf: it imports nothing of attnscope, so every module may log. Its own process state (the rate
limits and the error counts) is :data:`limits`, which the runtime resets and renews after a fork
(:mod:`attnscope._runtime`).
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
import traceback
from collections.abc import MutableMapping
from typing import Any

__all__ = ["LOGGER_NAME", "LogLimits", "internal_error", "warn_once", "info_once", "debug_once",
           "error_count", "limits", "logger"]

LOGGER_NAME = "attnscope"
# One line per key per interval, so a failing hot loop cannot flood the application's logs.
_LOG_INTERVAL_S = 60.0

logger = logging.getLogger(LOGGER_NAME)


class LogLimits:
    """When each key last logged (the rate limit) and the internal errors counted per stage."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """Forget every key and count (tests, through the runtime's reset)."""
        self.lock = threading.Lock()
        self.last_logged: dict[str, float] = {}
        self.errors_by_stage: dict[str, int] = {}

    def after_fork(self) -> None:
        """A new lock: another parent thread may have held this one at the fork."""
        self.lock = threading.Lock()


# The one instance; the runtime (attnscope._runtime) resets it and renews its lock after a fork.
limits = LogLimits()


def _should_log(key: str) -> bool:
    now = time.monotonic()
    with limits.lock:
        last = limits.last_logged.get(key)
        if last is not None and now - last < _LOG_INTERVAL_S:
            return False
        limits.last_logged[key] = now
        return True


# A field cannot be a LogRecord attribute of the same name (makeRecord refuses to overwrite one):
# such a field is in ``record.attnscope`` only.
_RECORD_NAMES = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message", "asctime", "attnscope"}


def _stated(value: Any, message: str) -> bool:
    """The message already says ``value`` (as a word of its own, not inside another)."""
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        return False
    text = str(value)
    return bool(text) and re.search(rf"(?<![\w.]){re.escape(text)}(?!\w)", message) is not None


def _render(_: Any, __: str, event: MutableMapping[str, Any]) -> dict[str, Any]:
    """structlog's last processor: hand stdlib one sentence, and the fields as the record's
    attributes (and together in ``record.attnscope``) for structured handlers.

    The sentence says what matters itself; a field it does not state yet (a path, an error) is
    added in words at its end, in parentheses, never as ``key=value`` (issue 38 §3).
    """
    message = str(event.pop("event", ""))
    exc = event.pop("exc_info", None)
    fields = {k: v for k, v in event.items() if not k.startswith("_")}
    unstated = [f"{k.replace('_', ' ')}: {v!r}" for k, v in fields.items()
                if not _stated(v, message)]
    line = f"{message} ({'; '.join(unstated)})" if unstated else message
    # A traceback is many lines: only when asked for DEBUG. As text, never the exception: a
    # formatter given the frames (rich, structlog's) may print their local variables, the call's
    # tensors among them.
    if isinstance(exc, BaseException) and logger.isEnabledFor(logging.DEBUG):
        line += "\n" + "".join(traceback.format_exception(exc)).rstrip()
    extra = {k: v for k, v in fields.items() if k not in _RECORD_NAMES}
    extra["attnscope"] = fields
    return {"msg": line, "extra": extra}


@functools.cache
def _structlog() -> Any:
    import structlog

    return structlog.wrap_logger(logger, processors=[_render],
                                 wrapper_class=structlog.stdlib.BoundLogger)


def preload() -> None:
    """Import structlog now, on a thread of attnscope's at set-up (the spare worker thread, the
    worker's): the first line logged is often logged on a user's call (the overhead budget's, a
    full queue's), which then paid for the import, 45 ms with rich installed. Never raises."""
    try:
        _structlog()
    except Exception:  # noqa: BLE001  (the first line imports it, or says nothing, as before)
        pass


def _emit(level: int, message: str, fields: dict[str, Any]) -> None:
    if not logger.isEnabledFor(level):
        return
    _structlog().log(level, message, **fields)


def internal_error(stage: str, exc: BaseException) -> None:
    """Count an internal failure in ``stage`` and log it (rate-limited). Never raises."""
    try:
        with limits.lock:
            limits.errors_by_stage[stage] = limits.errors_by_stage.get(stage, 0) + 1
        if _should_log("error:" + stage):
            error = repr(exc)[:300]
            _emit(logging.WARNING, f"attnscope internal error in {stage}: {error}; the call "
                  "proceeds uninstrumented", {"stage": stage, "error": error, "exc_info": exc})
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
    with limits.lock:
        if stage is None:
            return sum(limits.errors_by_stage.values())
        return limits.errors_by_stage.get(stage, 0)
