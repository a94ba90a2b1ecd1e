"""What :func:`attnscope._derive.call.derive` finds for a call of plain arguments, kept per
argument summary.

A traced function called with the same shapes over and over (every decode step, every layer)
gets the same heads, tokens and FLOPs each time: derive reads nothing but the summary's shapes,
dtypes, devices and scalars. Deriving them again, and turning them into attribute names and
values, was a third of the worker's time per span. So the worker keeps, per summary, the span
attributes derive's result becomes (names prefixed, floats rounded, values bounded), and adds
only what belongs to the one call (its times, memory, the slow-call mark).

Kept: a summary of nothing but :class:`TensorMeta` and exact ``int``/``float``/``bool``/``None``
values, without a module instance (derive reads its attributes, which may change); and an
instrumented layer's :class:`AttentionFacts` whose fields are all such values (derive reads
nothing else of that call: a cache length that is an int). Layers of one model called at one cache
length share an entry. A layer's mask is named by what derive reads of it: a host tensor by its
value (``runtime.masks.token``: equal masks, one token), a CUDA mask's host copy by its numbers
(read once its events have passed); every layer of a forward given the same mask then shares
one entry; a traced function's mask argument is named the same way. A mask that cannot be named
(over the copy bound, a copy whose events timed out) is read per call.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from typing import Any

import torch

from .._record.capture import MASK_NAMES, NO_FACTS, AttentionFacts, Facts, TensorMeta
from .._record.facts import HostCopy, HostKind

__all__ = ["MAX_ENTRIES", "ShapeCache", "Shared", "summary_key"]

MAX_ENTRIES = 512  # summaries kept per worker; the oldest is forgotten first
_SCALARS = frozenset((int, float, bool, type(None)))
# what a layer's facts may hold and still be kept: immutable values (a tensor hashes by identity)
_FACT_TYPES = _SCALARS | {str, TensorMeta, torch.dtype, torch.device}
_FACT_FIELDS = operator.attrgetter(*AttentionFacts.__slots__)
# a facts key's first item: never an argument summary's (a tuple of tuples)
_FACTS_TAG = "attention facts"
_MASK = AttentionFacts.__slots__.index("mask")
_NAMED_COPIES = frozenset({HostKind.MASK, HostKind.POSITIONS})  # derive reads their numbers only
# derive's result as span attributes (``derived.Derived.attributes``): read, never written
Shared = dict[str, Any]


def summary_key(summary: Sequence[tuple[str, Any]], instance: Any,
                facts: Facts = NO_FACTS, masks: Any = None,
                device_reads: bool = True) -> tuple[Any, ...] | None:
    """A hashable key equal for two calls derive treats alike (their argument summaries, or an
    instrumented layer's facts); None: not cacheable. ``masks``: the worker's
    :class:`~attnscope._runtime.masks.MaskMemo`, to name a layer's mask (none: not cacheable);
    ``device_reads``: the capture's copies may be read (its events passed).

    A scalar's type is part of the key: ``True == 1 == 1.0`` (and they hash alike), but derive
    reads a ``bool`` as causality and an ``int`` not."""
    if (facts.attention is not None and facts.traits is None and facts.model is None
            and not summary):  # the layer's traits, if any, read its instance
        return _facts_key(facts.attention, masks, device_reads)
    if instance is not None or facts is not NO_FACTS:
        return None
    parts: list[Any] = []
    for name, value in summary:
        kind = type(value)
        if kind is TensorMeta:
            parts.append((name, value))
        elif kind in _SCALARS:
            parts.append((name, kind, value))
        elif name in MASK_NAMES and masks is not None:
            named = _mask_name(value, masks, device_reads)
            if named is None:
                return None
            parts.append((name, named))
        else:
            return None
    return tuple(parts)


def _facts_key(facts: Any, masks: Any = None, device_reads: bool = True
               ) -> tuple[Any, ...] | None:
    """An instrumented layer's facts as a key (derive reads them alone, not the instance)."""
    if type(facts) is not AttentionFacts:
        return None
    try:
        values = _FACT_FIELDS(facts)
    except AttributeError:  # a field never set
        return None
    kinds = tuple(map(type, values))
    if not _FACT_TYPES.issuperset(kinds):
        if masks is None or not _FACT_TYPES.issuperset(kinds[:_MASK] + kinds[_MASK + 1:]):
            return None
        name = _mask_name(values[_MASK], masks, device_reads)
        if name is None:
            return None
        values = (*values[:_MASK], name, *values[_MASK + 1:])
    return (_FACTS_TAG, values, kinds)


def _mask_name(mask: Any, masks: Any, device_reads: bool) -> tuple[Any, ...] | None:
    """What derive reads of a mask, as a key part: a host tensor's value token, a CUDA mask
    copy's numbers, kind and plan; None when it cannot be named."""
    if type(mask) is torch.Tensor:  # exactly: a subclass's values may read otherwise
        token = masks.token(mask)
        return None if token is None else ("mask", token)
    if type(mask) is HostCopy and mask.kind in _NAMED_COPIES and device_reads:
        try:
            return ("copy", mask.kind, tuple(mask.read()), mask.plan)
        except Exception:  # derive meets it again and says so
            return None
    return None


class ShapeCache:
    """One worker's summaries → span attributes (bounded: ``MAX_ENTRIES``, oldest out first)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._found: dict[tuple[Any, ...], Shared] = {}
        self.hits = 0
        self.misses = 0

    def get(self, key: tuple[Any, ...]) -> Shared | None:
        """What is kept for ``key``: not to be changed (every span of the summary shares it)."""
        try:
            found = self._found.get(key)
        except TypeError:  # an unhashable shape (a symbolic size): never kept
            return None
        if found is not None:
            self.hits += 1
        return found

    def put(self, key: tuple[Any, ...], shared: Shared) -> None:
        self.misses += 1
        found = self._found
        try:
            found[key] = shared
        except TypeError:
            return
        if len(found) > self.max_entries:
            del found[next(iter(found))]

    def __len__(self) -> int:
        return len(self._found)
