"""The one error the command line turns into a single stderr line and exit code 2."""

from __future__ import annotations

import os

__all__ = ["CLIError", "check_output", "positive_int"]


class CLIError(Exception):
    """Bad input from the user (a missing file, a file that is not a trace, a bad size):
    ``main`` prints the message on one line, no traceback."""


def positive_int(text: str) -> int:
    """argparse type: an integer above zero (argparse reports the message with the usage)."""
    import argparse

    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


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
