"""A collector that is absent, hangs or answers errors must not change the traced program.

The traced calls return the same results and raise the same exceptions as untraced ones and never
wait on the network; attnscope's queues stay within their bounds, what is lost is counted, and
flush()/shutdown() return within their timeouts.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._runtime import runtime
from tests.e2e.otlp_fakes import GRPCCollector, HTTPCollector, free_port

CALLS = 400
QUEUE = 32  # attnscope's own queue
BSP_QUEUE = 64  # the SDK batch processor's queue (OTEL_BSP_MAX_QUEUE_SIZE)


def attention_plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fail: bool = False) -> Any:
    if fail:
        raise ValueError(f"bad shapes {tuple(q.shape)}")
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


attention_traced = attnscope.trace(name="attention")(attention_plain)


def _bsp_queue_len() -> int | None:
    worker = runtime.worker.current
    if worker is None or worker.engine is None:  # no pipeline yet: its thread still builds it
        return None
    processors = getattr(getattr(worker.pipeline.provider, "_active_span_processor", None),
                         "_span_processors", ())
    for proc in processors:
        queue = getattr(getattr(proc, "_batch_processor", None), "_queue", None)
        if queue is not None:
            return len(queue)
    return None


def _export_timeout_s(mode: str) -> int:
    # A hung export lasts its whole timeout. Ten times flush()'s makes a flush that waited on the
    # exporter (>= 10 s) plain to see next to one that kept its own deadline (1 s, plus whatever
    # a loaded machine adds in scheduling: 3.3 s was seen once under four CPU burners).
    return 10 if mode == "hang" else 1


def _run(monkeypatch: pytest.MonkeyPatch, exporter: str, endpoint: str,
         bsp_queue: int = BSP_QUEUE, export_timeout_s: int = 1) -> dict[str, Any]:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    # seconds, in the Python SDK
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", str(export_timeout_s))
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", str(bsp_queue))
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "16")
    monkeypatch.setenv("OTEL_METRIC_EXPORT_INTERVAL", "100")  # metrics go to the same collector
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0, queue_size=QUEUE)
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    slowest = 0.0
    max_pending = 0
    max_bsp = 0
    for i in range(CALLS):
        t0 = time.perf_counter()
        out = attention_traced(q, k, v)
        if i > 0:  # the first call also starts the worker
            slowest = max(slowest, time.perf_counter() - t0)
        assert torch.equal(out, attention_plain(q, k, v))
        if i % 50 == 0:
            with pytest.raises(ValueError) as traced_exc:
                attention_traced(q, k, v, fail=True)
            with pytest.raises(ValueError) as plain_exc:
                attention_plain(q, k, v, fail=True)
            assert str(traced_exc.value) == str(plain_exc.value)
            assert traced_exc.traceback[-1].name == "attention_plain"
        stats = attnscope.stats()
        max_pending = max(max_pending, stats.get("pending", 0))
        max_bsp = max(max_bsp, _bsp_queue_len() or 0)
    worker = runtime.worker.current
    assert worker is not None and worker.built.wait(30)
    delivery = worker.pipeline.delivery

    t0 = time.monotonic()
    attnscope.flush(timeout_s=1.0)
    flush_s = time.monotonic() - t0
    stats = attnscope.stats()
    t0 = time.monotonic()
    attnscope.shutdown(timeout_s=2.0)
    shutdown_s = time.monotonic() - t0
    return {
        "slowest": slowest, "max_pending": max_pending, "max_bsp": max_bsp, "stats": stats,
        "flush_s": flush_s, "shutdown_s": shutdown_s,
        "lost": delivery.export_failed + delivery.export_queue_full
        + stats["dropped_queue_full"],
        "delivery": (delivery.export_failed, delivery.export_queue_full),
    }


def _check(result: dict[str, Any], expect_loss: bool) -> None:
    # The calling thread never waited on the collector: an export attempt lasts up to its
    # deadline here (1 s, 10 s when hung), a traced call a few ms (the margin is for a loaded
    # CI machine).
    assert result["slowest"] < 0.9, result
    # Bounded: attnscope's queue + spans waiting for parents, and the SDK's batch queue.
    assert result["max_pending"] <= QUEUE + 8, result
    assert result["max_bsp"] <= BSP_QUEUE, result
    stats = result["stats"]
    assert stats["captured"] == CALLS + CALLS // 50
    assert stats["emitted"] + stats["dropped_queue_full"] + stats["pending"] == stats["captured"]
    if expect_loss:
        assert result["lost"] > 0, result
    # flush(timeout_s=1.0) and shutdown(timeout_s=2.0) keep their own deadlines, not the
    # exporter's: the margin is for scheduling on a loaded machine, well under a hung export's 10 s.
    assert result["flush_s"] < 5.0, result
    assert result["shutdown_s"] < 6.0, result


@pytest.mark.parametrize("mode", ["hang", "error", "unavailable"])
def test_grpc_collector_faults(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    collector = GRPCCollector(mode).start()
    try:
        result = _run(monkeypatch, "otlp", collector.endpoint,
                      export_timeout_s=_export_timeout_s(mode))
    finally:
        collector.stop()
    _check(result, expect_loss=True)
    assert collector.calls > 0  # it really was asked


def test_grpc_collector_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(_run(monkeypatch, "otlp", f"http://127.0.0.1:{free_port()}"), expect_loss=True)


@pytest.mark.parametrize("mode", ["hang", "error"])
def test_http_collector_faults(monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    collector = HTTPCollector(mode).start()
    try:
        result = _run(monkeypatch, "otlp-http", collector.endpoint,
                      export_timeout_s=_export_timeout_s(mode))
    finally:
        collector.stop()
    _check(result, expect_loss=True)
    assert collector.calls > 0


def test_http_collector_absent(monkeypatch: pytest.MonkeyPatch) -> None:
    _check(_run(monkeypatch, "otlp-http", f"http://127.0.0.1:{free_port()}"), expect_loss=True)


def test_healthy_collector_gets_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control case: same load, a collector that answers; nothing lost, metrics arrive too."""
    collector = GRPCCollector("ok").start()
    try:
        result = _run(monkeypatch, "otlp", collector.endpoint, bsp_queue=4096)
        names = {m.name for req in collector.metric_requests for rm in req.resource_metrics
                 for sm in rm.scope_metrics for m in sm.metrics}
    finally:
        collector.stop()
    stats = result["stats"]
    assert result["lost"] == stats["dropped_queue_full"]
    assert len(collector.spans) == stats["emitted"] > 0
    assert "attnscope.attention.duration" in names
