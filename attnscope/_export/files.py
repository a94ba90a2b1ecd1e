"""The rules every trace file attnscope writes follows (``jaeger-json:`` and ``otlp-json:``).

- **Only regular files.** The path must be a regular file or not exist yet, and its directory
  must exist: attnscope creates no directories. Anything else at the path -- a directory, a
  device node, a FIFO, a socket, or a symbolic link wherever it points -- is refused with
  ``ValueError`` when the exporter is configured or built, and as a failed write (``OSError``)
  if it appears later. The same holds for the rotated files (``PATH.1`` ...) and ``PATH.lock``.
  attnscope never writes through a link: new files are opened with ``O_NOFOLLOW``/``O_EXCL`` and
  ``os.replace`` renames onto the path itself. (Directories above the file may be links: those
  are the directory the user chose.)
- **Usual permissions.** Files are created with mode ``0o666`` and the process umask applied by
  the kernel, as ``open()`` does: 0644 under umask 022.
- **One writer per file.** While an exporter lives it holds an exclusive ``flock`` on
  ``PATH.lock`` (taken without waiting; removed when the exporter shuts down). When another
  process holds it, the exporter writes ``PATH`` with its process id before the extension instead
  (``t.json`` -> ``t.1234.json``) and logs one warning. Without ``fcntl`` (Windows) there is no
  lock and no detection.

This module is pure: it logs nothing itself (callers pass ``warn``). The rules of a single path
and the one whole-file writer are :mod:`attnscope._safe_files`' (``_config`` checks a path with
them at ``configure()`` time without importing the exporters); they are named here too.
"""

from __future__ import annotations

import errno
import os
import weakref
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType

from .._safe_files import (
    check_target,
    describe,
    ensure_safe,
    kind_of,
    target_problem,
    write_all,
    write_bytes,
)

__all__ = ["Claim", "check_target", "claim", "describe", "ensure_safe", "open_append",
           "read_regular", "rotate", "same_file", "same_path", "write_all", "write_atomically"]

# (key, message, **fields), as attnscope._log.warn_once.
Warn = Callable[..., None]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOCTTY = getattr(os, "O_NOCTTY", 0)
_NONBLOCK = getattr(os, "O_NONBLOCK", 0)  # a FIFO must fail to open, not block the worker
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _NOCTTY | _NONBLOCK
_LOCK = os.O_RDWR | os.O_CREAT | _NOFOLLOW | _CLOEXEC | _NOCTTY | _NONBLOCK
_READ = os.O_RDONLY | _NOFOLLOW | _CLOEXEC | _NOCTTY | _NONBLOCK
_MODE = 0o666  # the kernel applies the umask
_LOCK_ATTEMPTS = 3
_PER_PROCESS_NAMES = 8  # t.<pid>.json, t.<pid>-2.json, ...


def write_atomically(path: str, data: bytes | Sequence[bytes | bytearray]) -> None:
    """Write ``data`` (or its pieces, in order) to a new file beside ``path``, fsync it and
    rename it onto ``path``.

    A reader sees the old file or the new one, never half of one. A failure leaves the old file
    and no temporary file behind, and raises (``OSError`` for anything but a regular file at
    ``path``: :func:`ensure_safe`).
    """
    write_bytes(path, data, mode=_MODE, durable=True, refuse=ensure_safe)


