"""A forked child of a process whose profiler ran leaves without libkineto's exit-time join.

Once kineto has run a session, libkineto keeps a config-updater thread, which a forked child does
not have (fork copies only the calling thread). At the child's exit, C++ static destruction runs
``ConfigLoader::~ConfigLoader()``, which joins that thread: in the child the join waits for ever
(glibc waits for a thread id that is never cleared) or throws ``std::system_error`` (SIGABRT). A
plain ``torch.profiler`` session does the same to a forked child; attnscope, which profiles a few
calls unasked, must not.

In such a child (:func:`arm`, from ``os.register_at_fork``), C's exit handlers get two of ours,
registered after every static destructor of the libraries the parent loaded, so they run first:
``fcloseall()`` flushes C stdio as ``exit()`` would, then ``_exit(status)`` ends the child with the
status the program chose. Python's own exit (atexit, flushing ``sys.stdout``, attnscope's export)
has run to its end by then; what is skipped is C-level teardown of the parent's libraries, which a
forked child cannot run safely anyway. glibc's ``on_exit`` passes ``(status, arg)``: ``_exit``
reads only the first, ``fcloseall`` neither (extra arguments are harmless in the C calling
conventions of the platforms glibc runs on). Where libc has no ``on_exit`` (musl, macOS), nothing
is armed and the child exits as it would without attnscope.
"""

from __future__ import annotations

import ctypes
import os

from .. import _log
from .._runtime import runtime

__all__ = ["arm"]


def arm() -> None:
    """In a forked child: end through ``_exit`` after C stdio is flushed, if kineto ran. Never
    raises."""
    try:
        if not runtime.profiler.kineto_ran:
            return
        # the parent's kineto threads do not exist here: a session in this child would be the
        # first of a half-copied profiler, so the profile tier stays off (calls are timed)
        runtime.profiler.broken[False] = runtime.profiler.broken[True] = "forked child"
        libc = ctypes.CDLL(None)
        on_exit = getattr(libc, "on_exit", None)
        if on_exit is None or not hasattr(libc, "fcloseall"):
            return
        on_exit.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        on_exit.restype = ctypes.c_int
        # run in reverse order of registration: fcloseall first, then _exit
        for name in ("_exit", "fcloseall"):
            if on_exit(ctypes.cast(getattr(libc, name), ctypes.c_void_p), None) != 0:
                return
    except Exception as exc:  # noqa: BLE001  (a child must start whatever happens here)
        _log.internal_error("fork-exit", exc)


if hasattr(os, "register_at_fork"):  # after the runtime's handler: the child's state is fresh
    os.register_at_fork(after_in_child=arm)
