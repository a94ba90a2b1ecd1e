"""The SDPA call inside a profiled call, recorded for its fallback verdict.

A profiled call of ``instrument_sdpa()`` carries its inputs' shapes, dtypes, last-dimension strides
and the backends torch's flags allow, from which the worker judges whether the kernel that ran was
the best the inputs allowed (:mod:`attnscope._derive.fallback`). Every other profiled call (a
``@trace``d function, a ``span()`` block, an instrumented layer, which sees only hidden states)
has the SDPA call it makes inside its body. So while the profile session of such a call is open
(``profile_max_per_minute`` of them, one at a time: the session lock),
``torch.nn.functional.scaled_dot_product_attention``, which callers like transformers and
``nn.MultiheadAttention`` look up at call time, is a recorder that notes the first call made on
the profiling thread and calls through; any other call, on any thread, goes straight through.
It is armed by the capture's ``_open`` (``site.on_profile``, this module's :func:`arm` unless the
site has its own) and the session's release puts the function back, on every path. Nothing here
runs on a timing-tier or unsampled call.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F

from .. import _log
from .._record.capture import SdpaCall, SdpaContext, TensorMeta
from .._runtime import runtime
from .args import summarize

__all__ = ["PARAMS", "arm", "beneath", "context", "disarm", "put_beneath"]

PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_ARMED: dict[str, Any] = {}  # "target": [the function swapped out], "recorder": ours


def context(args: Sequence[Any], kwargs: Mapping[str, Any]) -> SdpaCall | None:
    """A profiled SDPA call's last-dimension strides and the backends the program allows
    (``sdpa_kernel`` sets torch's global flags for its block): what its fallback verdict needs
    and its argument summary lacks (:class:`SdpaContext`)."""
    found = _context(args, kwargs)
    return None if found is None else SdpaCall(found)


def _context(args: Sequence[Any], kwargs: Mapping[str, Any]) -> SdpaContext | None:
    tensors = [*args[:3], *(kwargs[n] for n in ("query", "key", "value") if n in kwargs)][:3]
    if len(tensors) < 3 or not all(isinstance(t, torch.Tensor) for t in tensors):
        return None
    strides = tuple(t.stride(-1) if t.dim() else 1 for t in tensors)
    b: Any = torch.backends.cuda  # (its flag readers are untyped)
    allowed = tuple(name for name, on in (
        ("flash", b.flash_sdp_enabled()), ("efficient", b.mem_efficient_sdp_enabled()),
        ("math", b.math_sdp_enabled()), ("cudnn", b.cudnn_sdp_enabled())) if on)
    return SdpaContext(strides, allowed)


def _fill(into: SdpaCall, holder: list[tuple[str, Any]], args: Sequence[Any],
          kwargs: Mapping[str, Any]) -> None:
    """The call's summary with no tensor kept (the mask too: its shape and dtype are enough)
    into ``holder`` (``into.inner``), and its context."""
    found = summarize(args, kwargs, PARAMS)
    summary = [(k, TensorMeta.of(v) if isinstance(v, torch.Tensor) else v) for k, v in found]
    into.context = _context(args, kwargs)
    holder.extend(summary)


def arm(args: tuple[Any, ...], kwargs: dict[str, Any]) -> SdpaCall | None:
    """A profiled call's ``on_profile`` (its profile session is open): the capture's
    :class:`SdpaCall`, filled by the call's first SDPA call (None: armed already)."""
    if _ARMED:
        return None
    holder: list[tuple[str, Any]] = []
    call = SdpaCall(inner=holder)
    target: list[Any] = [None]  # what the recorder calls: instrument_sdpa() may change it
    owner = threading.get_ident()

    def recorder(*a: Any, **kw: Any) -> Any:
        if not holder and threading.get_ident() == owner:
            try:
                _fill(call, holder, a, kw)
            except Exception as exc:  # noqa: BLE001  (the call goes on, unjudged)
                _log.internal_error("inner-sdpa", exc)
        return target[0](*a, **kw)

    # A with, not a try around a non-blocking acquire: a Ctrl-C on the line that releases a lock
    # in a finally leaves it held (and the session's disarm() waiting on it for ever), while a
    # with's release runs whatever lands. The wait is for instrument_sdpa()/uninstrument_sdpa(),
    # which hold the lock for their assignments only, on profile-tier calls only.
    with runtime.instrumentation.sdpa_lock:
        target[0] = F.scaled_dot_product_attention
        # noted before the swap: a Ctrl-C between the two leaves disarm() nothing to undo
        _ARMED.update(target=target, recorder=recorder)
        F.scaled_dot_product_attention = recorder
    return call


def disarm() -> None:
    """Put back what :func:`arm` swapped out (the profile session is ending); a no-op unarmed.
    A function someone set meanwhile is left in place."""
    if not _ARMED:
        return
    with runtime.instrumentation.sdpa_lock:
        if F.scaled_dot_product_attention is _ARMED.get("recorder"):
            F.scaled_dot_product_attention = _ARMED["target"][0]
        _ARMED.clear()


def beneath(fn: Any) -> Any:
    """``fn``, or when ``fn`` is the armed recorder, the function it calls through to: what
    ``F.scaled_dot_product_attention`` is once the session ends. Under
    ``runtime.instrumentation.sdpa_lock``."""
    if _ARMED and fn is _ARMED.get("recorder"):
        return _ARMED["target"][0]
    return fn


def put_beneath(fn: Any) -> bool:
    """While the recorder is in place, make ``fn`` what it calls through to and the session's
    end puts back (``instrument_sdpa()``/``uninstrument_sdpa()`` during a profiled call); False
    when it is not in place. Under ``runtime.instrumentation.sdpa_lock``."""
    if _ARMED and F.scaled_dot_product_attention is _ARMED.get("recorder"):
        _ARMED["target"][0] = fn
        return True
    return False
