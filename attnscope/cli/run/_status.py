"""What each process of the program tells ``attnscope run`` at its exit: how many calls it sampled
and what became of their spans.

Without it, a run that wrote no trace file could only guess why ("no attention call was
sampled"), when the spans may have been sampled and then failed to export (a link planted at a
trace file's name), or the program may have been killed before its exit flush. So the CLI opens
a pipe, leaves its write end open in the program (the fd and the pipe's inode in
``ATTNSCOPE_RUN_STATUS``), and each process of the program that attnscope set up writes one JSON
line of its counts there when it exits normally (``atexit``, after attnscope's own exit flush).
A process that inherited the variable but not the fd (``subprocess`` closes fds), or whose fd
now holds another file, writes nothing: the inode is checked first. The write end is
non-blocking (a full pipe loses a line rather than stalling an exit); the CLI reads what is
there once the program has ended, without waiting for processes still holding the pipe.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import sys
from collections.abc import Mapping
from typing import Any

__all__ = ["ENV_STATUS", "COUNTS", "Channel", "at_exit", "register", "compiled_line"]

ENV_STATUS = "ATTNSCOPE_RUN_STATUS"  # "<fd>:<inode>" of the pipe's write end, in the program
# stats() keys a process reports (docs/sampling.md: what each count means)
COUNTS = ("sampled", "captured", "emitted", "exported", "export_failed", "export_dropped",
          "export_in_flight", "dropped_queue_full", "worker_errors")
_MAX_READ = 1 << 20  # a million bytes of lines: ~5,000 processes' reports


class Channel:
    """The CLI's end: the pipe, the variable and fd to give the program (``pass_fds``), and its
    reports. Not POSIX (no ``pass_fds``): no pipe, no reports."""

    def __init__(self) -> None:
        self.env: dict[str, str] = {}
        self.pass_fds: tuple[int, ...] = ()
        self.read_fd = self.write_fd = -1
        if os.name != "posix":
            return
        self.read_fd, self.write_fd = os.pipe()
        os.set_blocking(self.read_fd, False)
        os.set_blocking(self.write_fd, False)  # (the open file description the program shares)
        self.env = {ENV_STATUS: f"{self.write_fd}:{os.fstat(self.write_fd).st_ino}"}
        self.pass_fds = (self.write_fd,)

    def started(self) -> None:
        """The program has its copy: the CLI's own write end is closed."""
        if self.write_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self.write_fd)
            self.write_fd = -1

    def reports(self) -> list[dict[str, Any]]:
        """Every whole line the program's processes wrote, parsed; closes the pipe."""
        if self.read_fd < 0:
            return []
        chunks, size = [], 0
        try:
            while size < _MAX_READ:
                data = os.read(self.read_fd, 65536)
                if not data:
                    break
                chunks.append(data)
                size += len(data)
        except BlockingIOError:  # nothing more now (a process still holding the pipe)
            pass
        except OSError:
            pass
        finally:
            self.started()
            with contextlib.suppress(OSError):
                os.close(self.read_fd)
            self.read_fd = -1
        out = []
        for line in b"".join(chunks).splitlines():
            with contextlib.suppress(ValueError):
                report = json.loads(line)
                if isinstance(report, dict):
                    out.append(report)
        return out


def register(environ: Mapping[str, str]) -> None:
    """In a process of the program: report at exit when the CLI gave a pipe. Registered before
    the first sampled call starts the worker, whose exit flush (registered then) runs first."""
    if environ.get(ENV_STATUS, "").strip():
        import atexit

        atexit.register(at_exit, dict(environ))


def at_exit(environ: Mapping[str, str]) -> None:
    """Write this process's counts to the CLI's pipe; never raises."""
    try:
        fd_text, _, inode = environ.get(ENV_STATUS, "").partition(":")
        fd = int(fd_text)
        st = os.fstat(fd)
        if not stat.S_ISFIFO(st.st_mode) or str(st.st_ino) != inode.strip():
            return  # not the CLI's pipe (closed, and the number reused)
        import attnscope

        counts = attnscope.stats()
        line = {"pid": os.getpid(), **{k: counts.get(k, 0) for k in COUNTS},
                "compiled_graphs": _compiled_graphs()}
        os.write(fd, (json.dumps(line) + "\n").encode())  # < PIPE_BUF: one atomic write
    except Exception:  # noqa: BLE001, S110  (an exit hook that raised would print a traceback)
        pass


def _compiled_graphs() -> int:
    """Graphs ``torch.compile`` made in this process (0 when Dynamo was never imported): the
    attention calls inside them are not traced (docs/instrument.md)."""
    utils = sys.modules.get("torch._dynamo.utils")
    try:
        return int(utils.counters["stats"]["unique_graphs"]) if utils is not None else 0
    except Exception:  # noqa: BLE001  (a torch whose counters are laid out otherwise)
        return 0


def compiled_line(reports: list[dict[str, Any]]) -> str | None:
    """What torch.compile hid from the trace, when the program's processes compiled any graph
    (their reports' ``compiled_graphs``)."""
    graphs = sum(r["compiled_graphs"] for r in reports if type(r.get("compiled_graphs")) is int)
    if graphs <= 0:
        return None
    return (f"torch.compile made {graphs} graph(s) in the program: attention inside compiled "
            "code is not traced (trace around the compiled call with attnscope.span, or leave "
            "the model uncompiled while measuring: docs/instrument.md, \"torch.compile, "
            "training, CUDA graphs\")")
