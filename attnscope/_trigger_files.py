"""The on-demand trigger's files, their format and checks: ``<pid>.trigger`` written by
``attnscope trigger`` and read by the worker, ``<pid>.worker`` written by the worker and read by
the CLI. A leaf (it imports nothing of attnscope's), so the command that writes a trigger loads
neither side of the library.

Security model (docs/live.md, "Profile on demand"): no network listener and no signal. A
trigger is a small JSON file ``<pid>.trigger`` in a per-user directory (``trigger_dir``, default
``$XDG_RUNTIME_DIR/attnscope`` or ``<tmp>/attnscope-<uid>``). The worker trusts it only when the
directory is a real directory (not a link) owned by the process's user with no group or other
permissions (0700), and the file is a regular file (opened without following links) owned by the
same user, not writable by group or others, and at most ``MAX_BYTES``. Whoever passes those
checks is the process's own user (or root), who could attach a debugger anyway. The file is
consumed (removed) when read. The CLI writes it atomically (a 0600 temporary file in the same
directory, renamed), so the worker never reads half a file.

The worker looks for the file at most once per ``attnscope._worker.control.CHECK_EVERY_S``,
when it is awake anyway (captures to build): an idle worker is not woken for it, and the calling
thread never reads it.

**Who is listening.** At its first look the worker also writes ``<pid>.worker`` in the same
directory (:func:`advertise`): the CLI refuses to trigger a process without one (a ``sleep 300``
would never read its trigger). It holds the process's start time (``/proc``), so a dead process's
file is not mistaken for a new process that got the same pid; it is removed at exit, and each
advertisement removes those of processes that are gone (at most ``MAX_SWEEP`` looked at), so the
directory stays bounded even after crashes.

**Which directory.** Without ``$XDG_RUNTIME_DIR`` the default is in the shared temporary
directory, where another local user can create ``attnscope-<uid>`` first: such a directory (not
a 0700 directory of this user) is passed over for ``~/.cache/attnscope/control-<host>``, which
both the worker and the CLI pick the same way (:func:`default_dir`).
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import stat
import tempfile
from collections.abc import Mapping

__all__ = ["MAX_BYTES", "MAX_CALLS", "MAX_PATTERN", "MAX_SWEEP", "advertise", "advertised",
           "check_dir", "default_dir", "read", "trigger_path", "worker_path", "write"]

MAX_BYTES = 4096
MAX_CALLS = 10_000
MAX_PATTERN = 256
MAX_SWEEP = 256  # files of other processes one advertisement looks at
_SUFFIX = ".trigger"
_WORKER = ".worker"


def default_dir(environ: Mapping[str, str] | None = None) -> str:
    """``$XDG_RUNTIME_DIR/attnscope`` (a per-user directory by definition), else
    ``<tmp>/attnscope-<uid>``."""
    env = os.environ if environ is None else environ
    runtime = env.get("XDG_RUNTIME_DIR", "")
    if runtime and os.path.isabs(runtime):
        return os.path.join(runtime, "attnscope")
    shared = os.path.join(_temp_root(env), f"attnscope-{os.getuid()}")
    home = env.get("HOME", "")
    if not home or not os.path.isabs(home) or _missing_or_ours(shared):
        return shared
    # taken by someone else (or not 0700): a directory under this user's home instead
    return os.path.join(home, ".cache", "attnscope", f"control-{_host()}")


def _missing_or_ours(directory: str) -> bool:
    try:
        os.lstat(directory)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return check_dir(directory) is None


def _host() -> str:
    """This host's name, as a file name (a home directory may be shared by several hosts)."""
    name = "".join(c if c.isalnum() or c in "-_." else "_" for c in socket.gethostname())
    return name.strip(".")[:64] or "localhost"


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
    body = json.dumps({"version": 1, "calls": int(calls), "site": site}).encode()
    return _write_file(directory, pid, trigger_path(directory, pid), body)


def _write_file(directory: str, pid: int, path: str, body: bytes) -> str:
    os.makedirs(directory, mode=0o700, exist_ok=True)
    problem = check_dir(directory)
    if problem is not None:
        raise ValueError(f"{directory}: {problem}")
    fd, tmp = tempfile.mkstemp(prefix=f".{int(pid)}.", suffix=".tmp", dir=directory)  # 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(body)
            out.flush()
            os.fsync(out.fileno())
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


def worker_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"{int(pid)}{_WORKER}")


def _started(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat``), or None."""
    try:
        with open(f"/proc/{int(pid)}/stat", "rb") as f:
            raw = f.read(4096)
        return int(raw[raw.rindex(b")") + 2:].split()[19])  # field 22, after "(comm)"
    except (OSError, ValueError, IndexError):
        return None


def advertise(directory: str) -> str:
    """Say in ``directory`` that this process's worker reads its triggers; returns the path.
    Removed at exit; files of processes that are gone are removed now. ValueError: an unsafe
    directory; OSError: it cannot be written."""
    pid = os.getpid()
    if advertised(directory, pid):  # a later worker of this process: exit already removes it
        return worker_path(directory, pid)
    body = json.dumps({"version": 1, "pid": pid, "started": _started(pid)}).encode()
    path = _write_file(directory, pid, worker_path(directory, pid), body)
    atexit.register(_withdraw, path, pid)
    _sweep(directory, pid)
    return path


def _withdraw(path: str, pid: int) -> None:
    if os.getpid() != pid:  # a forked child's exit: the file is its parent's
        return
    try:
        os.unlink(path)
    except OSError:
        pass


def _sweep(directory: str, own: int) -> None:
    """Remove the advertisements of processes that no longer exist (bounded)."""
    try:
        with os.scandir(directory) as entries:
            names = [e.name for _, e in zip(range(MAX_SWEEP), entries, strict=False)]
    except OSError:
        return
    for name in names:
        stem = name.removesuffix(_WORKER)
        if stem == name or not stem.isdigit() or int(stem) == own:
            continue
        if not _alive(int(stem)):
            try:
                os.unlink(os.path.join(directory, name))
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's: alive
        return True
    return True


def advertised(directory: str, pid: int) -> bool:
    """Whether process ``pid`` has a worker reading its triggers in ``directory``: its
    advertisement is a regular file of this user there, written by that very process."""
    path = worker_path(directory, pid)
    try:
        st = os.lstat(path)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_size > MAX_BYTES:
            return False
        with open(path, "rb") as f:
            data = json.loads(f.read(MAX_BYTES).decode())
    except (OSError, ValueError, UnicodeDecodeError):
        return False
    if not isinstance(data, dict) or data.get("pid") != pid:
        return False
    started = data.get("started")
    return started is None or started == _started(pid)  # else: another process, same pid
