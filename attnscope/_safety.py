"""Keep attnscope's own failures away from the host program.

Everything attnscope does around a user's call goes through :func:`internal_error` when it fails:
the error is counted, logged once per stage (then at most once a minute), and the call proceeds.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import structlog

__all__ = ["Guard", "internal_error", "warn_once", "error_count", "reset"]

_log = structlog.get_logger("attnscope")

# Rate-limit per key: one log line per key per interval, so a failing hot loop cannot flood logs.
_LOG_INTERVAL_S = 60.0

_lock = threading.Lock()
_last_logged: dict[str, float] = {}
_errors_by_stage: dict[str, int] = {}


def _should_log(key: str) -> bool:
    now = time.monotonic()
    with _lock:
        last = _last_logged.get(key)
        if last is not None and now - last < _LOG_INTERVAL_S:
            return False
        _last_logged[key] = now
        return True


def internal_error(stage: str, exc: BaseException) -> None:
    """Count an internal failure in ``stage`` and log it (rate-limited). Never raises."""
    try:
        with _lock:
            _errors_by_stage[stage] = _errors_by_stage.get(stage, 0) + 1
        if _should_log("error:" + stage):
            _log.warning(
                "attnscope internal error; the call proceeds uninstrumented",
                stage=stage,
                error=repr(exc),
                exc_info=exc,
            )
    except Exception:  # logging itself failed: nothing more we can safely do
        pass


def warn_once(key: str, message: str, **fields: object) -> None:
    """Log ``message`` at most once per minute for ``key``. Never raises."""
    try:
        if _should_log("warn:" + key):
            _log.warning(message, **fields)
    except Exception:
        pass


def error_count(stage: str | None = None) -> int:
    """Internal errors counted so far (all stages, or one)."""
    with _lock:
        if stage is None:
            return sum(_errors_by_stage.values())
        return _errors_by_stage.get(stage, 0)


def reset() -> None:
    """Forget counts and log history (tests)."""
    with _lock:
        _last_logged.clear()
        _errors_by_stage.clear()


class Guard:
    """``with Guard("stage"):`` swallows and reports internal errors from the block.

    Only for attnscope's own work: a user's call must never run inside it.
    """

    __slots__ = ("stage",)

    def __init__(self, stage: str) -> None:
        self.stage = stage

    def __enter__(self) -> None:
        return None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        if exc is None:
            return False
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: not ours to swallow
            return False
        internal_error(self.stage, exc)
        return True
