"""Trace and span ids from a generator of attnscope's own, not the ``random`` module's.

The SDK's ``RandomIdGenerator`` draws from the process-wide ``random`` generator, whose state
the application owns: ``random.seed(0)`` (``transformers.set_seed``, ``seed_everything``: the
usual way to make a run reproducible) replays the same ids after each call, and ``torch.compile``
saves and restores that state around a compilation, so ids drawn on the worker meanwhile come
again. Two spans with one id are one span to a backend and to ``attnscope report`` (a call was
lost, and its trace merged with another's: OpenTelemetry Python #4376). :data:`IDS` draws from
the runtime's generator (``runtime.ids``: seeded from the operating system, again in a forked
child), which nothing else reaches.
"""

from __future__ import annotations

from opentelemetry.sdk.trace.id_generator import IdGenerator
from opentelemetry.trace import INVALID_SPAN_ID, INVALID_TRACE_ID

from .._runtime import runtime

__all__ = ["IDS", "Ids"]


class Ids(IdGenerator):
    """``RandomIdGenerator``'s draws (0 is no id: drawn again) from ``runtime.ids``."""

    def __init__(self) -> None:
        self.bits = runtime.ids.rng.getrandbits  # the emitter's draw, one call a span

    def generate_span_id(self) -> int:
        span_id = self.bits(64)
        while span_id == INVALID_SPAN_ID:
            span_id = self.bits(64)
        return span_id

    def generate_trace_id(self) -> int:
        trace_id = self.bits(128)
        while trace_id == INVALID_TRACE_ID:
            trace_id = self.bits(128)
        return trace_id


IDS = Ids()  # every provider attnscope makes draws here