def open_append(path: str) -> int:
    """A descriptor appending to ``path`` (created if missing); refuses anything but a file."""
    ensure_safe(path)
    fd = os.open(path, _APPEND, _MODE)
    try:
        ensure_regular(fd, path)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_regular(path: str) -> bytes:
    """The contents of the regular file at ``path`` (never through a link, never a FIFO)."""
    fd = os.open(path, _READ)
    try:
        ensure_regular(fd, path)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file ``fd`` has open (False once it was removed,
    renamed away or replaced, or its directory was)."""
    return _same_file(fd, path)


def same_path(path: str, others: Iterable[str]) -> bool:
    """Whether ``path`` names the same file as one of ``others``, compared by
    ``(st_dev, st_ino)``: one file has many spellings (a linked directory, ``..``, a bind
    mount). False for a path that does not exist."""
    try:
        named = os.stat(path)
    except OSError:
        return False
    for other in others:
        if other == path:
            return True
        try:
            seen = os.stat(other)
        except OSError:
            continue
        if (seen.st_dev, seen.st_ino) == (named.st_dev, named.st_ino):
            return True
    return False


def ensure_regular(fd: int, path: str) -> None:
    kind = kind_of(os.fstat(fd).st_mode)
    if kind is not None:
        raise OSError(errno.EEXIST, f"refused: it is {kind}, not a regular file", path)


def rotate(path: str, backups: int) -> None:
    """``path`` -> ``path.1`` -> ``path.2`` ... up to ``backups``; ``backups=0`` deletes it."""
    if backups == 0:
        ensure_safe(path)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        return
    # path.(n-1) -> path.n first, so nothing is overwritten before it has moved.
    moves = [(f"{path}.{i}", f"{path}.{i + 1}") for i in range(backups - 1, 0, -1)]
    for src, dst in [*moves, (path, f"{path}.1")]:
        if os.path.lexists(src):
            ensure_safe(src)
            ensure_safe(dst)
            os.replace(src, dst)


class Claim:
    """The path an exporter writes, and the lock that makes it that file's only writer."""

    def __init__(self, path: str, requested: str, lock_fd: int | None) -> None:
        self.path = path
        self.requested = requested
        self.locked = lock_fd is not None
        # Also runs when the exporter is garbage-collected or at interpreter exit.
        self._finalizer = (weakref.finalize(self, _unlock, lock_fd, path + ".lock", os.getpid())
                           if lock_fd is not None else None)

    def release(self) -> None:
        """Remove the lock file and release the lock. Safe to call twice."""
        if self._finalizer is not None:
            self._finalizer()


def claim(path: str, warn: Warn) -> Claim:
    """Become the only writer of ``path``, or of a per-process path beside it (module docstring).

    Raises ``OSError`` if every candidate path is held by another writer or unusable.
    """
    fcntl = _fcntl()
    if fcntl is None:
        return Claim(path, path, None)
    stem, ext = os.path.splitext(path)
    pid = os.getpid()
    names = [path, f"{stem}.{pid}{ext}"]
    names += [f"{stem}.{pid}-{n}{ext}" for n in range(2, _PER_PROCESS_NAMES + 1)]
    for name in names:
        if target_problem(name) is not None:
            continue
        try:
            fd = _lock(fcntl, name + ".lock")
        except OSError as exc:
            warn("files.lock", "attnscope: cannot lock the trace file; a second process writing "
                 "it would not be noticed", path=name, error=describe(exc))
            return Claim(name, path, None)
        if fd is None:
            continue
        if name != path:
            warn("files.contended", "attnscope: another writer (another process, or an exporter "
                 "not shut down yet) holds this trace file; writing this process's own file "
                 "beside it", path=path, writing=name)
        return Claim(name, path, fd)
    raise OSError(errno.EBUSY, "every trace file name is held by another writer", path)


def _fcntl() -> ModuleType | None:
    try:
        import fcntl
    except ImportError:  # Windows: no lock, no detection
        return None
    return fcntl


def _lock(fcntl: ModuleType, lock_path: str) -> int | None:
    """A descriptor holding ``lock_path``'s exclusive lock; None while another writer holds it."""
    for _ in range(_LOCK_ATTEMPTS):
        ensure_safe(lock_path)
        fd = os.open(lock_path, _LOCK, _MODE)
        try:
            ensure_regular(fd, lock_path)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        # A writer that finishes deletes the lock file: ours must still be the one at the path.
        if _same_file(fd, lock_path):
            return fd
        os.close(fd)
    return None


def _same_file(fd: int, path: str) -> bool:
    try:
        held, named = os.fstat(fd), os.lstat(path)
    except OSError:
        return False
    return (held.st_dev, held.st_ino) == (named.st_dev, named.st_ino)


def _unlock(fd: int, lock_path: str, pid: int) -> None:
    try:
        # A forked child shares the parent's lock: it only closes its copy of the descriptor.
        if os.getpid() == pid and _same_file(fd, lock_path):
            os.unlink(lock_path)  # still locked, so nobody can take this file in between
    except OSError:
        pass
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
