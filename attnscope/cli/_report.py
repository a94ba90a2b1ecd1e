"""``attnscope report``: not built yet (issue 13)."""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope report`` to the command line (placeholder until it is built)."""
