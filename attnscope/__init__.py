"""attnscope: see what the attention layers of your PyTorch models cost, as OpenTelemetry spans."""

from __future__ import annotations

from typing import Any as _Any

from ._api import Span, configure, flush, shutdown, span, stats, trace
from ._config import Config
from ._instrument import instrument, register_attention, uninstrument
from ._sampling import sampling, step
from ._version import __version__
from .integrations.sdpa import instrument_sdpa, uninstrument_sdpa

__all__ = [
    "Config",
    "Span",
    "__version__",
    "configure",
    "flush",
    "instrument",
    "instrument_sdpa",
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
        from . import _sampling

        return getattr(_sampling, name)()
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
