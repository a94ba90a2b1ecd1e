"""The SDPA call inside a profiled instrumented layer, recorded for its fallback verdict.

A profiled call of ``instrument_sdpa()`` carries its inputs' shapes, dtypes, last-dimension strides
and the backends torch's flags allow, from which the worker judges whether the kernel that ran was
the best the inputs allowed (:mod:`attnscope.worker.fallback`). An instrumented layer (a
transformers ``sdpa`` layer) sees only hidden states: the SDPA call it makes is inside its forward.
So while a profile session of such a layer is open (``profile_max_per_minute`` of them, one at a
time: the session lock), ``torch.nn.functional.scaled_dot_product_attention``, which transformers
looks up at call time, is a recorder that notes the first call made on the profiling thread and
calls through; any other call, on any thread, goes straight through. The session's release puts
the function back, on every path. Nothing here runs on a timing-tier or unsampled call.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .. import _log
from .._state import state
from ..record.capture import INNER_SDPA_KEY, SDPA_CONTEXT_KEY, TensorMeta
from .args import summarize

__all__ = ["PARAMS", "arm", "context", "disarm"]

PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_ARMED: dict[str, Any] = {}  # "previous": the function swapped out, "recorder": ours


def context(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """A profiled SDPA call's last-dimension strides and the backends the program allows
    (``sdpa_kernel`` sets torch's global flags for its block): what its fallback verdict needs
    and its argument summary lacks."""
    tensors = [*args[:3], *(kwargs[n] for n in ("query", "key", "value") if n in kwargs)][:3]
    if len(tensors) < 3 or not all(isinstance(t, torch.Tensor) for t in tensors):
        return []
    strides = tuple(t.stride(-1) if t.dim() else 1 for t in tensors)
    b: Any = torch.backends.cuda  # (its flag readers are untyped)
    allowed = tuple(name for name, on in (
        ("flash", b.flash_sdp_enabled()), ("efficient", b.mem_efficient_sdp_enabled()),
        ("math", b.math_sdp_enabled()), ("cudnn", b.cudnn_sdp_enabled())) if on)
    return [(SDPA_CONTEXT_KEY, (strides, allowed))]


def _inputs(args: Sequence[Any], kwargs: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """The call's summary with no tensor kept (the mask too: its shape and dtype are enough)."""
    found = summarize(args, kwargs, PARAMS)
    return [(k, TensorMeta.of(v) if isinstance(v, torch.Tensor) else v) for k, v in found] \
        + context(args, kwargs)


def arm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
    """An instrumented layer's ``on_profile`` (its profile session is open): the entry its summary
    gets, ``(INNER_SDPA_KEY, holder)``, the holder filled by the layer's first SDPA call."""
    if _ARMED or not state.sdpa_lock.acquire(blocking=False):  # instrument_sdpa() at work
        return []
    try:
        holder: list[tuple[str, Any]] = []
        previous = F.scaled_dot_product_attention
        owner = threading.get_ident()

        def recorder(*a: Any, **kw: Any) -> Any:
            if not holder and threading.get_ident() == owner:
                try:
                    holder.extend(_inputs(a, kw))
                except Exception as exc:  # noqa: BLE001  (the call goes on, unjudged)
                    _log.internal_error("inner-sdpa", exc)
            return previous(*a, **kw)

        F.scaled_dot_product_attention = recorder
        _ARMED.update(previous=previous, recorder=recorder)
    finally:
        state.sdpa_lock.release()
    return [(INNER_SDPA_KEY, holder)]


def disarm() -> None:
    """Put back what :func:`arm` swapped out (the profile session is ending); a no-op unarmed.
    A function someone set meanwhile is left in place."""
    if not _ARMED:
        return
    with state.sdpa_lock:
        if F.scaled_dot_product_attention is _ARMED.get("recorder"):
            F.scaled_dot_product_attention = _ARMED["previous"]
        _ARMED.clear()
