"""The generator span and trace ids are drawn from: attnscope's own, not the ``random`` module's
(whose state the application owns: ``attnscope/_export/ids.py`` says why)."""

from __future__ import annotations

import random

__all__ = ["IdSource"]


class IdSource:
    """One ``random.Random`` seeded by the operating system, and again in a forked child (else
    parent and child would draw the same ids) and on ``reset()``. Always the same object,
    seeded in place: the emitter keeps its bound ``getrandbits``."""

    def __init__(self) -> None:
        self.rng = random.Random()

    def reset(self) -> None:
        self.rng.seed()

    def after_fork(self) -> None:
        self.rng.seed()
