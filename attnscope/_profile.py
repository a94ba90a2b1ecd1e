"""torch.profiler around one sampled call (profile tier).

Placeholder until kernel capture lands: ``start`` declines, so profile-tier calls are timed only.
"""

from __future__ import annotations

from typing import Any

__all__ = ["start", "stop"]


def start(device: Any) -> Any:
    """Start a profiler session for one call, or return None to fall back to timing."""
    return None


def stop(session: Any) -> None:
    """Stop the session started by :func:`start` (calling thread; parsing is the worker's)."""
    return None


def finish(cap: Any) -> tuple[dict[str, Any], list[Any]]:
    """Worker side: parse a finished session into span attributes and kernel child spans."""
    return {}, []
