"""Helpers for testing code that uses attnscope (and for attnscope's own tests)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from . import _api
from ._export.ids import IDS

__all__ = ["capture_spans"]


@contextmanager
def capture_spans(**settings: Any) -> Iterator[list[ReadableSpan]]:
    """Capture attnscope's spans in memory: ``with capture_spans() as spans: ...``.

    Inside the block every call is sampled (``sample_rate=1.0``, no warm-up, no overhead budget)
    unless ``settings`` say otherwise. On exit the worker is flushed and ``spans`` holds the
    finished spans; the previous configuration is restored.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider(id_generator=IDS)  # a test's random.seed() repeats no id
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    previous = _api.current()
    chosen: dict[str, Any] = {"sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0,
                              "profile_rate": 0.0, "enabled": True}
    chosen.update(settings)
    chosen["tracer_provider"] = provider
    _api.shutdown(timeout_s=5.0)
    _api.configure(**chosen)
    spans: list[ReadableSpan] = []
    try:
        yield spans
    finally:
        _api.flush(timeout_s=10.0)
        spans.extend(exporter.get_finished_spans())
        _api.shutdown(timeout_s=5.0)
        _api.restore(previous)
        provider.shutdown()
