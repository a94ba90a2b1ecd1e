"""The one error the command line turns into a single stderr line and exit code 2."""

from __future__ import annotations

import argparse

__all__ = ["CLIError", "positive_int"]


class CLIError(Exception):
    """Bad input from the user (a missing file, a file that is not a trace, a bad size):
    ``main`` prints the message on one line, no traceback."""


def positive_int(text: str) -> int:
    """argparse type: an integer above zero (argparse reports the message with the usage)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value

