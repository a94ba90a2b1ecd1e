"""A call span's attributes, made in one place: the site's, tier, rate, derive's, what the worker
measured, the implementation, throughput, the configured roofline; and its name.

:func:`result_of` turns a capture and what the worker found into a :class:`Result` — everything
its span needs, no live handle — which the builder (:mod:`.spans`) nests and emits.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .. import _schema as schema
from .._derive import fallback, roofline
from .._derive.result import Measured, clean_attributes, sig4
from .._profiles.optree import ChildSpan
from .._record.capture import TIER_NAMES, Capture
from .emit import span_name

__all__ = ["Result", "result_of", "capture_attributes", "implementation_of", "site_attributes"]

# Span attribute bases kept per (shape, site, tier, rate) (capture_attributes' ``bases``).
_BASES_MAX = 512


def site_attributes(attributes: dict[str, Any]) -> dict[str, Any]:
    """A call site's own attributes (names as given), cleaned once per site, not per span."""
    return clean_attributes(attributes)


# attribute names read or written per span, built once
_TIER, _SAMPLE_RATE, _WALL_NS = schema.TIER.name, schema.SAMPLE_RATE.name, schema.WALL_NS.name
_FLOPS, _TFLOPS, _TOKENS, _TOKENS_PER_S = (schema.FLOPS.name, schema.TFLOPS.name,
                                           schema.TOKENS.name, schema.TOKENS_PER_S.name)
_PHASE = schema.PHASE.name
_AUTOCAST_DTYPE = schema.AUTOCAST_DTYPE.name
_RECOMPUTE = schema.RECOMPUTE.name
_MODULE = schema.MODULE.name
_PHASES = frozenset(("prefill", "decode"))
_IMPLEMENTATION, _BACKEND = schema.IMPLEMENTATION.name, schema.BACKEND.name
_IMPLEMENTATION_RAN = schema.IMPLEMENTATION_RAN.name
_NUM_HEADS = schema.NUM_HEADS.name
# what an implementation's name may hold (transformers: "sdpa", "flash_attention_2", a hub
# kernel "kernels-community/flash-attn3"): anything else is not a name, and not put in one
_IMPL_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:")
_IMPL_MAX = 48


def implementation_of(instance: Any) -> str | None:
    """The attention implementation an instrumented module's config names (transformers'
    ``config._attn_implementation``: ``eager``, ``sdpa``, ...), read when the worker builds the
    span; None when there is none, or it is not a short plain name."""
    try:
        impl = getattr(getattr(instance, "config", None), "_attn_implementation", None)
    except Exception:  # a config's own property that raises: no implementation
        return None
    if type(impl) is str and 0 < len(impl) <= _IMPL_MAX and _IMPL_CHARS.issuperset(impl):
        return impl
    return None


_implementation = implementation_of


def _name_suffix(attrs: dict[str, Any]) -> str:
    """What an instrumented layer's or model forward's span name ends with: `` (phase,
    implementation)``, either alone, or nothing; ``recompute`` first for a forward recomputed in
    a backward pass. The implementation is the module config's, else, on a profiled attention
    call, the backend that ran. A span() block, a traced function and generate() keep their
    names."""
    if _MODULE not in attrs:
        return ""
    phase = attrs.get(_PHASE)
    parts = [phase] if phase in _PHASES else []
    if attrs.get(_RECOMPUTE) is True:
        parts.insert(0, "recompute")
    if parts or _NUM_HEADS in attrs:
        impl = attrs.get(_IMPLEMENTATION) or attrs.get(_BACKEND)
        if isinstance(impl, str) and impl:
            parts.append(impl)
    return f" ({', '.join(parts)})" if parts else ""


def _base(cap: Capture, shape: dict[str, Any], site_attrs: dict[str, Any]) -> dict[str, Any]:
    """The attributes a span starts with, in their order: the site's, tier, rate, derive's."""
    attrs = dict(site_attrs)
    attrs[_TIER] = TIER_NAMES.get(cap.tier, "timing")
    attrs[_SAMPLE_RATE] = float(cap.sample_rate)
    attrs.update(shape)
    return attrs


