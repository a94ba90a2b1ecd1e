"""attnscope: see what the attention layers of your PyTorch models cost, as OpenTelemetry spans."""

from __future__ import annotations

import sys as _sys
from typing import Any as _Any

from ._version import __version__

# Where each public name lives: imported now, or (see below) on first use.
_HOMES = {
    "configure": "._api", "flush": "._api", "sampling": "._api", "shutdown": "._api",
    "stats": "._api", "step": "._api", "trace": "._api", "Config": "._config",
    "Span": ".capture.block", "span": ".capture.block", "instrument": ".instrument.model",
    "instrumented_modules": ".instrument.model", "register_attention": ".instrument.model",
    "uninstrument": ".instrument.model", "instrument_sdpa": ".instrument.sdpa",
    "uninstrument_sdpa": ".instrument.sdpa",
}
# `attnscope` commands whose own process never uses the library (they read files, write a
# trigger, or start the program that does): no torch for them
_LIGHT_COMMANDS = ("trigger", "run", "report", "diff", "-h", "--help", "--version")


def _light_cli(argv: list[str]) -> bool:
    """True when this interpreter runs the ``attnscope`` command line (the console script,
    ``python -m attnscope`` or ``-m attnscope.cli``) for a command in ``_LIGHT_COMMANDS``."""
    skip = False
    for i, arg in enumerate(argv[1:], start=1):
        if skip or arg in ("-X", "-W", "--check-hash-based-pycs"):  # an option and its value
            skip = not skip
            continue
        if arg == "-m":
            rest = argv[i + 1:]
            if rest[:1] in (["attnscope"], ["attnscope.cli"]):
                return len(rest) > 1 and rest[1] in _LIGHT_COMMANDS
            return False
        if not arg.startswith("-"):  # a script: the console script is named attnscope
            name = arg.replace("\\", "/").rsplit("/", 1)[-1]
            return name in ("attnscope", "attnscope.exe") and len(argv) > i + 1 \
                and argv[i + 1] in _LIGHT_COMMANDS
    return False


# The library imports torch. The commands in _LIGHT_COMMANDS do not need it: their process
# skips these imports (the names still resolve, on first use, through __getattr__), so they start
# in milliseconds instead of the second or more of torch's import, and `attnscope run` does not
# log the library's import-time warnings about ATTNSCOPE_* values it reports itself. Every other
# process imports them now, as always.
if not _light_cli(list(getattr(_sys, "orig_argv", ()))):
    from ._api import configure, flush, sampling, shutdown, stats, step, trace
    from ._config import Config
    from .capture.block import Span, span
    from .instrument.model import (
        instrument,
        instrumented_modules,
        register_attention,
        uninstrument,
    )
    from .instrument.sdpa import instrument_sdpa, uninstrument_sdpa

__all__ = [
    "Config",
    "Span",
    "__version__",
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


def __getattr__(name: str) -> _Any:
    # rank and world_size are read when asked: torch.distributed may initialise after import.
    if name in ("rank", "world_size"):
        from . import _dist

        return getattr(_dist, name)()
    if name in _HOMES:  # a light command-line process (above) that used the library after all
        import importlib

        value = getattr(importlib.import_module(_HOMES[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
