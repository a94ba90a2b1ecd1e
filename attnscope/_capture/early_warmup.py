"""The profiler's CUDA warm-up started at set-up, never at a request (issue 37 goal 1).

CUPTI's start-up took 4.5 s on an H200. Left to the first sampled call, it ran during the first
requests; started at set-up, the program's own set-up after it can hide it:

- ``configure()`` or ``instrument(model)`` in a process whose CUDA is up: at once, on a helper
  thread;
- earlier (most programs configure attnscope first, then move their model to the GPU): queued
  with torch (``torch.cuda._lazy_call``, what torch's own seeding waits with), so that when the
  program initialises CUDA a helper thread starts it.

Neither ever initialises CUDA, and neither starts it when the profile tier is off (as configured
when CUDA comes up, for the queued one).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from .. import _log
from .._config import Config, from_env
from .._runtime import runtime
from . import profiler_session

__all__ = ["warm_up_early"]

# How long the queued warm-up's helper waits for torch's CUDA initialisation to finish (it starts
# inside it): a driver's first load takes seconds; one that failed is not waited for forever.
_CUDA_UP_WAIT_S, _CUDA_UP_POLL_S = 120.0, 0.01


def warm_up_early(cfg: Config) -> None:
    """Set-up (``configure()``, ``instrument()``): start the CUDA warm-up now when CUDA is up,
    else have it start when the program brings CUDA up. Never raises."""
    try:
        torch = sys.modules.get("torch")  # no CUDA context is made here (a program may fork)
        if torch is None or runtime.profiler.warm_cuda or not profiler_session.profile_tier_on(cfg):
            return
        if torch.cuda.is_initialized():
            profiler_session.warm_up_async(cuda=True)
        else:
            _queue_for_cuda_init(torch)
    except Exception as exc:
        _log.internal_error("profile-warmup", exc)


def _queue_for_cuda_init(torch: Any) -> None:
    """Once per process; not on a build without CUDA (its CUDA never comes up), nor on a torch
    without ``torch.cuda._lazy_call`` (then the worker's start or the first sampled call warms)."""
    p = runtime.profiler
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if p.cuda_init_queued or getattr(torch.version, "cuda", None) is None or lazy_call is None:
        return
    p.cuda_init_queued = True
    lazy_call(_on_cuda_init)


def _on_cuda_init() -> None:
    """Run by torch inside its CUDA initialisation, on the thread that initialises it: starts the
    helper and returns (an exception here would fail the program's initialisation: none leaves).
    """
    try:
        cfg = runtime.config.current or from_env(strict=False)
        if not runtime.profiler.warm_cuda and profiler_session.profile_tier_on(cfg):
            profiler_session.warm_up_async(cuda=True, target=_once_cuda_is_up)
    except Exception as exc:
        _log.internal_error("profile-warmup", exc)


def _once_cuda_is_up(cuda: bool | None) -> bool:
    """The helper: waits for torch's initialisation to finish (it was started inside it), then
    warms up. False when CUDA did not come up."""
    torch = sys.modules["torch"]
    deadline = time.monotonic() + _CUDA_UP_WAIT_S
    while not torch.cuda.is_initialized():
        if time.monotonic() > deadline:
            return False
        time.sleep(_CUDA_UP_POLL_S)
    return profiler_session.warm_up(cuda)