def capture_attributes(cap: Capture, shape: dict[str, Any], found: Measured,
                       site_attrs: dict[str, Any] | None = None,
                       implementation: Callable[[Any], str | None] | None = None,
                       bases: dict[tuple[Any, ...], Any] | None = None) -> dict[str, Any]:
    """The span attributes of one capture.

    ``shape``: the attributes of what derive found (:meth:`.derived.Derived.attributes`, kept per
    summary by the worker: read, never written); ``found``: what the worker added for this call.
    ``site_attrs``: :func:`site_attributes` of the capture's site, when the caller keeps them.
    ``implementation``: reads a module's configured implementation (default
    :func:`implementation_of`; the engine's reads each module once per batch).
    ``bases``: the caller's store of the attributes every span of one site, tier, rate and shape
    starts with (the site's, tier, rate, derive's), so that a span copies one dict.
    """
    if bases is not None and site_attrs is not None:
        key = (id(shape), id(site_attrs), cap.tier, cap.sample_rate)
        kept = bases.get(key)
        if kept is None:
            if len(bases) >= _BASES_MAX:
                bases.clear()
            # the entry holds both objects: while it is kept, their ids are no other object's
            kept = bases[key] = (shape, site_attrs, _base(cap, shape, site_attrs))
        attrs = dict(kept[2])
    else:
        attrs = _base(cap, shape, site_attrs if site_attrs is not None
                      else site_attributes(cap.site.attributes))
    found.add_to(attrs)
    if _BACKEND in attrs:  # profiled SDPA call: was it a silent fallback?
        fallback.annotate(attrs, cap.summary, str(attrs.get(_MODULE) or cap.name), cap.sdpa)
    if cap.instance is not None and _MODULE in attrs:
        impl = (implementation or _implementation)(cap.instance)
        if impl is not None:
            attrs[_IMPLEMENTATION] = impl
            if _IMPLEMENTATION_RAN in attrs:  # profiled: did the configured one run?
                fallback.annotate_implementation(attrs, str(attrs.get(_MODULE) or cap.name))
    if cap.autocast is not None:
        attrs[_AUTOCAST_DTYPE] = cap.autocast
    if cap.recompute:
        attrs[_RECOMPUTE] = True
    if cap.extra:  # span() attributes, already under their final names
        clean_attributes(cap.extra, attrs)
    wall = cap.wall_ns
    attrs[_WALL_NS] = wall
    device_ns = found.device_ns
    busy = device_ns if isinstance(device_ns, int) and device_ns > 0 else wall
    flops = attrs.get(_FLOPS)
    if isinstance(flops, int) and busy > 0:
        attrs[_TFLOPS] = sig4(flops / busy / 1e3)  # FLOP/ns = 1e9 FLOP/s; TFLOP/s = /1e3
    tokens = attrs.get(_TOKENS)
    if isinstance(tokens, int) and busy > 0:
        attrs[_TOKENS_PER_S] = sig4(tokens * 1e9 / busy)
    roofline.add_configured(attrs)
    return attrs


class Result:
    """What the worker made of one capture: all its span needs, and no live handle."""

    __slots__ = ("capture_id", "parent_id", "name", "otel_parent", "start_ns", "end_ns", "attrs",
                 "children", "error", "added", "link_id", "step_no", "kept")

    def __init__(self, cap: Capture, attrs: dict[str, Any], children: list[ChildSpan]) -> None:
        self.capture_id = cap.capture_id
        self.parent_id = cap.parent_id
        # an instrumented layer's (or model's) prefill and decode calls, eager and sdpa, told
        # apart in a search list (backends index names: bounded, no shapes or numbers)
        suffix = _name_suffix(attrs)
        name = f"{cap.name}{suffix}" if suffix else cap.name
        self.name = span_name(name)  # a str, capped: an exporter could refuse the batch
        self.otel_parent = cap.otel_parent
        self.start_ns = cap.start_epoch_ns
        self.end_ns = cap.end_epoch_ns
        self.attrs = attrs
        self.children = children
        self.error = cap.error
        self.added = time.monotonic()
        # a call profiled after a slow one links to the slow call's span (capture.grants)
        self.link_id = cap.grant.link if cap.grant is not None else None
        self.step_no = cap.step_no
        # (derive's attributes, the site's) when they alone decide the summary's kept texts
        self.kept: tuple[Any, Any] | None = None

    def add_padding_fraction(self, fraction: float) -> None:
        """A ``batch`` block's call split by row: the share of its FLOPs spent on padding."""
        self.attrs[schema.PADDING_FRACTION.name] = sig4(fraction)


def result_of(cap: Capture, shape: dict[str, Any], found: Measured, children: list[ChildSpan],
              site_attrs: dict[str, Any] | None = None,
              implementation: Callable[[Any], str | None] | None = None,
              bases: dict[tuple[Any, ...], Any] | None = None) -> Result:
    result = Result(cap, capture_attributes(cap, shape, found, site_attrs, implementation, bases),
                    children)
    if site_attrs is not None and not cap.extra:
        result.kept = (shape, site_attrs)
    return result
