"""Scenario 1: collector faults. Absent, hanging, slow (2 s per export), erroring (gRPC
UNAVAILABLE, HTTP 429/500/503) and flapping collectors, under sampled traffic.

For each fault: no exception reaches the caller and outputs are unchanged; the caller's latency
is measured beside ``exporter="none"`` in the same run; RSS stays bounded; ``flush()`` and
``shutdown()`` return within their timeouts (``flush`` says False when spans failed); and once the
collector heals, every span is accounted for exactly: received by the collector, or counted in
``stats()`` as ``export_failed`` / ``export_dropped``. A process that exits without
``shutdown()`` while the collector is down or hanging exits within 2 s of one that exports nothing.

tests/e2e/test_faults.py covers bounded queues and fast calls for hang/error/unavailable/absent;
this adds slow, 429/503, flapping, exact accounting after recovery, figures and exit time.
"""

from __future__ import annotations

import json
import textwrap
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
        received = len(collector.spans)

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
    assert _accounted(stats, received) == stats["emitted"], (
        f"{received} received + {stats['export_failed']} failed + {stats['export_dropped']} "
        f"dropped != {stats['emitted']} emitted")
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
    base_s, base_proc = _exit_delay(tmp_path, "none", None)
    collector = None if fault == "absent" else _start(exporter, fault)
    try:
        endpoint = (collector.endpoint if collector is not None
                    else f"http://127.0.0.1:{free_port()}")
        exit_s, proc = _exit_delay(tmp_path, exporter, endpoint)
    finally:
        if collector is not None:
            collector.stop()
    added = exit_s - base_s
    figures.add(exit_none_s=round(base_s, 2), exit_faulted_s=round(exit_s, 2),
                added_s=round(added, 2), target_s=2.0)
    figures.lost = "spans not exported (collector down), not counted after exit"
    assert base_proc.returncode == 0 and proc.returncode == 0, proc.stderr[-2000:]
    assert not stderr_problems(proc.stderr), proc.stderr[-2000:]
    # the target is 2 s; a little slack for this shared machine
    assert added < 2.5, f"exit took {added:.2f} s longer than with exporter='none' (target 2 s)"
