"""Register attnscope's wrappers with Dynamo the moment ``torch._dynamo`` is imported.

The core wrapper is hidden from torch.compile with ``torch.compiler.substitute_in_graph``, which
needs Dynamo loaded; importing it ourselves costs about a second, so registration waits
(``_hotpath.register_pending_with_dynamo``). A post-import hook closes the gap between the
program's first ``import torch._dynamo`` (usually inside its first ``torch.compile``) and that
first trace.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

from . import _hotpath, _safety

__all__ = ["register_when_dynamo_loads"]


class _AfterDynamoImport(importlib.abc.MetaPathFinder):
    """Registers pending wrappers with Dynamo as soon as ``torch._dynamo`` has been imported.

    Wrappers can only be registered (``substitute_in_graph``) once Dynamo is loaded, and
    importing it ourselves costs about a second. Without this, a model instrumented before the
    program's first ``torch.compile`` would have its wrappers traced — graph breaks and
    recompiles — on that first compile. The finder answers for that one module only, delegates
    the actual loading, and removes itself after it ran.
    """

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != "torch._dynamo":
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return None
        spec.loader = _ThenRegister(loader)
        return spec


class _ThenRegister(importlib.abc.Loader):
    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        _hotpath._dynamo_loaded = True  # method wrappers start asking is_compiling() from now on
        try:
            self._loader.exec_module(module)
        finally:
            _forget_dynamo_hook()
        try:
            _hotpath.register_pending_with_dynamo()
        except Exception as exc:
            _safety.internal_error("dynamo-register", exc)


_dynamo_hook: _AfterDynamoImport | None = None


def register_when_dynamo_loads() -> None:
    """Register pending wrappers now if Dynamo is loaded, else right after it is imported."""
    global _dynamo_hook
    if "torch._dynamo" in sys.modules:
        _hotpath.register_pending_with_dynamo()
    elif _dynamo_hook is None:
        _dynamo_hook = _AfterDynamoImport()
        sys.meta_path.insert(0, _dynamo_hook)


def _forget_dynamo_hook() -> None:
    global _dynamo_hook
    if _dynamo_hook is not None:
        try:
            sys.meta_path.remove(_dynamo_hook)
        except ValueError:
            pass
        _dynamo_hook = None
