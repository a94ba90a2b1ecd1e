"""``attnscope trigger``: ask a running process to profile its next sampled calls.

Writes the control file the process's worker reads (``attnscope._trigger_files``; the security
model is in docs/live.md): nothing is sent over a network and no signal is delivered. The
process picks the request up at its worker's next wake-up (at most a second after a sampled call).
A process whose worker has not advertised itself in the directory (``<pid>.worker``: a process
that does not run attnscope, or has not sampled a call yet) is refused: nothing would read it.
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from .. import _trigger_files as trigger_files
from ._errors import CLIError, positive_int

__all__ = ["register"]


def _main(args: argparse.Namespace) -> int:
    pid: int = args.pid
    if args.calls > trigger_files.MAX_CALLS:
        raise CLIError(f"--calls must be at most {trigger_files.MAX_CALLS}, got {args.calls}")
    if not 1 <= len(args.site) <= trigger_files.MAX_PATTERN:
        raise CLIError(f"--site must be 1 to {trigger_files.MAX_PATTERN} characters")
    try:
        os.kill(pid, 0)  # no signal is sent: only whether the process exists and is ours
    except ProcessLookupError:
        raise CLIError(f"no process with pid {pid}") from None
    except PermissionError:
        raise CLIError(f"process {pid} belongs to another user: run attnscope trigger as "
                       f"that user (the trigger directory is per user)") from None
    directory = args.dir or os.environ.get("ATTNSCOPE_TRIGGER_DIR") or trigger_files.default_dir()
    if not trigger_files.advertised(directory, pid):
        raise CLIError(f"process {pid} has no attnscope worker listening in {directory} (not "
                       f"traced by attnscope, live_trigger off, another trigger directory, or "
                       f"nothing sampled yet): nothing would read the trigger")
    try:
        path = trigger_files.write(directory, pid, args.calls, args.site)
    except ValueError as exc:
        raise CLIError(f"refusing an unsafe trigger directory {exc}") from None
    except OSError as exc:
        raise CLIError(f"cannot write the trigger in {directory}: {exc.strerror or exc}") from None
    print(f"attnscope trigger: {path}: the next {args.calls} sampled call(s) of sites matching "
          f"{args.site!r} in process {pid} will be profiled, once its worker next wakes up")
    return 0


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope trigger`` to the command line."""
    parser = sub.add_parser(
        "trigger", formatter_class=formatter,
        help="profile the next sampled calls of a running process (no restart)",
        description="Ask a running process traced by attnscope to profile its next N sampled "
                    "calls (of all call sites, or of those whose name matches --site), through a "
                    "control file in a per-user 0700 directory that only the process's own user "
                    "can write (see docs/live.md). Run it as the process's user, on its host.")
    parser.add_argument("--pid", type=positive_int, required=True, help="the process to profile")
    parser.add_argument("--calls", type=positive_int, default=10,
                        help="how many sampled calls to profile")
    parser.add_argument("--site", default="*",
                        help="glob on the call site's name or key (e.g. '*Attention*')")
    parser.add_argument("--dir", default=None,
                        help="trigger directory (default: $ATTNSCOPE_TRIGGER_DIR, else "
                             "$XDG_RUNTIME_DIR/attnscope, else <tmp>/attnscope-<uid>)")
    parser.set_defaults(func=_main)
