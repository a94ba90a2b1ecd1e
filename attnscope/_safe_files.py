"""Writing a file without writing through a link someone planted: how every file attnscope
writes (``run.json``, ``report.html``, ``--json``/``--html`` files, profiles, peaks) is written.

A user who can create names in a directory can plant a symbolic link at a name attnscope will
write (``run.json``, a profile's predictable name) and have attnscope overwrite the file it
points to, with the rights of whoever runs attnscope. So a file is written whole into a new
file of the same directory, created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name
(nothing planted can be there: the name must not exist), then renamed onto its name. A rename
replaces a link itself, never what it points to; a link already at the name is refused all the
same, so that the user hears of it (:class:`UnsafePath`).

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

__all__ = ["UnsafePath", "check_directory", "check_writable", "directory_problem",
           "write_bytes", "write_text"]

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC


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


def write_bytes(path: str | os.PathLike[str], data: bytes, *, mode: int = 0o666) -> None:
    """``data`` as the whole content of ``path``: a new file beside it, then renamed onto it.

    ``mode`` as for ``open()`` (the umask applies). :class:`UnsafePath` when a link is at
    ``path``; any ``OSError`` of the write; nothing is left behind on failure."""
    target = os.path.abspath(os.fspath(path))
    directory, name = os.path.split(target)
    tmp = os.path.join(directory, f".{name[:64]}.{secrets.token_hex(8)}.tmp")
    fd = os.open(tmp, _NEW_FILE, mode)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        _refuse_link(target)
        os.replace(tmp, target)  # (a link planted since is replaced, never followed)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


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
