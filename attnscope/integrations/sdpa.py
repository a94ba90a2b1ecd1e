"""``torch.nn.functional.scaled_dot_product_attention``, wrapped where callers look it up.

Callers that resolve ``F.scaled_dot_product_attention`` at call time (transformers' sdpa
attention, ``nn.MultiheadAttention``) see the wrapper; code that imported the function object
itself before :func:`instrument_sdpa` keeps the original.
"""

from __future__ import annotations

import threading
import warnings
from typing import Any

import torch.nn.functional as F

from .. import _hotpath, _safety
from .._dynamo_watch import register_when_dynamo_loads

__all__ = ["instrument_sdpa", "sdpa_instrumented", "uninstrument_sdpa"]

_PARAMS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
_lock = threading.Lock()
_original: Any = None


def sdpa_instrumented() -> bool:
    return _original is not None


def instrument_sdpa(sample_rate: float | None = None) -> None:
    """Trace every ``F.scaled_dot_product_attention`` call (span ``scaled_dot_product_attention``).

    Idempotent: a second call warns once and keeps the existing wrapper.
    """
    global _original
    with _lock:
        if _original is not None:
            warnings.warn(
                "attnscope: scaled_dot_product_attention is already instrumented; "
                "keeping the existing wrapper",
                UserWarning,
                stacklevel=2,
            )
            return
        fn = F.scaled_dot_product_attention
        site = _hotpath.make_site(
            fn,
            "scaled_dot_product_attention",
            sample_rate,
            {"attnscope.module_class": "scaled_dot_product_attention"},
            kind="function",
            param_names=_PARAMS,
            key="attnscope.sdpa",
        )
        wrapper = _hotpath.wrap(fn, site, compile_check=False)
        wrapper.__attnscope_site__ = site  # type: ignore[attr-defined]
        _original = fn
        F.scaled_dot_product_attention = wrapper
    register_when_dynamo_loads()


def uninstrument_sdpa() -> None:
    """Put the original ``scaled_dot_product_attention`` back (no-op when not instrumented)."""
    global _original
    with _lock:
        if _original is None:
            return
        if getattr(F.scaled_dot_product_attention, "__attnscope_site__", None) is not None:
            F.scaled_dot_product_attention = _original
        else:
            _safety.warn_once(
                "sdpa-replaced",
                "attnscope: scaled_dot_product_attention was replaced "
                "by someone else after instrument_sdpa(); leaving theirs in place",
            )
        _original = None
