"""The one way a command writes a file it was asked for (``--json``, ``--html``): checked before
the work, written after it, every failure one :class:`CLIError` line worded the same way.

Written as every file of attnscope is (:mod:`attnscope._safe_files`): whole into a new file beside
it, then renamed onto the name; a symbolic link at the name is refused, never written through."""

from __future__ import annotations

import os
import stat

from ... import _safe_files
from .._errors import CLIError

__all__ = ["check_output", "write_text"]


def check_output(path: str | None, option: str) -> None:
    """CLIError now, before any work, when the file an option names cannot be written: its
    directory is missing or not writable, or the path is a directory. ``None`` and ``-``
    (stdout) pass; a symbolic link at the path is refused. Nothing is created or truncated."""
    if path is None or path == "-":
        return
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.islink(path):
        raise CLIError(f"{option} {path}: a symbolic link is there (attnscope does not write "
                       "through links)")
    if os.path.isdir(path):
        raise CLIError(f"{option} {path}: is a directory")
    if not os.path.isdir(parent):
        raise CLIError(f"{option} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path)
                                                     and not os.access(path, os.W_OK)):
        raise CLIError(f"{option} {path}: cannot write there (permission denied)")


def write_text(path: str, text: str, option: str) -> None:
    """``text`` into the file ``path`` that ``option`` named (replaced whole, never through a
    link)."""
    try:
        if _is_device(path):  # /dev/null, a named pipe: written in place (no rename there)
            with open(os.open(path, os.O_WRONLY | getattr(os, "O_NOFOLLOW", 0)), "w",
                      encoding="utf-8") as f:
                f.write(text)
        else:
            _safe_files.write_text(path, text)
    except OSError as exc:
        raise CLIError(f"{option} {path}: cannot write there ({exc.strerror or exc})") from None


def _is_device(path: str) -> bool:
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        return False
    return stat.S_ISCHR(mode) or stat.S_ISFIFO(mode)
