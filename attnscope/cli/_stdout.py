"""Standard output whose reader may go away (``attnscope report ... | head``).

A command piped into ``head`` finds its output's pipe closed part-way. Left alone, the first failed
write ends the command (rich exits 1 silently, ``print`` raises), and whatever came after its
printing is lost: the ``--json`` and ``--html`` files asked for, a diff's gate. Instead, once the
reader has gone, the rest of the output is dropped and the command does all of its work; it then
ends the way ``yes | head`` does, by SIGPIPE, so a pipeline under ``set -o pipefail`` sees that its
output was cut, not a success and not a tripped gate. A command that fails anyway keeps its own
exit code (a gate's 1 says more than the lost output).
"""

from __future__ import annotations

import contextlib
import os
from typing import Any, TextIO

__all__ = ["Dropping"]


class Dropping:
    """``stream`` (stdout) for the CLI's writes: a closed pipe turns later writes into nothing
    and sets ``gone``. Everything else is the stream's own."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self._stream.write(text)
            except BrokenPipeError:
                self._drop()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._drop()

    def _drop(self) -> None:
        self.gone = True
        # what the stream still buffers goes nowhere at exit, not into a second error
        with contextlib.suppress(OSError, ValueError, AttributeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, self._stream.fileno())
            finally:
                os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)
