"""The host's exit status stays its own: an uncaught Ctrl-C still ends the process by SIGINT.

When the main module ends with an uncaught ``KeyboardInterrupt``, CPython sets a process-wide
flag (``_Py_UnhandledKeyboardInterrupt``; ``_PyRuntime.signals.unhandled_keyboard_interrupt``
from 3.12) and, after finalisation, ``Py_RunMain`` re-raises SIGINT with the default action, so a
shell sees 130 and stops its loop. But every ``exec``/``eval`` of a *source string* runs through
``run_eval_code_obj``, which clears that flag first, on any thread: a ``dataclass`` or
``namedtuple`` being created is such an ``exec``. attnscope's exit work does exactly that — it
imports the OpenTelemetry SDK: to write a file exporter's empty document when nothing was
sampled, and on the worker's thread, still building its pipeline when an early Ctrl-C came — so
the process then exited with status 1 (issue 20). The same happens without attnscope to any exit
hook that imports the SDK.

The flag cannot be read or set from Python, but ``run_eval_code_obj`` also *sets* it when the
code it ran ends with a ``KeyboardInterrupt``. :func:`at_exit` runs after attnscope's other exit
hooks (it is registered first) and, when the main module did end with an uncaught
``KeyboardInterrupt``, runs ``raise KeyboardInterrupt`` that way: the flag is as CPython left it,
and the rest of finalisation (the application's earlier exit hooks, buffered files) goes on. On an
interpreter that no longer works this way it changes nothing.
"""

from __future__ import annotations

import sys

from ._runtime import runtime

__all__ = ["at_exit", "main_ended_by_ctrl_c"]

# An import attnscope's threads began before the exit (the worker side: about 1 s on a loaded
# machine) is waited for this long at most, only after an uncaught Ctrl-C.
_IMPORT_WAIT_S = 3.0


def main_ended_by_ctrl_c() -> bool:
    """The main module (script, ``-c``, ``-m``) ended with an uncaught ``KeyboardInterrupt``.

    Read from what CPython's top level leaves when it prints the uncaught exception:
    ``sys.last_value``, whose traceback starts in the bottom frame of the main thread (nothing
    called it). A console (``code``, IPython) sets ``sys.last_value`` too, from a frame that was
    called, and an interactive session clears the flag at each statement: neither counts. Only
    exactly ``KeyboardInterrupt`` sets CPython's flag, not a subclass.
    """
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return False
    exc = getattr(sys, "last_exc", None) or getattr(sys, "last_value", None)
    if type(exc) is not KeyboardInterrupt:
        return False
    tb = exc.__traceback__ or getattr(sys, "last_traceback", None)
    return tb is not None and tb.tb_frame.f_back is None


def at_exit() -> None:
    """Registered at import, before attnscope's other exit hooks, so it runs after them. Never
    raises.

    attnscope's own threads may still import after this hook (the spare worker thread
    ``configure()`` starts imports the worker side, and the SDK, on its own): that would clear the
    flag again. Their imports run under ``runtime.worker.import_lock``: it is taken here (waiting at
    most ``_IMPORT_WAIT_S`` for one in progress) and kept, so none starts before the process ends.
    """
    try:
        if main_ended_by_ctrl_c():
            runtime.worker.import_lock.acquire(timeout=_IMPORT_WAIT_S)
            try:
                exec("raise KeyboardInterrupt", {})  # noqa: S102  (sets the flag; see above)
            except KeyboardInterrupt:
                pass
    except BaseException:
        pass
