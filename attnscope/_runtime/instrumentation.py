"""What instrumentation installed in user-visible places: register_attention() classes and the
original SDPA function."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

__all__ = ["Instrumentation"]


class Instrumentation:
    """The attention registry and the SDPA original; ``reset()`` keeps both (user code holds
    the registered classes, and torch holds the SDPA wrapper)."""

    def __init__(self) -> None:
        self.registry_lock = threading.Lock()
        # class -> its extractor (module, args, kwargs) -> facts, or None
        self.attention_registry: dict[type, Callable[..., Any] | None] = {}
        self.sdpa_lock = threading.Lock()
        self.sdpa_original: Callable[..., Any] | None = None

    def reset(self) -> None:
        self.after_fork()

    def after_fork(self) -> None:
        self.registry_lock = threading.Lock()
        self.sdpa_lock = threading.Lock()
