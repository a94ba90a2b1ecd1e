"""Ending the CLI by the signal that ended the program it ran (``attnscope run``).

A shell stops a loop at Ctrl-C only when the command it ran died by SIGINT, and a supervisor that
looks at ``WIFSIGNALED`` tells a crash from an exit the same way: an exit code of 128 + N says
neither. So once the program died by signal N and the CLI has said what it had to, the CLI sends
itself N with the default action in place. A signal whose default action dumps core (SIGSEGV,
SIGABRT) does so with a core limit of zero: the program's core, if any, is the one that matters.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

__all__ = ["end_by_signal"]


def end_by_signal(signum: int) -> None:
    """End this process by ``signum`` (its default action); returns only where that action does
    not end a process."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_CORE)
        resource.setrlimit(resource.RLIMIT_CORE, (0, hard))
    with contextlib.suppress(OSError, ValueError):  # (SIGKILL: no handler to reset)
        signal.signal(signum, signal.SIG_DFL)
    with contextlib.suppress(OSError, ValueError):
        if hasattr(signal, "pthread_sigmask"):
            signal.pthread_sigmask(signal.SIG_UNBLOCK, [signum])
    with contextlib.suppress(OSError):
        os.kill(os.getpid(), signum)
