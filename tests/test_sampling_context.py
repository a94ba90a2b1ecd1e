"""The parent context a sampled call reads: OpenTelemetry's current context, read through the
API's own ContextVar when its runtime context is the default one (two Python calls fewer, twice
per sampled call), through ``get_current()`` otherwise."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

from attnscope._capture import sampling


def _with_span(trace_id: int) -> otel_context.Context:
    span = NonRecordingSpan(SpanContext(trace_id, 7, is_remote=False,
                                        trace_flags=TraceFlags(TraceFlags.SAMPLED)))
    return otel_trace.set_span_in_context(span)


def test_the_direct_read_is_the_apis_current_context_wherever_it_is_set() -> None:
    read = sampling._current_context
    assert read is not otel_context.get_current  # the default runtime context: the direct read
    assert read() is otel_context.get_current()
    token = otel_context.attach(_with_span(1))
    try:
        assert read() is otel_context.get_current()
        assert otel_trace.get_current_span(read()).get_span_context().trace_id == 1
        seen: list[Any] = []

        def other_thread() -> None:  # a thread starts from an empty context
            seen.append(read() is otel_context.get_current())
            seen.append(otel_trace.get_current_span(read()).get_span_context().is_valid)

        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
        assert seen == [True, False]

        async def task(trace_id: int) -> tuple[bool, int]:
            inner = otel_context.attach(_with_span(trace_id))
            try:
                await asyncio.sleep(0)
                ctx = read()
                return ctx is otel_context.get_current(), \
                    otel_trace.get_current_span(ctx).get_span_context().trace_id
            finally:
                otel_context.detach(inner)

        async def both() -> list[tuple[bool, int]]:
            return list(await asyncio.gather(task(2), task(3)))

        assert asyncio.run(both()) == [(True, 2), (True, 3)]
    finally:
        otel_context.detach(token)
    assert read() is otel_context.get_current()
    assert not otel_trace.get_current_span(read()).get_span_context().is_valid


def test_another_runtime_context_is_read_through_get_current(
        monkeypatch: pytest.MonkeyPatch) -> None:
    class Elsewhere:  # OTEL_PYTHON_CONTEXT naming an implementation of the application's
        _current_context = None

        def get_current(self) -> otel_context.Context:
            return otel_context.Context()

    monkeypatch.setattr(otel_context, "_RUNTIME_CONTEXT", Elsewhere())
    assert sampling._current_context_reader() is otel_context.get_current
    # names gone (a future release): the public call, and never an error at import
    monkeypatch.delattr(otel_context, "_RUNTIME_CONTEXT")
    assert sampling._current_context_reader() is otel_context.get_current
