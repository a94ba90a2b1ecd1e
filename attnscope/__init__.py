"""attnscope: see what the attention layers of your PyTorch models cost, as OpenTelemetry spans."""

from __future__ import annotations

from typing import Any

from ._api import Span, configure, flush, shutdown, span, stats, trace
from ._config import Config
from ._sampling import sampling, step
from ._version import __version__

__all__ = [
    "Config",
    "Span",
    "__version__",
    "configure",
    "flush",
    "rank",
    "sampling",
    "shutdown",
    "span",
    "stats",
    "step",
    "trace",
    "world_size",
]


def __getattr__(name: str) -> Any:
    # rank and world_size are read when asked: torch.distributed may initialise after import.
    if name in ("rank", "world_size"):
        from . import _sampling

        return getattr(_sampling, name)()
    raise AttributeError(f"module 'attnscope' has no attribute {name!r}")
