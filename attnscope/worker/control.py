"""The on-demand trigger's control file: written by ``attnscope trigger``, read by the worker.

Security model (docs/live.md, "Profile on demand"): no network listener and no signal. A
trigger is a small JSON file ``<pid>.trigger`` in a per-user directory (``trigger_dir``, default
``$XDG_RUNTIME_DIR/attnscope`` or ``<tmp>/attnscope-<uid>``). The worker trusts it only when the
directory is a real directory (not a link) owned by the process's user with no group or other
permissions (0700), and the file is a regular file (opened without following links) owned by the
same user, not writable by group or others, and at most ``MAX_BYTES``. Whoever passes those
checks is the process's own user (or root), who could attach a debugger anyway. The file is
consumed (removed) when read. The CLI writes it atomically (a 0600 temporary file in the same
directory, renamed), so the worker never reads half a file.

The worker looks for the file at most once per ``CHECK_EVERY_S``, when it is awake anyway
(captures to build): an idle worker is not woken for it, and the calling thread never reads it.
"""

from __future__ import annotations

import json
import os
import stat
import tempfile
import time
from collections.abc import Callable, Mapping

from .. import _log

__all__ = ["ControlFile", "default_dir", "trigger_path", "check_dir", "write", "read",
           "CHECK_EVERY_S", "MAX_BYTES", "MAX_CALLS", "MAX_PATTERN"]

CHECK_EVERY_S = 1.0
MAX_BYTES = 4096
MAX_CALLS = 10_000
MAX_PATTERN = 256
_SUFFIX = ".trigger"


def default_dir(environ: Mapping[str, str] | None = None) -> str:
    """``$XDG_RUNTIME_DIR/attnscope`` (a per-user directory by definition), else
    ``<tmp>/attnscope-<uid>``."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "attnscope")
    return os.path.join(_temp_root(env), f"attnscope-{os.getuid()}")


def _temp_root(env: Mapping[str, str]) -> str:
    """``TMPDIR`` / ``TEMP`` / ``TMP``, else ``/tmp``: without ``tempfile.gettempdir()``, whose
    first call probes directories under a module lock; a fork meanwhile (the worker polls while
    the program forks its DataLoader workers) leaves that lock held in the child for good."""
    if tempfile.tempdir:
        return tempfile.tempdir
    for name in ("TMPDIR", "TEMP", "TMP"):
        value = env.get(name, "")
        if value and os.path.isabs(value):
            return value
    return "/tmp"


def trigger_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{int(pid)}{_SUFFIX}")


def check_dir(directory: str) -> str | None:
    """Why ``directory`` cannot be trusted, or None."""
    try:
        st = os.lstat(directory)
    except FileNotFoundError:
        return "it does not exist"
    if not stat.S_ISDIR(st.st_mode):
        return "it is not a directory (or is a symbolic link)"
    if st.st_uid != os.getuid():
        return "it belongs to another user"
    if st.st_mode & 0o077:
        return f"its permissions are {stat.S_IMODE(st.st_mode):o}, not 700"
    return None


def write(directory: str, pid: int, calls: int, site: str) -> str:
    """Write a trigger for ``pid`` atomically; returns its path. ValueError: an unsafe directory."""
    os.makedirs(directory, mode=0o700, exist_ok=True)
    problem = check_dir(directory)
    if problem is not None:
        raise ValueError(f"{directory}: {problem}")
    body = json.dumps({"version": 1, "calls": int(calls), "site": site}).encode()
    fd, tmp = tempfile.mkstemp(prefix=f".{int(pid)}.", suffix=".tmp", dir=directory)  # 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
        path = trigger_path(directory, pid)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read(directory: str, pid: int) -> tuple[int, str] | None:
    """The trigger waiting for ``pid`` as ``(calls, site pattern)``, consumed; None when there
    is none. ValueError: a file or directory that is not to be trusted, or not a trigger."""
    path = trigger_path(directory, pid)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    problem = check_dir(directory)
    if problem is not None:
        raise ValueError(f"the directory {directory}: {problem}")
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022 \
            or st.st_size > MAX_BYTES:
        raise ValueError(f"{path} is not a regular file of this user, writable by it only, "
                         f"of at most {MAX_BYTES} bytes")
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    try:
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (st.st_dev, st.st_ino):
            raise ValueError(f"{path} was replaced while being read")
        raw = os.read(fd, MAX_BYTES + 1)
    finally:
        os.close(fd)
    os.unlink(path)  # consumed, good or bad: a bad one is not read again every second
    return _parse(raw, path)


def _parse(raw: bytes, path: str) -> tuple[int, str]:
    try:
        data = json.loads(raw.decode())
    except (UnicodeDecodeError, ValueError):
        raise ValueError(f"{path} is not a trigger (JSON)") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path} is not a trigger (JSON object)")
    calls, site = data.get("calls"), data.get("site", "*")
    if isinstance(calls, bool) or not isinstance(calls, int) or not 1 <= calls <= MAX_CALLS:
        raise ValueError(f"{path}: calls must be an integer from 1 to {MAX_CALLS}")
    if not isinstance(site, str) or not 1 <= len(site) <= MAX_PATTERN:
        raise ValueError(f"{path}: site must be a pattern of 1 to {MAX_PATTERN} characters")
    return calls, site


class ControlFile:
    """The worker's view of its trigger file: :meth:`poll` reads it at most once per
    ``every_s`` (on the worker's own wake-ups) and never raises."""

    def __init__(self, every_s: float = CHECK_EVERY_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._last = float("-inf")

    def poll(self, directory: str | None) -> tuple[int, str] | None:
        """The trigger in ``directory`` (None: :func:`default_dir`), if it is time to look."""
        now = self._clock()
        if now - self._last < self.every_s:
            return None
        self._last = now
        try:
            found = read(directory or default_dir(), os.getpid())
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
