"""This process's place in a distributed job, read when asked (torch.distributed may start late)."""

from __future__ import annotations

import os

__all__ = ["rank", "world_size"]


def rank() -> int:
    """This process's rank: torch.distributed when initialised, else $RANK, else 0."""
    return _dist_value("get_rank", "RANK", 0)


def world_size() -> int:
    """Number of processes: torch.distributed when initialised, else $WORLD_SIZE, else 1."""
    return _dist_value("get_world_size", "WORLD_SIZE", 1)


def _dist_value(fn: str, env: str, default: int) -> int:
    try:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            return int(getattr(dist, fn)())
    except Exception:
        pass
    try:
        return int(os.environ.get(env, default))
    except ValueError:
        return default
