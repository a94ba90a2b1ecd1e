"""What the worker finds for one call, typed, and the one place it becomes span attributes.

:class:`Derived` is :func:`.call.derive`'s result: shapes, heads, tokens and FLOPs, read from the
call's argument summary (the worker keeps its attributes per summary:
:mod:`attnscope._worker.shapecache`). :class:`Measured` is what belongs to the one call: device
time, memory, the profile's attributes, the slow-call mark. The span builder
(:func:`attnscope._spans.calls.capture_attributes`) writes both.

Attribute order is part of what an exporter writes (Jaeger JSON keeps it), so each way of deriving
keeps the order it always had: ``Derived.order`` names the fields in the order they are emitted.
Both read like the attribute mapping they stand for (``derived["flops"]``, ``"tokens" in
derived``): a field that is None is an attribute the span does not carry.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import floor, isfinite, log10
from typing import Any

from .. import _log
from .. import _schema as schema
from .._record.capture import MAX_VALUE, attribute_value

__all__ = ["Derived", "Measured", "LAYER", "ARGUMENTS", "HIDDEN", "MODEL", "INEXACT_REASONS",
           "clean", "clean_attributes", "sig4"]

# Why a call's figures are not exact (attnscope.inexact_reason; docs/attributes.md):
# mask_not_kept: its mask was over the keeping budget: FLOPs count every pair the layer's own
#   causality and window allow (an upper bound), tokens are left out;
# mask_unread: a mask attnscope could not read (a layout it does not know, a device copy that
#   did not arrive): FLOPs as for mask_not_kept;
# cache_unread: the KV-cache length on the device could not be read: keys, phase, FLOPs left out;
# layer_narrows: the layer attends to fewer keys than its mask shows (a key selection of its
#   own): FLOPs are an upper bound.
INEXACT_REASONS = ("mask_not_kept", "mask_unread", "cache_unread", "layer_narrows")

# The emission orders, one per way derive reads a call (field names).
LAYER = ("batch_size", "seq_len_q", "causal", "seq_len_kv", "dtype", "device", "kv_cache_len",
         "phase", "num_heads", "num_kv_heads", "head_dim", "sliding_window", "flops", "tokens",
         "exact", "inexact_reason", "bytes_moved", "kv_bytes_read", "arithmetic_intensity")
ARGUMENTS = ("batch_size", "num_heads", "num_kv_heads", "head_dim", "seq_len_q", "seq_len_kv",
             "dtype", "device", "sliding_window", "flops", "tokens", "causal", "exact",
             "inexact_reason", "bytes_moved", "kv_bytes_read", "arithmetic_intensity")
HIDDEN = ("batch_size", "seq_len_q", "dtype", "device", "num_heads", "num_kv_heads", "head_dim",
          "tokens", "causal")
MODEL = ("batch_size", "seq_len_q", "tokens", "kv_cache_len", "seq_len_kv", "phase",
         "input_tokens", "output_tokens", "sum_nq2", "sum_nq_nkv")

_ATTRIBUTE = {
    "batch_size": schema.BATCH_SIZE, "seq_len_q": schema.SEQ_LEN_Q, "seq_len_kv": schema.SEQ_LEN_KV,
    "num_heads": schema.NUM_HEADS, "num_kv_heads": schema.NUM_KV_HEADS,
    "head_dim": schema.HEAD_DIM, "dtype": schema.DTYPE, "device": schema.DEVICE,
    "causal": schema.CAUSAL, "sliding_window": schema.SLIDING_WINDOW, "flops": schema.FLOPS,
    "tokens": schema.TOKENS, "kv_cache_len": schema.KV_CACHE_LEN, "phase": schema.PHASE,
    "input_tokens": schema.INPUT_TOKENS, "output_tokens": schema.OUTPUT_TOKENS,
    "exact": schema.EXACT, "inexact_reason": schema.INEXACT_REASON,
    "bytes_moved": schema.BYTES, "kv_bytes_read": schema.KV_BYTES_READ,
    "arithmetic_intensity": schema.ARITHMETIC_INTENSITY,
    "sum_nq2": schema.SUM_NQ2, "sum_nq_nkv": schema.SUM_NQ_NKV,
}
_NAME_OF = {f: a.name for f, a in _ATTRIBUTE.items()}
_FIELD_OF = {a.key: f for f, a in _ATTRIBUTE.items()}
_PLAIN = frozenset((int, float, bool))


@dataclass(slots=True)
class Derived:
    """Attention facts of one call (:func:`.call.derive`); None: not known, not emitted."""

    batch_size: int | None = None
    seq_len_q: int | None = None
    seq_len_kv: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    dtype: str | None = None
    device: str | None = None
    causal: bool | None = None
    sliding_window: int | None = None
    flops: int | None = None
    tokens: int | None = None
    kv_cache_len: int | None = None
    phase: str | None = None
    input_tokens: int | None = None  # gen_ai.usage.input_tokens
    output_tokens: int | None = None  # gen_ai.usage.output_tokens
    bytes_moved: int | None = None  # attnscope.bytes (_attention/traffic.py)
    kv_bytes_read: int | None = None
    arithmetic_intensity: float | None = None
    sum_nq2: int | None = None  # a model forward: Σ rows N_Q² (real queries per row)
    sum_nq_nkv: int | None = None  # and Σ rows N_Q · N_KV
    # Set only when a figure could not be established (never "exact=True": a family handled
    # exactly carries neither); the reason is one of INEXACT_REASONS.
    exact: bool | None = None
    inexact_reason: str | None = None
    order: tuple[str, ...] = field(default=ARGUMENTS, repr=False)

    def inexact(self, reason: str) -> None:
        """Mark the call's figures as not established, for ``reason`` (the first one stays)."""
        if self.inexact_reason is None:
            self.exact, self.inexact_reason = False, reason

    def attributes(self) -> dict[str, Any]:
        """The span attributes, in :attr:`order`, with the values a span carries."""
        attrs: dict[str, Any] = {}
        for name in self.order:
            value = getattr(self, name)
            if value is not None:
                if type(value) is float:
                    value = sig4(value)
                attrs[_NAME_OF[name]] = value if type(value) in _PLAIN else clean(value)
        return attrs

    # read like the attributes (keys without the prefix), as derive's callers and tests do
    def get(self, key: str, default: Any = None) -> Any:
        name = _FIELD_OF.get(key)
        value = getattr(self, name) if name is not None else None
        return default if value is None else value

    def __getitem__(self, key: str) -> Any:
        value = self.get(key)
        if value is None:
            raise KeyError(key)
        return value

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self.get(key) is not None


