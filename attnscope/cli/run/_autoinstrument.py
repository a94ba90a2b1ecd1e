"""``attnscope run`` inside the program's processes: models instrumented as the program builds them.

:func:`start` runs once torch is imported (``_bootstrap/sitecustomize.py`` watches for it):
attnscope is configured from the environment the CLI set (``ATTNSCOPE_*`` plus the output
directory), ``F.scaled_dot_product_attention`` is traced, and the constructors of torch's
attention classes are wrapped; :func:`patch_transformers` wraps ``PreTrainedModel.post_init``
once transformers' modeling code is imported.

Which module a model is instrumented from decides the span names (module paths), so each model
is instrumented once, from its outermost module:

- **transformers**: at the end of ``post_init()`` of a ``PreTrainedModel`` that is not itself
  being built inside another one (``LlamaModel`` inside ``LlamaForCausalLM`` waits for the outer
  one), with ``trace_model=True``. Any ``nn.MultiheadAttention`` inside is left to it.
- **torch** (``nn.MultiheadAttention``, ``nn.Transformer*``): a module built at top level (no
  other module's ``__init__`` running around it) is instrumented right away. One built inside
  another module's ``__init__`` (a user's ``Block`` or ``Model``) waits: the outermost module being
  built then is instrumented just before its first call (a global forward pre-hook, registered
  only while such a model waits, so steady-state calls keep torch's fast path).

Either way the program's own ``attnscope.instrument()`` calls are untouched; a module already
carrying wrappers (a deep copy of an instrumented layer, as ``nn.TransformerEncoder`` makes) is
put back first, so ``instrument()`` never sees a module twice.
"""

from __future__ import annotations

import functools
import glob
import os
import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch

from ... import _log
from ..._instrument import torch_nn

__all__ = ["Session", "patch_transformers", "start"]

# torch's classes that hold (or are) attention: their constructors are wrapped
_TORCH_CLASSES = ("MultiheadAttention", "TransformerEncoderLayer", "TransformerDecoderLayer",
                  "TransformerEncoder", "TransformerDecoder", "Transformer")
_MARK = "__attnscope_run__"
# module calls the first-call hook lets pass while a model waits before it gives up on it
_IDLE_CALLS = 20_000
_MAX_FRAMES = 256


