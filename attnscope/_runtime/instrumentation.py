"""What instrumentation installed in user-visible places: register_attention() classes and the
original SDPA function."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["Instrumentation"]


class Instrumentation:
    """The attention registry, the SDPA original and the models' numbers; ``reset()`` keeps the
    first two (user code holds the registered classes, and torch holds the SDPA wrapper)."""

    def __init__(self) -> None:
        self.registry_lock = threading.Lock()
        # class -> its extractor (module, args, kwargs) -> facts, or None
        self.attention_registry: dict[type, Callable[..., Any] | None] = {}
        self.sdpa_lock = threading.Lock()
        self.sdpa_original: Callable[..., Any] | None = None
        # each model instrument() was given -> its number in this process (1, 2, ...): the
        # same model keeps it; two models with the same module paths are told apart by it
        self.models: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()
        self.model_count = 0

    def model_number(self, model: Any) -> tuple[int, list[Any]]:
        """``model``'s number (the one it had, else the next) and the other models numbered
        here that are still alive."""
        with self.registry_lock:
            number = self.models.get(model)
            if number is None:
                self.model_count += 1
                number = self.models[model] = self.model_count
            return number, [m for m in list(self.models.keys()) if m is not model]

    def reset(self) -> None:
        self.models = weakref.WeakKeyDictionary()
        self.model_count = 0
        self.after_fork()

    def after_fork(self) -> None:
        self.registry_lock = threading.Lock()
        self.sdpa_lock = threading.Lock()
