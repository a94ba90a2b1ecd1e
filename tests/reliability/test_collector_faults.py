"""Scenario 1: collector faults. Absent, hanging, slow (2 s per export), erroring (gRPC
UNAVAILABLE, HTTP 429/500/503) and flapping collectors, under sampled traffic.

For each fault: no exception reaches the caller and outputs are unchanged; the caller's latency
is measured beside ``exporter="none"`` in the same run; RSS stays bounded; ``flush()`` and
``shutdown()`` return within their timeouts (``flush`` says False when spans failed); and once the
collector heals, every span is accounted for exactly on the client's side (``exported +
export_failed + export_dropped == emitted``), every exported span is received once, and every
other is counted in ``stats()`` as ``export_failed`` / ``export_dropped`` (one whose answer came
after the client's timeout may have been kept too: the client cannot know). A process that exits
without ``shutdown()`` while the collector is down or hanging exits within 2 s of one that exports
nothing.
A ``shutdown()`` that times out on a hanging collector returns with every span counted (those
still on their way in ``export_in_flight``), and a full batch processor queue says so in one
attnscope line, not in one SDK line per span (issue 20).

tests/e2e/test_faults.py covers bounded queues and fast calls for hang/error/unavailable/absent;
this adds slow, 429/503, flapping, exact accounting after recovery, figures and exit time.
"""

from __future__ import annotations

import json
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from tests.e2e.otlp_fakes import free_port
from tests.reliability.collectors import SLOW_S, FaultyGRPC, FaultyHTTP
from tests.reliability.harness import (
    FULL,
    Figures,
    clean_env,
    latency_summary,
    rss_bytes,
    run_script,
    sized,
    stderr_problems,
)

pytestmark = pytest.mark.reliability

CALLS = sized(ci=300, full=10_000)
QUEUE = 256
BSP_QUEUE = 64
BATCH = 16
SKIP_FIRST = 10  # the first calls start the worker and import the exporter

FAULTS = [
    ("otlp", "absent"), ("otlp", "hang"), ("otlp", "slow"), ("otlp", "unavailable"),
    ("otlp", "error"), ("otlp", "flapping"),
    ("otlp-http", "absent"), ("otlp-http", "hang"), ("otlp-http", "slow"),
    ("otlp-http", "status-429"), ("otlp-http", "status-500"), ("otlp-http", "status-503"),
    ("otlp-http", "flapping"),
]


def attention_plain(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, fail: bool = False) -> Any:
    if fail:
        raise ValueError(f"bad shapes {tuple(q.shape)}")
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


attention_traced = attnscope.trace(name="attention")(attention_plain)


@pytest.fixture
def _one_torch_thread() -> Iterator[None]:
    """The calls run on one CPU thread. With torch's default of one per core, a busy machine
    makes a call wait for a descheduled OpenMP thread: medians of 8-12 ms instead of 50 us, in
    some runs and not others, of either exporter (seen with CPU burners on 2 cores)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _traffic(n: int, escapes: list[BaseException], rss_peak: list[int]) -> list[float]:
    """``n`` sampled calls (every 50th raises the app's own error); the caller's latencies."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    expected = attention_plain(q, k, v)
    perf = time.perf_counter
    latencies: list[float] = []
    for i in range(n):
        t0 = perf()
        try:
            out = attention_traced(q, k, v)
        except BaseException as exc:  # noqa: BLE001 (an escape is what we count)
            escapes.append(exc)
            continue
        latencies.append(perf() - t0)
        if not torch.equal(out, expected):
            escapes.append(AssertionError(f"output changed at call {i}"))
        if i % 50 == 49:
            try:
                attention_traced(q, k, v, fail=True)
            except ValueError as exc:
                if str(exc) != "bad shapes (1, 2, 8, 4)":
                    escapes.append(exc)
            else:
                escapes.append(AssertionError("the app's exception was swallowed"))
        if i % 100 == 0:
            rss_peak[0] = max(rss_peak[0], rss_bytes())
    return latencies[SKIP_FIRST:]


def _configure(monkeypatch: pytest.MonkeyPatch, exporter: str, endpoint: str,
               timeout_s: float) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", str(int(timeout_s)))
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "20")
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", str(BSP_QUEUE))
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", str(BATCH))
    attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0, queue_size=QUEUE)


