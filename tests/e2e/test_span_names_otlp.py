"""One span with an odd name must not cost the rest of its export batch (issue 10).

Before the fix, a span whose name was not a str failed the OTLP encoding of the whole batch: a
collector received 0 of 201 spans while stats() said all were emitted.
"""

from __future__ import annotations

import pytest

import attnscope
from attnscope._spans.emit import MAX_NAME
from tests.e2e.otlp_fakes import HTTPCollector

GOOD_CALLS = 200


def test_good_spans_arrive_after_a_span_with_an_odd_name(monkeypatch: pytest.MonkeyPatch) -> None:
    @attnscope.trace
    def odd(x: int) -> int:
        return x + 1

    @attnscope.trace(name="L" * 5_000)
    def long_named(x: int) -> int:
        return x + 1

    @attnscope.trace(name="good")
    def good(x: int) -> int:
        return x + 1

    # trace() refuses a name that is not a str; this one got past it (an internal call site).
    odd.__attnscope_site__.name = 123  # type: ignore[attr-defined]
    collector = HTTPCollector("ok").start()
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
        attnscope.configure(exporter="otlp-http", sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0, profile_rate=0.0, metrics=False)
        assert odd(1) == 2
        assert long_named(1) == 2
        for i in range(GOOD_CALLS):
            assert good(i) == i + 1
        assert attnscope.flush(timeout_s=10)
        assert attnscope.shutdown(timeout_s=10)
        names = [span.name for span in collector.spans]
    finally:
        collector.stop()
    assert names.count("good") == GOOD_CALLS
    assert names.count("123") == 1
    assert names.count("L" * MAX_NAME) == 1
    assert len(names) == GOOD_CALLS + 2