class Session:
    """What one process's auto-instrumentation keeps: models waiting for their first call."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.waiting: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
        self.hook: Any = None  # torch's RemovableHandle while a model waits
        self.idle = 0

    # -- torch ------------------------------------------------------------------------------

    def torch_built(self, module: torch.nn.Module) -> None:
        """The end of a wrapped torch constructor (for a subclass: of torch's part)."""
        try:
            around = _being_built(module)
            if any(_is_pretrained(m) for m in around):
                return  # its transformers model instruments it
            if not around:
                _instrument_torch(module)
                return
            with self.lock:
                self.waiting.add(around[-1])
                if self.hook is None:
                    self.hook = torch.nn.modules.module.register_module_forward_pre_hook(
                        self._first_call)
        except Exception as err:
            _log.internal_error("run.instrument", err)

    def _first_call(self, module: torch.nn.Module, args: Any) -> None:
        try:
            if torch.compiler.is_compiling():
                return
            with self.lock:
                waiting = module in self.waiting
                if waiting:
                    self.waiting.discard(module)
                    self.idle = 0
                else:
                    self.idle += 1
                if (not self.waiting or self.idle > _IDLE_CALLS) and self.hook is not None:
                    self.hook.remove()  # torch iterates over a copy of its hooks: safe here
                    self.hook = None
            if waiting:
                _instrument_torch(module)
        except Exception as err:
            _log.internal_error("run.instrument", err)

    # -- transformers -------------------------------------------------------------------------

    def pretrained_built(self, model: torch.nn.Module) -> None:
        """After ``post_init()``: instrument the model unless an outer one is still being built."""
        import attnscope

        try:
            if any(_is_pretrained(m) for m in _being_built(model)):
                return
            if attnscope.instrumented_modules(model):
                return  # post_init() called again, or instrumented by the program itself
            attnscope.instrument(model, trace_model=True)
        except Exception as err:
            _log.internal_error("run.instrument", err)


def _is_pretrained(module: object) -> bool:
    modeling = sys.modules.get("transformers.modeling_utils")
    base = getattr(modeling, "PreTrainedModel", None)
    return base is not None and isinstance(module, base)


def _being_built(module: torch.nn.Module) -> list[torch.nn.Module]:
    """Other modules whose ``__init__`` is running around this point, innermost first."""
    found: list[torch.nn.Module] = []
    frame = sys._getframe(1)
    for _ in range(_MAX_FRAMES):
        frame = frame.f_back  # type: ignore[assignment]
        if frame is None:
            break
        code = frame.f_code
        if code.co_name != "__init__" or code.co_argcount < 1:
            continue
        this = frame.f_locals.get(code.co_varnames[0])
        if isinstance(this, torch.nn.Module) and this is not module \
                and not any(this is m for m in found):
            found.append(this)
    return found


def _instrument_torch(root: torch.nn.Module) -> None:
    """Instrument the ``nn.MultiheadAttention`` layers of ``root`` (not those of a transformers
    model inside it: that one did its own), after putting back wrappers copied from elsewhere."""
    import attnscope

    theirs: set[int] = set()
    for module in root.modules():
        if _is_pretrained(module):
            theirs.update(id(m) for m in module.modules())
    paths = []
    for path, module in root.named_modules():
        if id(module) in theirs:
            continue
        if attnscope.instrumented_modules(module) and isinstance(
                module, (torch.nn.MultiheadAttention, torch.nn.TransformerEncoderLayer)):
            attnscope.uninstrument(module)
        if torch_nn.is_multihead_attention(module):
            paths.append(glob.escape(path))
    if paths:
        attnscope.instrument(root, include=paths)


def _wrap_init(cls: type, after: Callable[[Any], None]) -> None:
    original = cls.__dict__.get("__init__")
    if original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        after(self)

    setattr(__init__, _MARK, True)
    type.__setattr__(cls, "__init__", __init__)


def patch_transformers(session: Session) -> None:
    """Wrap ``PreTrainedModel.post_init`` (once; later calls do nothing)."""
    modeling = sys.modules.get("transformers.modeling_utils")
    base = getattr(modeling, "PreTrainedModel", None)
    original = getattr(base, "__dict__", {}).get("post_init")
    if base is None or original is None or getattr(original, _MARK, False):
        return

    @functools.wraps(original)
    def post_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        session.pretrained_built(self)
        return result

    setattr(post_init, _MARK, True)
    type.__setattr__(base, "post_init", post_init)


def start(environ: dict[str, str] | None = None) -> Session | None:
    """Configure attnscope for ``attnscope run`` and start instrumenting; None when this process
    was not started under it. Raises what ``configure()`` raises for a bad setting."""
    import attnscope

    from ._output import ENV_DIR, ENV_SERVICE, RunExporter

    env = dict(os.environ if environ is None else environ)
    directory = env.get(ENV_DIR, "").strip()
    if not directory:
        return None
    from . import _status

    _status.register(env)  # before configure(): its exit hook runs after attnscope's flush
    settings: dict[str, Any] = {"exporter": RunExporter(directory, env)}
    service = env.get(ENV_SERVICE, "").strip()
    if service and not env.get("OTEL_SERVICE_NAME", "").strip():
        settings["service_name"] = service
    attnscope.configure(**settings)
    attnscope.instrument_sdpa()
    session = Session()
    for name in _TORCH_CLASSES:
        cls = getattr(torch.nn, name, None)
        if isinstance(cls, type):
            _wrap_init(cls, session.torch_built)
    patch_transformers(session)
    try:
        from . import _children

        _children.watch(session)  # multiprocessing children export before they end
    except Exception as err:  # noqa: BLE001  (the program's import goes on)
        _log.internal_error("run.child", err)
    return session
