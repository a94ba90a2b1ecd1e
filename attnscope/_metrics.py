"""OpenTelemetry metrics recorded by the worker for every emitted span.

Placeholder until the metrics work lands: no instruments yet.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ._config import Config

__all__ = ["recorder"]


def recorder(cfg: Config) -> Callable[[Any, dict[str, Any]], None] | None:
    """A callable ``(capture, attributes)`` that records metrics, or None when metrics are off."""
    return None
