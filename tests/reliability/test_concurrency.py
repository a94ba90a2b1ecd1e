"""Scenario 2: concurrency. 16 threads and many asyncio tasks with nested spans across awaits,
and ``configure()`` racing the traffic.

Every child span has the right parent (its own thread's or task's outer span); the counts are
exact: ``sampled == captured == emitted + dropped_queue_full + dropped_trace_cap + worker_errors
+ pending``, and the spans that arrive are exactly the emitted ones.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from typing import Any

import pytest
import torch

import attnscope
from attnscope.testing import capture_spans
from tests.reliability.harness import Figures, sized

pytestmark = pytest.mark.reliability

THREADS = 16
PER_THREAD = sized(ci=150, full=3_000)
TASKS = sized(ci=200, full=2_000)
RACE_S = sized(ci=3, full=30)


@attnscope.trace(name="inner")
def inner(x: torch.Tensor, tag: int) -> torch.Tensor:
    return x * 2 + tag


@attnscope.trace(name="inner-async")
async def inner_async(x: torch.Tensor, tag: int) -> torch.Tensor:
    await asyncio.sleep(0)
    return x + tag


def _identity(stats: dict[str, Any]) -> None:
    assert stats["captured"] == (stats["emitted"] + stats["dropped_queue_full"]
                                 + stats["dropped_trace_cap"] + stats["worker_errors"]
                                 + stats["pending"]), stats


def _task_of(span: Any) -> Any:
    """The thread or task a span belongs to: its ``app.owner`` attribute or its name's suffix."""
    owner = dict(span.attributes or {}).get("app.owner")
    if owner is None and "-" in span.name:
        owner = int(span.name.rsplit("-", 1)[1])
    return owner


def _check_parents(spans: list[Any], outer_prefix: str) -> tuple[int, int]:
    """Every inner span's parent is the outer span of the same owner; returns (outer, inner)."""
    by_id = {s.context.span_id: s for s in spans}
    outers = [s for s in spans if s.name.startswith(outer_prefix)]
    inners = [s for s in spans if not s.name.startswith(outer_prefix)]
    wrong = []
    for child in inners:
        parent = by_id.get(child.parent.span_id) if child.parent is not None else None
        if parent is None or parent.name != f"{outer_prefix}{_task_of(child)}":
            wrong.append((child.name, _task_of(child), parent.name if parent else None))
        elif child.context.trace_id != parent.context.trace_id:
            wrong.append((child.name, "trace id differs"))
    assert not wrong, f"{len(wrong)} children with a wrong parent, e.g. {wrong[:5]}"
    return len(outers), len(inners)


def test_threads_nested_spans_parents_and_counts(figures: Figures) -> None:
    figures.set("2 concurrency: threads", f"{THREADS} threads x {PER_THREAD} outer spans, "
                "each with 2 traced children")
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)
    x = torch.ones(4)
    # one traced function per thread, named after it, so a child tells whose it is
    traced = [attnscope.trace(name=f"inner-{t}")(inner.__wrapped__) for t in range(THREADS)]

    def work(t: int) -> None:
        try:
            start.wait(30)
            for _ in range(PER_THREAD):
                with attnscope.span(f"outer-{t}", attributes={"app.owner": t}):
                    with attnscope.span("inner-block", attributes={"app.owner": t}):
                        pass
                    out = traced[t](x, t)
                    if not torch.equal(out, x * 2 + t):
                        raise AssertionError("output changed")
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    with capture_spans(queue_size=1_000_000, max_spans_per_trace=100) as spans:
        threads = [threading.Thread(target=work, args=(t,)) for t in range(THREADS)]
        t0 = time.monotonic()
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        elapsed = time.monotonic() - t0
        assert attnscope.flush(timeout_s=60)
        stats = attnscope.stats()
    assert not errors, errors[:3]
    assert not any(th.is_alive() for th in threads)
    outers, inners = _check_parents(list(spans), "outer-")
    calls = THREADS * PER_THREAD
    figures.add(elapsed_s=round(elapsed, 2), spans=len(spans), stats={
        k: stats[k] for k in ("sampled", "captured", "emitted", "dropped_queue_full", "pending")})
    figures.lost = f"{stats['dropped_queue_full']} queue_full, {stats['worker_errors']} errors"
    assert outers == calls and inners == 2 * calls
    assert stats["sampled"] == stats["captured"] == 3 * calls
    _identity(stats)
    assert stats["pending"] == 0 and stats["emitted"] == len(spans) == 3 * calls


