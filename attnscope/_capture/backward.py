"""Whether a sampled call runs inside a backward pass: activation checkpointing
(``torch.utils.checkpoint``, both modes) runs a layer's forward again there, and that second
call is work of the backward, not another token through the layer."""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["task"]


def _no_task() -> int:
    return -1


# the autograd graph task running on this thread, -1 outside one (one C call, ~30 ns): torch
# has had it since 2.1, the fallback is for a build without it
task: Callable[[], int] = getattr(torch._C, "_current_graph_task_id", _no_task)
