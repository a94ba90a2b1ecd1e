"""The span builder keeps the span contexts of recent spans as ints, not objects the GC tracks.

It remembers the last ``BUILT_KEEP`` spans' contexts (for children and slow-call links arriving
later): seconds of spans when every call is traced, long enough for the cyclic GC to move them to
its oldest generation, where each one brings the next full collection closer (a pause of every
thread). ``benchmarks/bench_gc.py`` measures the objects moved there per capture.
"""

from __future__ import annotations

import gc

import torch
from hypothesis import given
from hypothesis import strategies as st
from opentelemetry.trace import SpanContext, TraceFlags, TraceState

import attnscope
from attnscope._runtime import runtime
from attnscope._spans import spans as _spans
from attnscope.testing import capture_spans


@given(trace_id=st.integers(1, (1 << 128) - 1), span_id=st.integers(1, (1 << 64) - 1),
       flags=st.integers(0, 255))
def test_a_local_span_context_is_kept_as_an_int_and_comes_back_equal(
        trace_id: int, span_id: int, flags: int) -> None:
    sc = SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(flags))
    kept = _spans._packed(sc)
    assert type(kept) is int and not gc.is_tracked(kept)
    back = _spans._unpacked(kept)
    assert back == sc and type(back) is SpanContext
    assert (back.trace_id, back.span_id, back.trace_flags, back.is_remote) == (
        trace_id, span_id, flags, False)


def test_contexts_an_int_cannot_hold_are_kept_whole() -> None:
    with_state = SpanContext(1, 2, is_remote=False, trace_flags=TraceFlags(1),
                             trace_state=TraceState([("vendor", "value")]))
    remote = SpanContext(1, 2, is_remote=True, trace_flags=TraceFlags(1))
    for sc in (with_state, remote):
        assert _spans._packed(sc) is sc and _spans._unpacked(sc) is sc
    for sentinel in (_spans._CUT, _spans._LOST, None):
        assert _spans._unpacked(_spans._packed(sentinel)) is sentinel


def test_nested_spans_keep_their_parents_and_the_builder_holds_no_span_context() -> None:
    inner = attnscope.trace(name="inner")(
        lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q))
    outer = attnscope.trace(name="outer")(lambda q: (inner(q), inner(q)))
    q = torch.ones(1, 2, 4, 8)
    with capture_spans() as spans:
        for _ in range(20):
            outer(q)
        assert attnscope.flush(timeout_s=30)
        worker = runtime.worker.current
        assert worker is not None and worker.engine is not None
        fates = list(worker.engine.builder._fate.values())
    assert len(fates) == 60
    assert all(type(f) is int for f in fates)  # before: 60 SpanContexts (and their TraceFlags)
    by_id = {s.context.span_id: s for s in spans}
    children = [s for s in spans if s.name == "inner"]
    assert len(children) == 40
    for child in children:
        assert child.parent is not None
        parent = by_id[child.parent.span_id]
        assert parent.name == "outer" and parent.context.trace_id == child.context.trace_id