def test_asyncio_tasks_nested_spans_across_awaits(figures: Figures) -> None:
    figures.set("2 concurrency: asyncio", f"{TASKS} concurrent tasks x 5 steps, spans held "
                "across awaits, plus 4 threads each running its own loop")
    errors: list[BaseException] = []
    x = torch.ones(3)

    async def task(k: int) -> None:
        for step in range(5):
            with attnscope.span(f"task-{k}", attributes={"app.owner": k}):
                await asyncio.sleep(random.random() * 0.002)
                with attnscope.span("step", attributes={"app.owner": k, "app.step": step}):
                    await asyncio.sleep(0)
                    out = await inner_async(x, k)
                    if not torch.equal(out, x + k):
                        raise AssertionError("output changed")
                await asyncio.sleep(0)

    async def main(offset: int) -> None:
        await asyncio.gather(*(task(offset + k) for k in range(TASKS)))

    def loop_thread(offset: int) -> None:
        try:
            asyncio.run(main(offset))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    loops = 4
    with capture_spans(queue_size=1_000_000, max_spans_per_trace=100) as spans:
        threads = [threading.Thread(target=loop_thread, args=(i * TASKS,)) for i in range(loops)]
        for th in threads:
            th.start()
        for th in threads:
            th.join(300)
        assert attnscope.flush(timeout_s=60)
        stats = attnscope.stats()
    assert not errors, errors[:3]
    by_id = {s.context.span_id: s for s in spans}
    wrong = []
    for s in spans:
        if s.name == "step":
            parent = by_id.get(s.parent.span_id) if s.parent else None
            if parent is None or parent.name != f"task-{_task_of(s)}":
                wrong.append(("step", _task_of(s), parent and parent.name))
        elif s.name == "inner-async":
            parent = by_id.get(s.parent.span_id) if s.parent else None
            if parent is None or parent.name != "step":
                wrong.append(("inner-async", parent and parent.name))
    calls = loops * TASKS * 5
    figures.add(spans=len(spans), wrong_parents=len(wrong))
    figures.lost = f"{stats['dropped_queue_full']} queue_full"
    assert not wrong, f"{len(wrong)} wrong parents, e.g. {wrong[:5]}"
    assert stats["sampled"] == stats["captured"] == 3 * calls
    _identity(stats)
    assert stats["emitted"] == len(spans) == 3 * calls


def test_configure_racing_traffic(figures: Figures) -> None:
    figures.set("2 concurrency: configure() race", f"8 threads of traced calls for {RACE_S} s "
                "while the main thread reconfigures (rates, exporter, queue size)")
    stop = threading.Event()
    errors: list[BaseException] = []
    calls = [0] * 8
    x = torch.arange(4.0)

    def traffic(i: int) -> None:
        try:
            while not stop.is_set():
                with attnscope.span("racing"):
                    if not torch.equal(inner(x, i), x * 2 + i):
                        raise AssertionError("output changed")
                calls[i] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0)
    threads = [threading.Thread(target=traffic, args=(i,)) for i in range(8)]
    for th in threads:
        th.start()
    rng = random.Random(0)
    reconfigured = 0
    deadline = time.monotonic() + RACE_S
    try:
        while time.monotonic() < deadline:
            choice = rng.randrange(4)
            if choice == 0:
                attnscope.configure(sample_rate=rng.choice([0.0, 0.1, 1.0]))
            elif choice == 1:
                attnscope.configure(queue_size=rng.choice([16, 1024, 100_000]))
            elif choice == 2:
                attnscope.configure(enabled=rng.random() < 0.8)
            else:
                attnscope.configure(warmup_calls=rng.choice([0, 5]),
                                    overhead_budget=rng.choice([0.01, 1.0]))
            reconfigured += 1
            time.sleep(0.02)
    finally:
        stop.set()
        for th in threads:
            th.join(60)
    attnscope.configure(enabled=True)
    assert attnscope.flush(timeout_s=30)
    stats = attnscope.stats()
    figures.add(calls=sum(calls), reconfigurations=reconfigured,
                internal_errors=stats["internal_errors"])
    figures.lost = f"{stats['dropped_queue_full']} queue_full (queue as small as 16)"
    assert not errors, errors[:3]
    assert not any(th.is_alive() for th in threads), "a traffic thread hung"
    assert stats["internal_errors"] == 0, stats
    _identity(stats)
    assert stats["pending"] == 0
