"""``attnscope run`` in the program's ``multiprocessing`` children: their spans reach their files.

attnscope exports what a process captured at its exit (``atexit``), and two ordinary ends of a
``multiprocessing`` child skip ``atexit`` altogether:

- a child of the ``fork`` start method leaves through ``os._exit()`` once its target returns
  (``multiprocessing.popen_fork``): no ``atexit`` handler runs;
- a ``Pool`` worker is ended by SIGTERM when its pool is terminated, which is what
  ``with Pool() as pool:`` does at the end of the block; SIGTERM's default action ends the
  process on the spot.

Both lost every span of the child, silently: the CLI then said nothing was captured. So in each
``multiprocessing`` child of a program under ``attnscope run`` (any start method):

- a ``multiprocessing.util.Finalize`` with an exit priority flushes: ``util._exit_function`` runs
  it as the child's last step, on every start method, after the target returned or raised;
- SIGTERM, while the program has set no handler of its own, flushes too (bounded, as at exit) and
  then ends the process by SIGTERM's default action, so the exit status a parent sees is
  unchanged (``-SIGTERM``).

A Python signal handler runs on the main thread only, and only once that thread runs bytecode
again. The kernel may hand a process's SIGTERM to any of its threads; handed to another thread
while the main one waits in ``sem_wait`` (a ``Pool`` worker waiting for its next task), the
handler never ran and the child, which SIGTERM's default action would have ended at once, lived
on. So a parked thread reads the signal wakeup fd (``signal.set_wakeup_fd``, where the program
has set none), which the interpreter writes whichever thread took the signal: if the main thread
has not taken the SIGTERM over within ``_HANDOVER_S``, that thread flushes and ends the process.

Set-up: ``multiprocessing.util.register_after_fork`` runs :func:`_in_child` in the bootstrap of
every forked child (``fork``, ``forkserver``: the registration is inherited). A spawned child runs
no after-fork hook, so :func:`watch` runs it at once there: while the child re-imports the main
module (``current_process()._inheriting``, before its bootstrap), or when torch was first
imported inside a child already running (``multiprocessing.parent_process()``).
The program's own main process is left as it is (docs/cli.md: a SIGTERM it does not handle ends
it without attnscope's exit flush).
"""

from __future__ import annotations

import _thread
import os
import signal
import sys
import threading
import time
from typing import Any

from ... import _log

__all__ = ["FLUSH_S", "watch"]

FLUSH_S = 5.0  # attnscope's exit bound (_worker/at_exit.py): a child gets the same
_EXIT_PRIORITY = 10  # Finalize priorities >= 0 run first in util._exit_function
_HANDOVER_S = 0.5  # how long the wakeup reader leaves a SIGTERM to the main thread's handler
_ONCE = _thread.allocate_lock()  # held by whichever of the two took the SIGTERM: one flush
_FLUSHING = threading.Lock()  # held by the one of the child's ends that exports (one at a time)
_WAKEUP: dict[str, int] = {}  # this process's wakeup pipe ("write"), inherited by forked children


def watch(anchor: object) -> None:
    """Set the children of this process up (``anchor`` lives as long as the session: the
    after-fork registry holds it weakly); this process too when it is a child."""
    import multiprocessing
    import multiprocessing.util

    multiprocessing.util.register_after_fork(anchor, _after_fork)
    # a spawned child re-importing the main module (its bootstrap runs no after-fork hook:
    # SpawnProcess._after_fork does nothing), or a child already running
    inheriting = getattr(multiprocessing.current_process(), "_inheriting", False)
    if inheriting or multiprocessing.parent_process() is not None:
        _in_child()


def _after_fork(anchor: object) -> None:
    _in_child()


def _in_child() -> None:
    """Flush at the child's last step and at a SIGTERM; never raises (a child's bootstrap that
    raised would end the child). Runs once per child: the after-fork hook runs in forked
    children's bootstrap, the direct call only where that hook did not run before."""
    try:
        import multiprocessing.util

        multiprocessing.util.Finalize(None, _flush, exitpriority=_EXIT_PRIORITY)
        handler = signal.getsignal(signal.SIGTERM)
        if handler is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _on_sigterm)
        if handler in (signal.SIG_DFL, _on_sigterm):  # a grandchild inherits ours: no reader
            if _ONCE.locked():  # forked while its parent was ending: this process is not
                _ONCE.release()
            _read_wakeups()
    except Exception as exc:  # noqa: BLE001  (ValueError: not the main thread, no handler)
        _log.internal_error("run.child", exc)


