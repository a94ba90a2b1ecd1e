"""``attnscope run``'s start-up hook, imported by ``site`` as the module ``sitecustomize``.

It imports nothing heavy: it watches the imports of ``torch`` (and of attnscope itself, when the
program imports it) and of ``transformers.modeling_utils``; once torch is loaded, attnscope is
configured from the environment the CLI set and :mod:`attnscope.cli.run._autoinstrument` takes over.
A Python program that never imports torch pays only for this file. Any ``sitecustomize`` that was
on the path before this one is then run as well.

Under its own name (``attnscope.cli.run._bootstrap.sitecustomize``) importing it does nothing.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types
from typing import Any

__all__ = ["install"]

_TORCH = "torch"
_ATTNSCOPE = "attnscope"
_TRANSFORMERS = "transformers.modeling_utils"


def _initializing(name: str) -> bool:
    module = sys.modules.get(name)
    spec = getattr(module, "__spec__", None)
    return module is not None and bool(getattr(spec, "_initializing", False))


def _say(message: str) -> None:
    """One line on stderr: the CLI's own process cannot see this one's errors otherwise."""
    try:
        sys.stderr.write(f"attnscope run: {message}\n")
        sys.stderr.flush()
    except Exception:
        pass


class _Watcher(importlib.abc.MetaPathFinder):
    """Runs attnscope's set-up right after torch (or attnscope) finished importing, and the
    transformers patch after ``transformers.modeling_utils``; delegates the loading itself."""

    def __init__(self) -> None:
        self.started = False
        self.failed = False
        self.session: Any = None  # _autoinstrument.Session, once started

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in (_TORCH, _ATTNSCOPE, _TRANSFORMERS) or self.failed:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        spec.loader = _ThenCall(spec.loader, self)
        return spec

    def loaded(self, name: str) -> None:
        if self.failed:
            return
        if not self.started:
            # (the module just executed still reads as initializing: its import is finishing)
            if _TORCH not in sys.modules or name != _ATTNSCOPE and _initializing(_ATTNSCOPE):
                return  # attnscope is importing torch: its own hook comes after
            self.started = True
            try:
                from attnscope.cli.run import _autoinstrument
            except Exception as exc:
                self.failed = True
                _say(f"attnscope cannot be imported by {sys.executable} ({exc!r:.200}); "
                     "this process is not traced")
                return
            self.session = _guarded(_autoinstrument.start)
        elif name == _TRANSFORMERS and self.session is not None:
            from attnscope.cli.run import _autoinstrument

            _guarded(_autoinstrument.patch_transformers, self.session)


def _guarded(step: Any, *args: Any) -> Any:
    """The program's import goes on whatever happens here."""
    try:
        return step(*args)
    except Exception as exc:
        _say(f"could not set up tracing in this process ({exc!r:.200})")
        return None


class _ThenCall(importlib.abc.Loader):
    def __init__(self, loader: Any, watcher: _Watcher) -> None:
        self._loader = loader
        self._watcher = watcher

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        # The module keeps the real loader (resources, is_package ...); only this call was ours.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._watcher.loaded(module.__name__)


def _chain() -> None:
    """Run the ``sitecustomize`` this one shadows, if any (as ``site`` would have)."""
    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


def install() -> None:
    """Watch the imports; start at once when torch is already loaded. Then chain."""
    watcher = _Watcher()
    sys.meta_path.insert(0, watcher)
    if _TORCH in sys.modules:
        watcher.loaded(_TORCH)
    _chain()


if __name__ == "sitecustomize":
    install()
