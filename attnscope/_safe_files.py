"""Writing a file without writing through a link someone planted: how every file attnscope
writes (``run.json``, ``report.html``, ``--json``/``--html`` files, profiles, peaks) is written.

A user who can create names in a directory can plant a symbolic link at a name attnscope will
write (``run.json``, a profile's predictable name) and have attnscope overwrite the file it
points to, with the rights of whoever runs attnscope. So a file is written whole into a new
file of the same directory, created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name
(nothing planted can be there: the name must not exist), then renamed onto its name. A rename
replaces a link itself, never what it points to; a link already at the name is refused all the
same, so that the user hears of it (:class:`UnsafePath`).

A trace file (``jaeger-json:``/``otlp-json:``, :mod:`attnscope._export.files`) must moreover be
a regular file or not exist yet, in a directory that exists: :func:`check_target` when the
exporter is configured, :func:`ensure_safe` before each write (``OSError`` for a directory, a
device, a FIFO, a socket or a link at the name). Imports nothing of attnscope's: ``_config``
checks a file exporter's path with it at ``configure()`` time.

A directory attnscope fills with names of its own choosing (``attnscope run --out``,
``profile_dir``) must also be one nobody else can write in: owned by the user (or root), and
not writable by every user unless it is sticky as ``/tmp`` is (there, others cannot replace or
remove what the user created). The directories above it must not be writable by every user
either, unless sticky and the user's or root's (``/tmp/theirs/mine``: the owner of ``theirs``
could swap ``mine`` for a link after the check). A directory group-writable is accepted: a
user's own group on many systems (umask 002), and writes are link-safe whatever the directory.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Callable, Sequence

__all__ = ["UnsafePath", "check_directory", "check_target", "check_writable", "describe",
           "directory_problem", "ensure_safe", "kind_of", "target_problem", "write_all",
           "write_bytes", "write_pieces", "write_text"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISLNK, "a symbolic link"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISSOCK, "a socket"),
)


class UnsafePath(OSError):
    """A path attnscope refuses to write: a link at the file's name, or a directory others can
    write in. ``strerror`` says which, ``filename`` is the path."""


def directory_problem(directory: str | os.PathLike[str]) -> str | None:
    """Why another user could plant or replace files in ``directory``; None when nobody can.

    Raises ``OSError`` when the directory cannot be read (missing, not a directory)."""
    st = os.stat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), os.fspath(directory))
    geteuid = getattr(os, "geteuid", None)
    if geteuid is None:  # no POSIX owners (Windows): the rename rule alone
        return None
    trusted = (geteuid(), 0)
    if st.st_uid not in trusted:
        return f"owned by another user (uid {st.st_uid})"
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        return f"writable by every user (mode {stat.S_IMODE(st.st_mode):o})"
    real = os.path.realpath(directory)
    parent = os.path.dirname(real)
    while parent != real:  # up to the root, whose parent is itself
        up = os.stat(parent)
        if up.st_mode & stat.S_IWOTH and not (up.st_mode & stat.S_ISVTX
                                              and up.st_uid in trusted):
            return f"inside {parent}, which every user can write in"
        real, parent = parent, os.path.dirname(parent)
    return None


def check_directory(directory: str | os.PathLike[str]) -> None:
    """:class:`UnsafePath` when another user could plant or replace files in ``directory``."""
    problem = directory_problem(directory)
    if problem is not None:
        raise UnsafePath(errno.EPERM, problem, os.fspath(directory))


def check_writable(directory: str | os.PathLike[str]) -> None:
    """``check_directory``, then create (as :func:`write_bytes` would) and remove a file in it:
    ``OSError`` when that fails (permission, read-only, full)."""
    check_directory(directory)
    probe = os.path.join(directory, f".attnscope-probe.{secrets.token_hex(8)}")
    os.close(os.open(probe, _NEW_FILE, 0o600))
    os.unlink(probe)


def write_bytes(path: str | os.PathLike[str], data: bytes | Sequence[bytes | bytearray], *,
                mode: int = 0o666, durable: bool = False,
                refuse: Callable[[str], None] | None = None) -> None:
    """``data`` (or its pieces, in order) as the whole content of ``path``: a new file beside
    it, then renamed onto it.

    The one way attnscope writes a whole file. ``mode`` as for ``open()`` (the umask applies).
    ``durable``: the new file is fsync'd before the rename (a trace file: a reader sees the old
    one or the new one, never half of one). ``refuse(path)`` raises for what may not be at
    ``path``, checked before the new file is made and again before the rename; by default a
    link (:class:`UnsafePath`); :func:`ensure_safe` for a trace file. Any ``OSError`` of the
    write; nothing is left behind on failure."""
    target = os.path.abspath(os.fspath(path))
    check = _refuse_link if refuse is None else refuse
    named = target if refuse is None else os.fspath(path)  # as the errors have always named it
    check(named)
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name[:64]}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, _NEW_FILE, mode)
    try:
        try:
            if isinstance(data, bytes):
                write_all(fd, data)
            else:
                write_pieces(fd, data)
            if durable:
                os.fsync(fd)
        finally:
            os.close(fd)
        check(named)  # a rename would replace a directory entry of any kind
        os.replace(tmp, target)  # (a link planted since is replaced, never followed)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_all(fd: int, data: bytes | bytearray | memoryview) -> None:
    """All of ``data`` to ``fd`` (``os.write`` may write less than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


_PIECES_PER_CALL = 512  # below every platform's IOV_MAX (1024 on Linux)


def write_pieces(fd: int, pieces: Sequence[bytes | bytearray]) -> None:
    """All of ``pieces``, in order, to ``fd``: a few hundred to each ``os.writev`` (which holds
    no GIL while it writes: a document in pieces is never copied into one), what a call left
    unwritten one piece at a time."""
    writev = getattr(os, "writev", None)
    for start in range(0, len(pieces), _PIECES_PER_CALL):
        group = pieces[start:start + _PIECES_PER_CALL]
        done = writev(fd, group) if writev is not None else 0
        for piece in group:
            if done >= len(piece):
                done -= len(piece)
                continue
            write_all(fd, memoryview(piece)[done:])
            done = 0


def write_text(path: str | os.PathLike[str], text: str, *, mode: int = 0o666) -> None:
    """:func:`write_bytes` of ``text`` in UTF-8."""
    write_bytes(path, text.encode("utf-8"), mode=mode)


def _refuse_link(target: str) -> None:
    try:
        st = os.lstat(target)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise UnsafePath(errno.ELOOP, "a symbolic link is there (attnscope does not write "
                         "through links)", target)


# ---- trace files: regular files only -----------------------------------------------------


def kind_of(mode: int) -> str | None:
    """None for a regular file, else what a path of this ``st_mode`` is."""
    if stat.S_ISREG(mode):
        return None
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def describe(exc: BaseException) -> str:
    """``ENOSPC: No space left on device`` for an OSError; the repr, bounded, otherwise."""
    if isinstance(exc, OSError) and exc.errno is not None:
        name = errno.errorcode.get(exc.errno, str(exc.errno))
        return f"{name}: {exc.strerror or exc}"
    return repr(exc)[:300]


def target_problem(path: str) -> str | None:
    """Why ``path`` cannot be a trace file, or None. Permissions are left to the writes."""
    if not path:
        return "the path is empty"
    try:
        kind = kind_of(os.lstat(path).st_mode)
    except FileNotFoundError:
        directory = os.path.dirname(path) or "."
        if not os.path.isdir(directory):
            return (f"{path!r}: its directory does not exist or is not a directory "
                    f"(attnscope creates no directories)")
        return None
    except OSError as exc:
        return f"{path!r} cannot be used: {describe(exc)}"
    if kind is None:
        return None
    return f"{path!r} is {kind}, not a regular file (attnscope writes regular files only)"


def check_target(path: str, setting: str) -> None:
    """Raise ``ValueError`` naming ``setting`` when ``path`` cannot be a trace file."""
    problem = target_problem(path)
    if problem is not None:
        raise ValueError(f"attnscope: {setting}: {problem}")


def ensure_safe(path: str) -> None:
    """Raise ``OSError`` unless ``path`` is missing or a regular file.

    Checked before each write.
    """
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    kind = kind_of(mode)
    if kind is not None:
        code = errno.EISDIR if stat.S_ISDIR(mode) else errno.EEXIST
        raise OSError(code, f"refused: it is {kind}, not a regular file", path)
