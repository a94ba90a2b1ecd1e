"""The one way a command writes a file it was asked for (``--json``, ``--html``): checked before
the work, written after it, every failure one :class:`CLIError` line worded the same way."""

from __future__ import annotations

import os

from .._errors import CLIError

__all__ = ["check_output", "write_text"]


def check_output(path: str | None, option: str) -> None:
    """CLIError now, before any work, when the file an option names cannot be written: its
    directory is missing or not writable, or the path is a directory. ``None`` and ``-``
    (stdout) pass. Nothing is created or truncated."""
    if path is None or path == "-":
        return
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise CLIError(f"{option} {path}: is a directory")
    if not os.path.isdir(parent):
        raise CLIError(f"{option} {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK) or (os.path.exists(path)
                                                     and not os.access(path, os.W_OK)):
        raise CLIError(f"{option} {path}: cannot write there (permission denied)")


def write_text(path: str, text: str, option: str) -> None:
    """``text`` into the file ``path`` that ``option`` named."""
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise CLIError(f"{option} {path}: cannot write there ({exc.strerror or exc})") from None
