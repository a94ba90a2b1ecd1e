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
from .._state import state
from ..capture import wrapper
from ..capture.compile import register_when_dynamo_loads
from ..capture.inner_sdpa import PARAMS as _PARAMS
from ..capture.inner_sdpa import context as _sdpa_context

__all__ = ["instrument_sdpa", "uninstrument_sdpa"]


def instrument_sdpa(sample_rate: float | None = None) -> None:
    """Trace every ``F.scaled_dot_product_attention`` call (span ``scaled_dot_product_attention``).

    Idempotent: a second call warns once and keeps the existing wrapper.
    """
    with state.sdpa_lock:
        if state.sdpa_original is not None:
            warnings.warn(
                "attnscope: scaled_dot_product_attention is already instrumented; "
                "keeping the existing wrapper",
                UserWarning,
                stacklevel=2,
            )
            return
        fn = F.scaled_dot_product_attention
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
        traced.__attnscope_site__ = site  # type: ignore[attr-defined]
        state.sdpa_original = fn
        F.scaled_dot_product_attention = traced
    register_when_dynamo_loads()


def uninstrument_sdpa() -> None:
    """Put the original ``scaled_dot_product_attention`` back (no-op when not instrumented)."""
    with state.sdpa_lock:
        if state.sdpa_original is None:
            return
        if getattr(F.scaled_dot_product_attention, "__attnscope_site__", None) is not None:
            F.scaled_dot_product_attention = state.sdpa_original
        else:
            _log.warn_once(
                "sdpa-replaced",
                "attnscope: scaled_dot_product_attention was replaced "
                "by someone else after instrument_sdpa(); leaving theirs in place",
            )
        state.sdpa_original = None
