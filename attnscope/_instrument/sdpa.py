"""``torch.nn.functional.scaled_dot_product_attention``, wrapped where callers look it up.

Callers that resolve ``F.scaled_dot_product_attention`` at call time (transformers' sdpa
attention, ``nn.MultiheadAttention``) see the wrapper; code that imported the function object
itself before :func:`instrument_sdpa` keeps the original.
"""

from __future__ import annotations

import warnings

import torch.nn.functional as F

from .. import _log
from .. import _schema as schema
from .._capture import inner_sdpa, wrapper
from .._capture.compile import register_when_dynamo_loads
from .._capture.inner_sdpa import PARAMS as _PARAMS
from .._capture.inner_sdpa import context as _sdpa_context
from .._runtime import runtime

__all__ = ["instrument_sdpa", "uninstrument_sdpa"]


def instrument_sdpa(sample_rate: float | None = None) -> None:
    """Trace every ``F.scaled_dot_product_attention`` call (span ``scaled_dot_product_attention``).

    Idempotent: a second call warns once and keeps the existing wrapper.
    """
    # Nothing that can run the program's code (a warning's or a log line's handlers) is done under
    # the lock: a profiled call's arming waits on it (capture.inner_sdpa).
    with runtime.instrumentation.sdpa_lock:
        already = runtime.instrumentation.sdpa_original is not None
        if not already:
            _instrument(sample_rate)
    if already:
        warnings.warn(
            "attnscope: scaled_dot_product_attention is already instrumented; "
            "keeping the existing wrapper",
            UserWarning,
            stacklevel=2,
        )
        return
    register_when_dynamo_loads()


def _instrument(sample_rate: float | None) -> None:
    """Under ``runtime.instrumentation.sdpa_lock``: the wrapper, in place (or under a profiled
    call's recorder)."""
    fn = inner_sdpa.beneath(F.scaled_dot_product_attention)  # not a profiled call's recorder
    site = wrapper.make_site(
        fn,
        "scaled_dot_product_attention",
        sample_rate,
        {schema.MODULE_CLASS.name: "scaled_dot_product_attention"},
        kind="function",
        param_names=_PARAMS,
        key="attnscope.sdpa",
    )
    site.on_profile = _sdpa_context
    traced = wrapper.wrap(fn, site, compile_check=False)
    traced.__attnscope_site__ = site
    runtime.instrumentation.sdpa_original = fn
    if not inner_sdpa.put_beneath(traced):  # else in place once that profiled call ends
        F.scaled_dot_product_attention = traced


def uninstrument_sdpa() -> None:
    """Put the original ``scaled_dot_product_attention`` back (no-op when not instrumented)."""
    replaced = False
    with runtime.instrumentation.sdpa_lock:  # no log line under it: see instrument_sdpa()
        if runtime.instrumentation.sdpa_original is None:
            return
        current = inner_sdpa.beneath(F.scaled_dot_product_attention)
        if getattr(current, "__attnscope_site__", None) is not None:
            if not inner_sdpa.put_beneath(runtime.instrumentation.sdpa_original):
                F.scaled_dot_product_attention = runtime.instrumentation.sdpa_original
        else:
            replaced = True
        runtime.instrumentation.sdpa_original = None
    if replaced:
        _log.warn_once(
            "sdpa-replaced",
            "attnscope: scaled_dot_product_attention was replaced "
            "by someone else after instrument_sdpa(); leaving theirs in place",
        )
