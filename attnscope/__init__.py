"""attnscope: see what the attention layers of your PyTorch models cost, as OpenTelemetry spans."""

from __future__ import annotations

from typing import Any as _Any

from ._api import configure, flush, sampling, shutdown, stats, step, trace
from ._config import Config
from ._version import __version__
from .capture.block import Span, span
from .instrument.model import instrument, instrumented_modules, register_attention, uninstrument
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
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
