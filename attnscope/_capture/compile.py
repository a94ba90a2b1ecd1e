"""torch.compile and attnscope's wrappers: Dynamo inlines the user's function, never the wrapper.

Dynamo would otherwise trace the countdown and recompile whenever it changes. Plain function
wrappers are registered with ``torch.compiler.substitute_in_graph``, which needs Dynamo loaded;
importing it ourselves costs about a second, so registration waits until the program imports it:
a post-import hook registers pending wrappers the moment ``torch._dynamo`` is imported (usually
inside the program's first ``torch.compile``), and sets ``runtime.dynamo.loaded`` so method
wrappers start asking ``is_compiling()``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from collections.abc import Callable
from typing import Any

import torch

from .. import _log
from .._runtime import runtime
from . import graph_marks as _graph_marks
from .sampling import CallSite

__all__ = ["hide_from_dynamo", "is_compiling", "is_compiling_fn", "register_pending",
           "register_when_dynamo_loads"]


def is_compiling_fn() -> Callable[[], bool]:
    """``torch.compiler.is_compiling`` (or a stand-in that says False)."""
    try:
        import torch

        return torch.compiler.is_compiling
    except Exception:
        return lambda: False


def is_compiling() -> bool:
    try:
        return bool(torch.compiler.is_compiling())
    except Exception:
        return False


def hide_from_dynamo(wrapper: Callable[..., Any], fn: Callable[..., Any],
                     site: CallSite | None = None) -> None:
    """Make torch.compile inline ``fn`` where it meets ``wrapper`` (now, or once Dynamo loads);
    with ``site``, between the marks a CUDA graph of the compiled code captures
    (:mod:`.graph_marks`)."""
    runtime.dynamo.pending[wrapper] = fn if site is None else _marked(fn, site)
    register_when_dynamo_loads()


def _marked(fn: Callable[..., Any], site: CallSite) -> Callable[..., Any]:
    no, names, traced_call = _graph_marks.number(site), site.param_names, _graph_marks.traced_call

    def marked(*args: Any, **kwargs: Any) -> Any:
        return traced_call(no, names, fn, args, kwargs)

    return marked


def _call_through(fn: Callable[..., Any]) -> Callable[..., Any]:
    def through(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return through


def register_pending() -> None:
    """Register waiting wrappers once ``torch._dynamo`` is imported. Never raises."""
    pending = runtime.dynamo.pending
    if not pending or "torch._dynamo" not in sys.modules:
        return
    try:
        import torch

        substitute = getattr(torch.compiler, "substitute_in_graph", None)
    except Exception:
        substitute = None
    while pending:
        try:
            wrapper, fn = pending.popitem()
        except KeyError:
            return
        if substitute is None:
            continue
        try:
            substitute(wrapper, skip_signature_check=True)(_call_through(fn))
        except Exception as exc:
            _log.internal_error("dynamo-register", exc)


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
        runtime.dynamo.loaded = True  # method wrappers start asking is_compiling() from now on
        try:
            self._loader.exec_module(module)
        finally:
            _forget_dynamo_hook()
        try:
            _graph_marks.define()
            register_pending()
        except Exception as exc:
            _log.internal_error("dynamo-register", exc)


def register_when_dynamo_loads() -> None:
    """Register pending wrappers now if Dynamo is loaded, else right after it is imported."""
    if "torch._dynamo" in sys.modules:
        runtime.dynamo.loaded = True
        _graph_marks.define()
        register_pending()
    elif runtime.dynamo.hook is None:
        runtime.dynamo.hook = _AfterDynamoImport()
        sys.meta_path.insert(0, runtime.dynamo.hook)


def _forget_dynamo_hook() -> None:
    hook, runtime.dynamo.hook = runtime.dynamo.hook, None
    if hook is not None:
        try:
            sys.meta_path.remove(hook)
        except ValueError:
            pass
