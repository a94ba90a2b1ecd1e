"""attnscope: see what the attention layers of your PyTorch models cost, as OpenTelemetry spans."""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

from ._version import __version__

# the names as the type checker sees them; at run time see __getattr__ (spelt
# `_typing.TYPE_CHECKING` so that lint-imports, too, reads these as imports that never run)
if _typing.TYPE_CHECKING:
    from ._api import configure, flush, sampling, shutdown, stats, step, trace
    from ._capture.batch import batch
    from ._capture.block import Span, span
    from ._config import Config
    from ._instrument.model import (
        instrument,
        instrumented_modules,
        register_attention,
        uninstrument,
    )
    from ._instrument.sdpa import instrument_sdpa, uninstrument_sdpa

# Where each public name lives. The library imports torch (seconds), so `import attnscope`
# imports none of them: a process that only reads `attnscope.cli` (the console script, `attnscope
# report`, `--help`) never pays for it. The first use of any of them imports all of these
# modules, as `import attnscope` did before, so the library is wired up (the worker starter,
# the exit hook) the same whichever name is used first.
# No public name may be the name of a subpackage: importing ``attnscope.<pkg>.<module>`` binds
# ``attnscope.<pkg>`` to the package, and __getattr__ is then never asked for the function.
_MODEL = "._instrument.model"
_HOMES = {
    "configure": "._api", "flush": "._api", "sampling": "._api", "shutdown": "._api",
    "stats": "._api", "step": "._api", "trace": "._api", "Config": "._config",
    "Span": "._capture.block", "span": "._capture.block", "batch": "._capture.batch",
    "instrument": _MODEL,
    "instrumented_modules": _MODEL, "register_attention": _MODEL, "uninstrument": _MODEL,
    "instrument_sdpa": "._instrument.sdpa", "uninstrument_sdpa": "._instrument.sdpa",
}

__all__ = [
    "Config",
    "Span",
    "__version__",
    "batch",
    "configure",
    "flush",
    "instrument",
    "instrument_sdpa",
    "instrumented_modules",
    "rank",
    "register_attention",
    "sampling",
    "shutdown",
    "span",
    "stats",
    "step",
    "trace",
    "uninstrument",
    "uninstrument_sdpa",
    "world_size",
]


def __getattr__(name: str) -> _typing.Any:  # PEP 562: called only for names not bound yet
    # rank and world_size are read when asked: torch.distributed may initialise after import.
    if name in ("rank", "world_size"):
        from . import _dist

        return getattr(_dist, name)()
    if name in _HOMES:
        namespace = globals()
        for public, home in _HOMES.items():  # bound once: later reads are plain attributes
            namespace[public] = getattr(_importlib.import_module(home, __name__), public)
        return namespace[name]
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