COUNTS = ("captured", "emitted", "dropped_queue_full", "dropped_trace_cap", "worker_errors",
          "pending", "exported", "export_failed", "export_dropped")


def _counts(since: dict[str, Any] | None = None) -> dict[str, Any]:
    """stats()'s span counts (they add up over the process's workers), minus ``since``."""
    stats = attnscope.stats()
    out = {k: stats[k] for k in COUNTS if k in stats}
    if since:
        out = {k: v - since.get(k, 0) if k != "pending" else v for k, v in out.items()}
    return out


def _accounted(counts: dict[str, Any], received: int) -> int:
    return received + counts["export_failed"] + counts["export_dropped"]


def _settle(collector: Any, since: dict[str, Any], deadline_s: float) -> dict[str, Any]:
    """Flush until every emitted span is received or counted lost (or the deadline passes)."""
    deadline = time.monotonic() + deadline_s
    while True:
        attnscope.flush(timeout_s=min(5.0, max(0.1, deadline - time.monotonic())))
        counts = _counts(since)
        if (counts.get("pending") == 0 and "export_failed" in counts
                and _accounted(counts, len(collector.spans)) >= counts["emitted"]):
            return counts
        if time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


def _start(exporter: str, mode: str, port: int = 0) -> Any:
    cls: Callable[[str], Any] = FaultyGRPC if exporter == "otlp" else FaultyHTTP
    return cls(mode).start(port)


@pytest.mark.usefixtures("_one_torch_thread")
@pytest.mark.parametrize(("exporter", "fault"), FAULTS, ids=[f"{e}-{f}" for e, f in FAULTS])
def test_collector_fault(exporter: str, fault: str, monkeypatch: pytest.MonkeyPatch,
                         figures: Figures) -> None:
    figures.set("1 collector faults", f"{CALLS} sampled calls (+1 app error per 50)",
                f"{exporter} {fault}" + (f" ({SLOW_S:.0f} s/export)" if fault == "slow" else ""))
    escapes: list[BaseException] = []

    # the same load with exporter="none", in this run, for the latency comparison
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0, queue_size=QUEUE)
    base = _traffic(CALLS, escapes, [0])
    attnscope.shutdown(timeout_s=5.0)

    port = free_port()
    collector = None if fault == "absent" else _start(exporter, fault)
    try:
        endpoint = collector.endpoint if collector is not None else f"http://127.0.0.1:{port}"
        # slow: the exporter waits long enough for a slow answer, so it succeeds (late)
        _configure(monkeypatch, exporter, endpoint, timeout_s=5 if fault == "slow" else 1)
        since = _counts()
        rss_peak = [0]
        _traffic(SKIP_FIRST, escapes, rss_peak)
        rss_start = rss_bytes()
        faulted = _traffic(CALLS, escapes, rss_peak)

        t0 = time.monotonic()
        flushed = attnscope.flush(timeout_s=1.0)
        flush_s = time.monotonic() - t0
        during = attnscope.stats()

        # heal, then everything emitted must be received or counted lost
        if collector is None:
            collector = _start(exporter, "ok", port)
        else:
            collector.heal()
        stats = _settle(collector, since, deadline_s=60.0 if FULL else 30.0)
        # the fake collector keeps a batch just after it answered for it: a bounded wait
        deadline = time.monotonic() + 10.0
        while len(collector.spans) < stats.get("exported", 0) and time.monotonic() < deadline:
            time.sleep(0.05)
        received_spans = collector.spans
        received = len(received_spans)

        # fail again, and shut down while it fails
        if fault == "absent":
            collector.stop()
        else:
            collector.fail_again(fault)
        _traffic(50, escapes, rss_peak)
        t0 = time.monotonic()
        attnscope.shutdown(timeout_s=2.0)
        shutdown_s = time.monotonic() - t0
    finally:
        if collector is not None:
            collector.stop()

    lost_failed = stats.get("export_failed", "n/a")
    lost_dropped = stats.get("export_dropped", "n/a")
    figures.lost = (f"{lost_failed} export_failed + {lost_dropped} export_dropped "
                    f"+ {stats.get('dropped_queue_full')} queue_full of {stats.get('captured')}"
                    f" captured; {received} received")
    none_lat, fault_lat = latency_summary(base), latency_summary(faulted)
    figures.add(none=none_lat, faulted=fault_lat,
                p99_ratio=round(fault_lat["p99_us"] / none_lat["p99_us"], 3),
                p50_ratio=round(fault_lat["p50_us"] / none_lat["p50_us"], 3),
                rss_growth_mb=round((rss_peak[0] - rss_start) / 2**20, 1),
                flush_s=round(flush_s, 2), flush_returned=flushed,
                shutdown_s=round(shutdown_s, 2), escapes=len(escapes),
                counts_after_recovery=stats)

    assert not escapes, escapes[:3]
    assert flush_s < 1.5, f"flush(timeout_s=1) took {flush_s:.2f} s"
    assert shutdown_s < 3.0, f"shutdown(timeout_s=2) took {shutdown_s:.2f} s"
    if fault != "flapping":  # spans failed or were still on their way: flush must not say True
        assert flushed is False, (fault, during)
    assert rss_peak[0] - rss_start < 64 * 2**20, "RSS grew by more than 64 MB under the fault"
    # latency: the strict 10% target is a figure in docs/reliability.md; here only a gross bound
    # (this machine is shared: a neighbour's burst can move a 300-call median by milliseconds)
    assert fault_lat["p50_us"] < 5 * none_lat["p50_us"] + 10_000, (none_lat, fault_lat)

    for key in ("export_failed", "export_dropped"):
        assert key in stats, f"stats() has no {key!r}: {sorted(stats)}"
    assert stats["captured"] == (stats["emitted"] + stats["dropped_queue_full"]
                                 + stats["dropped_trace_cap"] + stats["worker_errors"]
                                 + stats["pending"]), stats
    assert stats["pending"] == 0, stats
    # the client's side is exact: every emitted span exported, failed or dropped, once
    assert (stats["exported"] + stats["export_failed"] + stats["export_dropped"]
            == stats["emitted"]), stats
    # the collector's side: every exported span arrived, none twice. A batch whose answer came
    # after the client's timeout was counted failed by the client and kept by the collector: the
    # client cannot know (seen once in CI under load: 32 received, 16 exported, 96 failed). That
    # is the only overlap allowed, and the failed count bounds it.
    assert len({bytes(s.span_id) for s in received_spans}) == received, "a span arrived twice"
    assert stats["exported"] <= received <= stats["exported"] + stats["export_failed"], (
        f"{received} received, {stats['exported']} exported, {stats['export_failed']} failed")
    if fault not in ("flapping", "slow"):
        assert stats["export_failed"] + stats["export_dropped"] > 0, stats