_DEVICE_NS, _DELTA, _PEAK, _RSS = (schema.DEVICE_NS.name, schema.DELTA_BYTES.name,
                                   schema.PEAK_BYTES.name, schema.HOST_RSS_BYTES.name)
_TRIGGER, _SLOW, _SLOW_QUANTILE = schema.TRIGGER.name, schema.SLOW.name, schema.SLOW_QUANTILE.name
_EXTRA = schema.EXTRA.name


@dataclass(slots=True)
class Measured:
    """What the worker adds for the one call, after derive (never kept between calls)."""

    device_ns: int | None = None
    delta_bytes: int | None = None
    peak_bytes: int | None = None
    host_rss_bytes: int | None = None
    # a profiled call's attributes (:func:`.profile.finish`: schema keys, without the prefix);
    # a profile that could not be read says ``tier: timing``
    profile: dict[str, Any] | None = None
    trigger: str | None = None  # the grant's kind: why the call was profiled
    slow_quantile: float | None = None  # set: the call was slow beyond this quantile
    extra: bool = False  # its grant went to a call the sampler had not chosen

    def add_to(self, attrs: dict[str, Any]) -> None:
        """Add the attributes to ``attrs``, after derive's (a name set twice keeps its place)."""
        if self.device_ns is not None:
            attrs[_DEVICE_NS] = self.device_ns
        if self.delta_bytes is not None:
            attrs[_DELTA] = self.delta_bytes
        if self.peak_bytes is not None:
            attrs[_PEAK] = self.peak_bytes
        if self.host_rss_bytes is not None:
            attrs[_RSS] = self.host_rss_bytes
        if self.profile:
            prefix = schema.PREFIX
            for key, value in self.profile.items():
                if value is not None:
                    if type(value) is float:
                        value = sig4(value)
                    attrs[prefix + key] = value if type(value) in _PLAIN else clean(value)
        if self.trigger is not None:
            attrs[_TRIGGER] = self.trigger
            if self.extra:
                attrs[_EXTRA] = True
        elif self.slow_quantile is not None:
            attrs[_SLOW] = True
            attrs[_SLOW_QUANTILE] = sig4(self.slow_quantile)


def sig4(x: float) -> float:
    """``x`` to 4 significant digits: what a measured rate means (not 17 digits of noise).
    The same value as ``float(f"{x:.4g}")``, in half the time (it runs twice per span)."""
    if not x or not isfinite(x):
        return x
    try:
        return round(x, 3 - floor(log10(abs(x))))
    except OverflowError:  # rounds up past the largest float (1.7977e308): kept as it is
        return x


def clean(value: Any) -> Any:
    """An attribute value as a span carries it: strings cut, sequences of one type, bounded; any
    other object described without its values and without running its own ``__str__``
    (:func:`attnscope._record.capture.attribute_value`). Raises what a user value's own code
    raised while read: :func:`clean_attributes` leaves that one value out."""
    kind = type(value)
    if kind is bool or kind is int or kind is float:
        return value
    if kind is str:
        return value[:MAX_VALUE]
    return attribute_value(value)


def clean_attributes(attributes: Any, into: dict[str, Any] | None = None) -> dict[str, Any]:
    """User attributes (name to value) :func:`clean`ed into ``into`` (a new dict if None): a None
    value is no attribute, and a value that cannot be read is left out (an internal error, stage
    ``attributes``), never the span."""
    out: dict[str, Any] = {} if into is None else into
    for key, value in attributes.items():
        if value is not None:
            try:
                out[key] = clean(value)
            except Exception as exc:
                _log.internal_error("attributes", exc)
    return out
