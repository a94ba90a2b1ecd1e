"""attnscope._capture.batch: the rows a block declares, nested, per task, and misuse logged."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from opentelemetry import trace as otel_trace
from opentelemetry.sdk.trace import TracerProvider

from attnscope._capture.batch import batch, current_rows, rows_for


def _span() -> otel_trace.Span:
    return TracerProvider().get_tracer("t").start_span("request")


def test_rows_are_span_contexts_ids_and_padding() -> None:
    span = _span()
    ctx = otel_trace.set_span_in_context(span)
    assert current_rows() is None
    with batch(rows=[span, "req-7", None, ctx]):
        rows = current_rows()
        assert rows == (span.get_span_context(), "req-7", None, span.get_span_context())
        assert rows_for(rows, 4) == rows
    assert current_rows() is None


def test_nested_blocks_restore_the_outer_rows() -> None:
    with batch(rows=["a", "b"]):
        with batch(rows=["c"]):
            assert current_rows() == ("c",)
        assert current_rows() == ("a", "b")
    assert current_rows() is None


def test_rows_reset_when_the_block_raises() -> None:
    with pytest.raises(KeyError):
        with batch(rows=["a"]):
            raise KeyError("user")
    assert current_rows() is None


def test_each_task_sees_its_own_block() -> None:
    async def step(name: str, delay: float) -> tuple[object, ...] | None:
        with batch(rows=[name]):
            await asyncio.sleep(delay)
            return current_rows()

    async def main() -> list[tuple[object, ...] | None]:
        return list(await asyncio.gather(step("x", 0.02), step("y", 0.0)))

    assert asyncio.run(main()) == [("x",), ("y",)]


@pytest.mark.parametrize("rows", [[object()], "abc", [otel_trace.INVALID_SPAN]])
def test_bad_rows_are_logged_and_the_block_runs_unapportioned(
        rows: object, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    ran = False
    with batch(rows=rows):  # type: ignore[arg-type]
        assert current_rows() is None
        ran = True
    assert ran
    assert any("attnscope.batch" in r.getMessage() for r in caplog.records)


def test_row_count_mismatch_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="attnscope")
    with batch(rows=["a", "b"]):
        assert rows_for(current_rows(), 3) is None
        assert rows_for(current_rows(), 3) is None
        assert rows_for(current_rows(), 2) == ("a", "b")
    assert sum("different number of rows" in r.getMessage() for r in caplog.records) == 1


def test_a_sampled_call_carries_the_rows_of_its_block(monkeypatch: pytest.MonkeyPatch) -> None:
    import attnscope
    from attnscope._runtime import runtime

    held: list[Any] = []

    def keep(cap: Any) -> bool:
        held.append(cap)
        return True

    monkeypatch.setattr(runtime.worker, "submit", keep)

    @attnscope.trace(sample_rate=1.0)
    def call() -> None:
        pass

    monkeypatch.setattr(runtime.worker, "end_block", held.append)
    with batch(rows=["a", None]):
        call()
        call()
    call()
    block = held[0].batch
    assert block.rows == ("a", None) and held[1].batch is block and held[3].batch is None
    assert held[2] is block  # the block's end handed over: two calls in it were sampled
    assert (block.sampled, block.lost) == (2, 0) and block.end_epoch_ns >= block.start_epoch_ns


def test_a_block_with_no_sampled_call_hands_nothing_over(monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope._runtime import runtime

    ended: list[Any] = []
    monkeypatch.setattr(runtime.worker, "end_block", ended.append)
    with batch(rows=["a"]):
        pass
    assert ended == []
