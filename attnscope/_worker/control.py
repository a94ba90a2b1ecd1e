"""The worker's side of the on-demand trigger: :class:`ControlFile` looks for this process's
trigger file (at most once per ``CHECK_EVERY_S``, on the worker's own wake-ups) and advertises the
worker at its first look. The files, their checks and the security model are in
:mod:`attnscope._trigger_files`, which ``attnscope trigger`` shares.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from .. import _log, _trigger_files

__all__ = ["CHECK_EVERY_S", "ControlFile"]

CHECK_EVERY_S = 1.0


class ControlFile:
    """The worker's view of its trigger file: :meth:`poll` reads it at most once per
    ``every_s`` (on the worker's own wake-ups) and never raises."""

    def __init__(self, every_s: float = CHECK_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last = float("-inf")
        self._advertised: tuple[int, str] | None = None  # (pid, directory)

    def poll(self, directory: str | None) -> tuple[int, str] | None:
        """The trigger in ``directory`` (None: the default directory), if it is time to look."""
        now = self._clock()
        if now - self._last < self.every_s:
            return None
        self._last = now
        directory = directory or _trigger_files.default_dir()
        if self._advertised != (os.getpid(), directory):  # the first look (or a forked child's)
            self._advertise(directory)
        try:
            found = _trigger_files.read(directory, os.getpid())
        except ValueError as exc:
            _log.warn_once("trigger-file", "attnscope: ignoring an on-demand trigger",
                           reason=str(exc))
            return None
        except OSError as exc:
            _log.internal_error("trigger-file", exc)
            return None
        if found is not None:
            _log.info_once("trigger:" + str(found), "attnscope: profiling on demand",
                           calls=found[0], site=found[1])
        return found

    def _advertise(self, directory: str) -> None:
        self._advertised = (os.getpid(), directory)  # tried once: a failure is not retried
        try:
            _trigger_files.advertise(directory)
        except ValueError as exc:
            _log.warn_once("trigger-dir", "attnscope: on-demand triggers cannot reach this "
                           "process (unsafe trigger directory)", reason=str(exc))
        except OSError as exc:
            _log.warn_once("trigger-dir", "attnscope: on-demand triggers cannot reach this "
                           "process (trigger directory not writable)",
                           directory=directory, reason=exc.strerror or str(exc))
