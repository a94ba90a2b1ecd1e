"""This process's place in a distributed job, read when asked (torch.distributed may start late)."""

from __future__ import annotations

import os

__all__ = ["rank", "world_size", "run_id", "host"]


def rank() -> int:
    """This process's rank: torch.distributed when initialised, else $RANK, else 0."""
    return _dist_value("get_rank", "RANK", 0)


def world_size() -> int:
    """Number of processes: torch.distributed when initialised, else $WORLD_SIZE, else 1."""
    return _dist_value("get_world_size", "WORLD_SIZE", 1)


def run_id(configured: str | None = None) -> str | None:
    """The id every rank of one job shares, or None: ``configured`` (the ``run_id`` setting), else
    torchrun's ``$TORCHELASTIC_RUN_ID`` with ``$TORCHELASTIC_RESTART_COUNT`` (a restarted worker
    group replays its steps: its traces must not merge with the failed attempt's). torchrun's
    default ``--rdzv-id`` on several nodes, ``none``, is the same in every job: not an id."""
    if configured:
        return configured
    job = os.environ.get("TORCHELASTIC_RUN_ID", "").strip()
    if not job or job.lower() == "none":
        return None
    return f"{job}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0').strip()}"


def host() -> str:
    """This machine's name (``socket.gethostname()``), "" when it cannot be read."""
    try:
        import socket

        return socket.gethostname()
    except Exception:
        return ""


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
