"""Whether torch._dynamo is loaded, and the wrappers waiting for it (attnscope._capture.compile)."""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable
from importlib.abc import MetaPathFinder
from typing import Any

__all__ = ["DynamoWatch"]


class DynamoWatch:
    """Process-lifetime facts about Dynamo: ``reset()`` keeps them (wrappers and the import hook
    live in user code and in ``sys.meta_path``)."""

    def __init__(self) -> None:
        # Until the program imports Dynamo nothing can be compiling: method wrappers skip the
        # is_compiling() call (~50 ns) until capture.compile's import hook sets this.
        self.loaded = "torch._dynamo" in sys.modules
        # wrapper -> the function it wraps, until Dynamo loads; weak: a wrapper the program lets go
        # of (a runtime trace(fn) per request) leaves no trace here
        self.pending: weakref.WeakKeyDictionary[Callable[..., Any], Callable[..., Any]] = (
            weakref.WeakKeyDictionary())
        # the sys.meta_path finder that sees Dynamo's import
        self.hook: MetaPathFinder | None = None

    def reset(self) -> None:
        """Nothing: every field is a process-lifetime fact."""

    def after_fork(self) -> None:
        """Nothing: no lock, no thread."""
