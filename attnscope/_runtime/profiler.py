"""The profiler gate: which thread runs attnscope's one profiler session, and the user's profiler.

State only; the session itself is the calling side's (:mod:`attnscope._capture.profiler_session`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .._record.capture import ProfileSession

__all__ = ["ProfilerGate", "PROFILE_SKIP_REASONS"]

# "nested": attnscope's own session was running on this thread (a traced call inside a profiled
# one), not the user's profiler
PROFILE_SKIP_REASONS = ("warming", "user_profiler", "nested", "busy", "sync_debug", "error")


class ProfilerGate:
    """The profile tier's process-wide facts: one session at a time, the user's profiler,
    warm-up.

    ``reset()`` zeroes the counts only: torch's pieces, the hooks installed in torch and what
    warm-up learnt are process-lifetime facts.
    """

    def __init__(self) -> None:
        self.session_lock = threading.Lock()  # held for the whole of one attnscope session
        self.lock = threading.Lock()  # counters and the warm-up thread
        self.owner: int | None = None  # thread ident of the running session
        self.active: ProfileSession | None = None
        self.foreign = False  # a user's profiler is prepared or running (seen through the hooks)
        self.warming: threading.Thread | None = None
        self.reset_counts()
        # Process-lifetime facts, kept by reset(): torch's pieces, and what warm-up learnt.
        self.torch: Any = None  # the torch module, once the profile tier first needs it
        self.entry_points: dict[str, Callable[..., Any]] = {}
        self.configs: dict[bool, tuple[Any, Any]] = {}  # on_cuda -> torch's profiler configs
        self.hooked = False
        self.warm_cpu = False
        self.warm_cuda = False
        self.broken: dict[bool, str] = {}  # on_cuda -> why kineto refused at warm-up
        self.kineto_ran = False  # attnscope started a kineto session (capture.fork_exit)
        self.cuda_init_queued = False  # the warm-up waits in torch's queue for CUDA's start-up

    def reset(self) -> None:
        """Zero counts (tests); the process-lifetime facts stay."""
        self.reset_counts()

    def reset_counts(self) -> None:
        self.counts: dict[str, int] = {"profiled": 0,
                                       **{"skipped_" + r: 0 for r in PROFILE_SKIP_REASONS}}

    def after_fork(self) -> None:
        self.session_lock = threading.Lock()
        self.lock = threading.Lock()
        self.owner = None
        self.active = None
        self.warming = None
