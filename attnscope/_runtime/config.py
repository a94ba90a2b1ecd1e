"""The effective configuration, once it is first read or set (attnscope._api)."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._config import Config

__all__ = ["ConfigHolder"]


class ConfigHolder:
    """The process's effective :class:`~attnscope._config.Config`; None until first use."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        # re-entrant: configure() reads the current config while it holds the lock
        self.lock = threading.RLock()
        self.current: Config | None = None

    def after_fork(self) -> None:
        self.lock = threading.RLock()