def _read_wakeups() -> None:
    """Park a thread on a new signal wakeup fd, unless the program has one of its own (asyncio:
    its loop wakes the main thread itself). A forked child inherits the parent's: replaced."""
    if not hasattr(signal, "pthread_kill"):  # not POSIX: no fork, no thread-directed delivery
        return
    read, write = os.pipe()
    os.set_blocking(write, False)  # the interpreter's write from a signal handler never waits
    previous = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    if previous not in (-1, _WAKEUP.get("write", -1)):
        signal.set_wakeup_fd(previous)
        os.close(read)
        os.close(write)
        return
    _WAKEUP["write"] = write
    threading.Thread(target=_on_wakeups, args=(read,), name="attnscope-sigterm",
                     daemon=True).start()


def _on_wakeups(read: int) -> None:
    """Each byte is a signal the interpreter took; a SIGTERM meant for our handler that the main
    thread does not take over in time is flushed and ended from here."""
    while True:
        try:
            data = os.read(read, 512)
        except OSError:
            return
        if not data:
            return
        if signal.SIGTERM not in data or signal.getsignal(signal.SIGTERM) is not _on_sigterm:
            continue
        deadline = time.monotonic() + _HANDOVER_S
        while not _ONCE.locked() and time.monotonic() < deadline:
            time.sleep(0.01)
        if _ONCE.acquire(blocking=False):
            _flush()
            _end_from_thread()


def _flush() -> None:
    """Export what this process captured and close its files (the process is ending). Where
    another end's export runs (the child's last step, or ``os._exit``'s: a pool worker given
    its sentinel is ending when the pool's SIGTERM reaches it), wait for that one instead: a
    flush finding nothing left to do would return at once, and the SIGTERM end that follows
    would cut the running export short (every span of such a worker was lost)."""
    deadline = time.monotonic() + FLUSH_S
    took = False
    try:
        took = _FLUSHING.acquire(timeout=FLUSH_S)
        import attnscope

        from ..._runtime import runtime

        if runtime.worker.exiting:  # the exit's export (atexit, os._exit) has begun
            runtime.worker.exit_done.wait(max(0.0, deadline - time.monotonic()))
            return
        attnscope.flush(FLUSH_S)  # (a shutdown alone may return with the last batch in flight)
        attnscope.shutdown(max(0.0, deadline - time.monotonic()))
    except BaseException as exc:  # noqa: BLE001  (the child's end goes on)
        _log.internal_error("run.child-flush", exc)
    finally:
        if took:
            _FLUSHING.release()


def _on_sigterm(signum: int, frame: Any) -> None:
    """Export on a helper thread, which then ends the process as SIGTERM would have.

    Not here, on the main thread: the handler may have interrupted it inside attnscope (a
    capture handed to the worker holds the worker's condition lock), and a flush from here would
    wait for that lock forever. The main thread goes on meanwhile, as it would have for the
    short while before a default SIGTERM ended it. ``_thread``: no lock of ``threading`` taken
    in a signal handler either."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process at once
    if not _ONCE.acquire(blocking=False):
        return  # the wakeup reader took it: it ends the process
    try:
        _thread.start_new_thread(_flush_then_end, ())
    except Exception:  # noqa: BLE001  (no thread: end as SIGTERM would have)
        _end()


def _flush_then_end() -> None:
    _flush()
    _end()


def _end() -> None:
    try:
        sys.stderr.flush()
    except Exception:  # noqa: BLE001, S110  (a closed stderr: nothing to flush)
        pass
    os.kill(os.getpid(), signal.SIGTERM)  # the default action now: the status is -SIGTERM


def _end_from_thread() -> None:
    """End as SIGTERM would have, from a thread other than the main one, where ``signal.signal``
    is refused: the disposition is reset under the interpreter (the process is ending)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
        libc.signal(signal.SIGTERM, 0)  # SIG_DFL
    except Exception:  # noqa: BLE001  (no libc: the closest end there is)
        os._exit(128 + signal.SIGTERM)
    _end()
