"""Each attribute's encoded text or bytes, kept per (key, type, value): the span encoders' cache.

attnscope's spans of one shape and site repeat almost every attribute, so the encoders of
:mod:`.otlp_encode`, :mod:`.otlp_json_text` and :mod:`.jaeger_encode` encode each (key, value)
once. Strings, ints and bools only: ``True``, ``1`` and ``1.0`` are equal keys in a dict, and the
type in the key keeps them apart (floats, rarely repeated, are encoded each time: ``0.0`` and
``-0.0`` would share one). Bounded: at most :data:`MAX` entries, strings of at most
:data:`MAX_STR` characters (a span's summary, different in every span, would only push out what
repeats); when full, it starts again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["MAX", "MAX_STR", "Kept"]

MAX = 4096  # entries (~2 MiB with strings of MAX_STR characters)
MAX_STR = 128

T = TypeVar("T")


class Kept(Generic[T]):
    """``encode(attributes)``: ``make(key, value)`` of each attribute, in order, kept.

    Shared by export threads: it changes by single dict operations, so two threads at once at
    worst make one encoding twice."""

    def __init__(self, make: Callable[[str, Any], T]) -> None:
        self.make = make
        self.entries: dict[tuple[str, type, Any], T] = {}

    def encode(self, attributes: Mapping[str, Any]) -> list[T]:
        kept, make, out = self.entries, self.make, []
        for key, value in attributes.items():
            kind = type(value)
            if kind is str and len(value) <= MAX_STR or kind is int or kind is bool:
                found = kept.get((key, kind, value))
                if found is None:
                    if len(kept) >= MAX:
                        kept.clear()
                    found = kept[key, kind, value] = make(key, value)
                out.append(found)
            else:
                out.append(make(key, value))
        return out
