"""Taking a lock so that a Ctrl-C cannot leave it held by no one.

CPython runs a signal's handler once a call returns, before the caller stores what it returned:
after ``held = lock.acquire(False)`` a ``KeyboardInterrupt`` can leave the lock taken and
``held`` never set, so no ``finally`` knows to let it go. :func:`take` and :func:`call_into`
store the outcome from C (``list.extend`` over ``map``/``starmap``: no Python line runs between
the call and the store), so the caller's list says what happened, whatever was raised.

A ``finally`` that reads the list must decide without a call of its own (``if True in got:``),
for the same reason. :func:`settle` runs a clean-up again when a Ctrl-C lands in it, for a second
Ctrl-C during the clean-up a first one started. A leaf: it imports nothing of attnscope's.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import starmap
from typing import Any, Protocol

__all__ = ["take", "call_into", "settle", "SETTLE_TRIES"]

# Interrupts one clean-up outlasts (a storm of SIGINTs on a loaded machine: two landed in one)
SETTLE_TRIES = 8


class _Lock(Protocol):
    def acquire(self, blocking: bool = ..., timeout: float = ...) -> bool: ...


def take(lock: _Lock, got: list[bool], timeout_s: float = 0.0) -> None:
    """Try to take ``lock`` (``timeout_s`` 0: without waiting), appending whether it was taken
    to ``got``, a list the caller made before: ``True in got`` after any exception, a Ctrl-C
    included, says the caller holds the lock."""
    blocking = timeout_s > 0
    got.extend(map(lock.acquire, (blocking,), (timeout_s if blocking else -1,)))


def call_into(done: list[Any], fn: Callable[..., Any], *args: Any) -> None:
    """Call ``fn(*args)`` and append what it returned to ``done`` (a list the caller made
    before): ``done`` is not empty after any exception if ``fn`` returned."""
    done.extend(starmap(fn, (args,)))


def settle(step: Callable[..., None], *args: Any) -> BaseException | None:
    """Run ``step(*args)`` until it returns, again after each interrupt (a ``BaseException`` that
    is not an ``Exception``) that lands in it, at most ``SETTLE_TRIES`` times in all. Returns the
    first interrupt, for the caller to raise once the clean-up is done; None if none landed.

    ``step`` must be safe to run again from any of its lines. An ``Exception`` out of it ends
    the tries and is raised at once: a bug, not an interrupt. The handler below calls nothing (a
    call is where CPython runs a signal handler, and one raising there would leave the loop).
    """
    first: BaseException | None = None
    tries = SETTLE_TRIES
    while tries:
        tries -= 1
        try:
            step(*args)
            return first
        except Exception:
            raise
        except BaseException as exc:  # noqa: BLE001  (kept, raised by the caller after)
            if first is None:
                first = exc
    return first