# ---- exit without shutdown ---------------------------------------------------------------------

_EXIT_SCRIPT = textwrap.dedent(
    """
    import json, sys, time
    import torch
    import attnscope
    attnscope.configure(exporter=sys.argv[1], sample_rate=1.0, warmup_calls=0)

    @attnscope.trace
    def f(x):
        return x * 2

    x = torch.ones(4)
    for _ in range(200):
        f(x)
    time.sleep(0.5)  # the pipeline is built; some exports are under way
    print(json.dumps({"end": time.monotonic()}), flush=True)
    """
)

EXIT_CASES = [("otlp", "absent"), ("otlp", "hang")] + (
    [("otlp-http", "absent"), ("otlp-http", "hang")] if FULL else [])


def _exit_delay(tmp_path: Path, exporter: str, endpoint: str | None) -> tuple[float, Any]:
    script = tmp_path / "exit.py"
    script.write_text(_EXIT_SCRIPT.replace("sys.argv[1]", repr(exporter)))
    env = clean_env(OTEL_EXPORTER_OTLP_TIMEOUT="10")
    if endpoint is not None:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = endpoint
    proc = run_script(script, timeout_s=90, env=env)
    done = time.monotonic()
    end = json.loads(proc.stdout.strip().splitlines()[-1])["end"]
    return done - end, proc


@pytest.mark.parametrize(("exporter", "fault"), EXIT_CASES,
                         ids=[f"{e}-{f}" for e, f in EXIT_CASES])
