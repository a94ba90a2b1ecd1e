"""Taking a lock so that a Ctrl-C cannot leave it held by no one.

CPython runs a signal's handler once a call returns, before the caller stores what it returned:
after ``held = lock.acquire(False)`` a ``KeyboardInterrupt`` can leave the lock taken and
``held`` never set, so no ``finally`` knows to let it go. :func:`take` and :func:`call_into`
store the outcome from C (``list.extend`` over ``map``/``starmap``: no Python line runs between
the call and the store), so the caller's list says what happened, whatever was raised.

A ``finally`` that reads the list must decide without a call of its own (``if True in got:``),
for the same reason. A leaf: it imports nothing of attnscope's.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import starmap
from typing import Any, Protocol

__all__ = ["take", "call_into"]


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