def test_exit_without_shutdown_is_prompt(exporter: str, fault: str, tmp_path: Path,
                                         figures: Figures) -> None:
    figures.set("1 collector faults: exit", "200 sampled calls, then the script returns",
                f"{exporter} {fault}, no shutdown() (exporter timeout 10 s)")
    # The reference: the same exporter and spans against a collector that answers, so both exits
    # import and build the same pipeline (seconds apart on a loaded machine) and differ only by
    # what the fault makes exit wait for: the bound under test.
    healthy = _start(exporter, "ok")
    try:
        base_s, base_proc = _exit_delay(tmp_path, exporter, healthy.endpoint)
    finally:
        healthy.stop()
    collector = None if fault == "absent" else _start(exporter, fault)
    try:
        endpoint = (collector.endpoint if collector is not None
                    else f"http://127.0.0.1:{free_port()}")
        exit_s, proc = _exit_delay(tmp_path, exporter, endpoint)
    finally:
        if collector is not None:
            collector.stop()
    added = exit_s - base_s
    figures.add(exit_healthy_s=round(base_s, 2), exit_faulted_s=round(exit_s, 2),
                added_s=round(added, 2), target_s=2.0)
    figures.lost = "spans not exported (collector down), not counted after exit"
    assert base_proc.returncode == 0 and proc.returncode == 0, proc.stderr[-2000:]
    assert not stderr_problems(proc.stderr), proc.stderr[-2000:]
    # The target is 2 s (exit gives a hanging export 2 s): a figure, in docs/reliability.md
    # and benchmarks/bench_exit.py. What a loaded CI machine can hold the mechanism to: exit does
    # not wait out the exporter's 10 s timeout (2.84 s was seen with four burners on 2 cores).
    assert added < 8.0, f"exit took {added:.2f} s longer than with a healthy collector (target 2 s)"


# ---- a shutdown() that times out: what is still in the exporter is counted --------------------

SHUTDOWN_CASES = [("otlp", "hang"), ("otlp-http", "hang"), ("otlp-http", "status-429")]
IN_FLIGHT_CALLS = sized(ci=400, full=1_200)


def _wait_settled(deadline_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + deadline_s
    while True:
        counts = _counts() | {"export_in_flight": attnscope.stats()["export_in_flight"]}
        if counts["export_in_flight"] == 0 or time.monotonic() > deadline:
            return counts
        time.sleep(0.1)


@pytest.mark.parametrize(("exporter", "fault"), SHUTDOWN_CASES,
                         ids=[f"{e}-{f}" for e, f in SHUTDOWN_CASES])
def test_timed_out_shutdown_counts_spans_in_flight(exporter: str, fault: str,
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   figures: Figures) -> None:
    figures.set("1 collector faults: shutdown timeout",
                f"{IN_FLIGHT_CALLS} sampled calls, then shutdown(timeout_s=1)",
                f"{exporter} {fault} (exporter timeout 4 s)")
    collector = _start(exporter, fault)
    try:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", collector.endpoint)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "4")
        monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", str(4 * IN_FLIGHT_CALLS))
        monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "128")
        attnscope.configure(exporter=exporter, sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0, profile_rate=0.0, metrics=False)
        x = torch.ones(4)
        traced = attnscope.trace(name="step")(torch.mul)
        for _ in range(IN_FLIGHT_CALLS):
            traced(x, 2)
        t0 = time.monotonic()
        returned = attnscope.shutdown(timeout_s=1.0)
        shutdown_s = time.monotonic() - t0
        at_return = attnscope.stats()
        collector.heal()  # held requests fail, later ones are accepted
        settled = _wait_settled(60.0)
        # the fake collector may record a batch just after it answered for it (seen once under
        # load: 384 received of 400 exported): give it a moment to catch up
        deadline = time.monotonic() + 10.0
        while len(collector.spans) < settled["exported"] and time.monotonic() < deadline:
            time.sleep(0.05)
        received = len(collector.spans)
    finally:
        collector.stop()

    keys = ("exported", "export_failed", "export_dropped", "export_in_flight")
    figures.lost = (f"at the return of shutdown(): {at_return['export_in_flight']} in flight + "
                    f"{at_return['export_failed']} export_failed + {at_return['export_dropped']} "
                    f"export_dropped + {at_return['exported']} exported of "
                    f"{at_return['emitted']} emitted")
    figures.add(shutdown_returned=returned, shutdown_s=round(shutdown_s, 2),
                settled={k: settled[k] for k in keys}, received=received)
    assert returned is False
    assert shutdown_s < 3.0, shutdown_s
    assert at_return["pending"] == 0 and at_return["captured"] == at_return["emitted"]
    # the identity of docs/reliability.md holds when shutdown() returns, spans still on their way
    assert at_return["emitted"] == sum(at_return[k] for k in keys), at_return
    assert at_return["export_in_flight"] > 0, at_return
    # and they all end up counted once: received, failed or dropped
    assert settled["export_in_flight"] == 0, settled
    assert settled["emitted"] == sum(settled[k] for k in keys), settled
    assert received + settled["export_failed"] + settled["export_dropped"] == settled["emitted"], (
        received, settled)


def test_queue_given_up_at_shutdown_is_counted_dropped(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK's batch processor stops exporting once its shutdown timed out: what is still
    queued then is counted dropped; the batch inside the hanging export settles when it returns."""
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    from attnscope._export.pipeline import _CountingBatchSpanProcessor, _CountingExporter
    from attnscope._runtime import Delivery

    release = threading.Event()
    entered = threading.Event()

    class Hanging(SpanExporter):
        def export(self, spans: Any) -> SpanExportResult:
            entered.set()
            release.wait(30)
            return SpanExportResult.FAILURE

        def shutdown(self) -> None:
            return None

    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "8")
    # only a full batch wakes the export thread: the first export takes exactly 8 spans
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "60000")
    delivery = Delivery()
    processor = _CountingBatchSpanProcessor(_CountingExporter(Hanging(), delivery), delivery)
    inner = processor._batch_processor  # the SDK's: give up after 0.3 s, not 30 s
    sdk_shutdown = inner.shutdown
    monkeypatch.setattr(inner, "shutdown", lambda *a, **k: sdk_shutdown(timeout_millis=300))
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    for i in range(20):
        tracer.start_span(f"s{i}").end()
    assert entered.wait(10)
    assert delivery.counts()["export_in_flight"] == 20
    provider.shutdown()
    counts = delivery.counts()
    assert counts["export_in_flight"] == 8 and counts["export_dropped"] == 12, counts
    release.set()
    deadline = time.monotonic() + 10
    while delivery.counts()["export_in_flight"] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert delivery.counts() == {"exported": 0, "export_failed": 8, "export_dropped": 12,
                                 "export_in_flight": 0}
    tracer.start_span("late").end()  # after shutdown: dropped, counted, no SDK line
    assert delivery.counts()["export_dropped"] == 13


_QUEUE_FULL_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    import torch
    import attnscope
    attnscope.configure(exporter="otlp", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        metrics=False)
    f = attnscope.trace(name="step")(torch.mul)
    x = torch.ones(4)
    for _ in range(CALLS):
        f(x, 2)
    attnscope.flush(timeout_s=2)
    print(json.dumps(attnscope.stats()), flush=True)
    attnscope.shutdown(timeout_s=1)
    """
)


def test_queue_full_is_one_attnscope_line_not_one_per_span(tmp_path: Path,
                                                          figures: Figures) -> None:
    calls = sized(ci=2_000, full=20_000)
    figures.set("1 collector faults: queue full", f"{calls} sampled calls, no logging configured",
                "otlp hang, batch processor queue of 16")
    script = tmp_path / "queue_full.py"
    script.write_text(_QUEUE_FULL_SCRIPT.replace("CALLS", str(calls)))
    collector = _start("otlp", "hang")
    try:
        env = clean_env(OTEL_EXPORTER_OTLP_ENDPOINT=collector.endpoint,
                        OTEL_EXPORTER_OTLP_TIMEOUT="1", OTEL_BSP_MAX_QUEUE_SIZE="16",
                        OTEL_BSP_MAX_EXPORT_BATCH_SIZE="16")
        proc = run_script(script, timeout_s=120, env=env)
    finally:
        collector.stop()
    stats = json.loads(proc.stdout.strip().splitlines()[-1])
    sdk_lines = [line for line in proc.stderr.splitlines() if "Queue full" in line]
    ours = [line for line in proc.stderr.splitlines() if "export queue is full" in line]
    figures.lost = f"{stats['export_dropped']} export_dropped (counted)"
    figures.add(sdk_queue_full_lines=len(sdk_lines), attnscope_lines=len(ours),
                stderr_lines=len(proc.stderr.splitlines()))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert stats["export_dropped"] > 0, stats
    assert not sdk_lines, sdk_lines[:3]
    assert len(ours) == 1, proc.stderr[-2000:]
    assert not stderr_problems(proc.stderr), proc.stderr[-2000:]
