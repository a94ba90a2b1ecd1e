"""Scenario 5: soak. Unsampled and sampled calls by the hundred thousand, and distinct
``trace(fn)`` decorations made at run time and dropped: RSS growth stays under 20 MB (the full
size; the CI size is held to the same bytes per call), and the thread count and open files are
the same at the end as after warm-up. A dropped decoration is freed (checked with weak references).
"""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import threading
import weakref
from typing import Any

import pytest
import torch

import attnscope
from tests.reliability.harness import (
    FULL,
    Figures,
    clean_env,
    open_fds,
    rss_bytes,
    sized,
    stderr_problems,
)

pytestmark = pytest.mark.reliability

UNSAMPLED = sized(ci=100_000, full=1_000_000)
SAMPLED = sized(ci=10_000, full=100_000)
DECORATIONS = sized(ci=20_000, full=100_000)
BUDGET_MB = 20.0  # at the full size
NOISE_MB = 0.0 if FULL else 4.0  # a small run is held to the same bytes per call, plus this


def _limit_mb(n: int, full_n: int) -> float:
    return BUDGET_MB * n / full_n + NOISE_MB


def _settled_rss() -> int:
    gc.collect()
    return rss_bytes()


@attnscope.trace(name="soak")
def soak(x: torch.Tensor) -> torch.Tensor:
    return x + 1


def _resources() -> tuple[int, int]:
    return threading.active_count(), open_fds()


def _attnscope_threads() -> list[str]:
    """attnscope's threads, by name (every thread it starts is named ``attnscope-*``). In the
    suite's process the other threads are whatever earlier tests' libraries keep, and they come
    and go on their own: counted too, one more at the end failed this soak once under load."""
    return sorted(t.name for t in threading.enumerate() if t.name.startswith("attnscope"))


def _soak_calls() -> dict[str, Any]:
    """The measurement, in a process of its own (``python -m tests.reliability.test_soak``): RSS
    read inside the test process would carry whatever earlier tests left behind."""
    x = torch.ones(8)
    expected = x + 1
    # warm-up: the worker, its imports and first allocations are not growth
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0)
    for _ in range(2_000):
        soak(x)
    assert attnscope.flush(timeout_s=30)
    attnscope.configure(sample_rate=0.0)
    for _ in range(2_000):
        soak(x)
    threads0, fds0 = _resources()
    rss0 = _settled_rss()

    for _ in range(UNSAMPLED):
        soak(x)
    rss_unsampled = _settled_rss()
    attnscope.configure(sample_rate=1.0)
    wrong = 0
    for i in range(SAMPLED):
        if i % 1000 == 0 and not torch.equal(soak(x), expected):
            wrong += 1
        else:
            soak(x)
        if i % 5000 == 4999:
            attnscope.flush(timeout_s=30)  # the queue is bounded: this is about leaks, not drops
    flushed = attnscope.flush(timeout_s=60)
    rss1 = _settled_rss()
    threads1, fds1 = _resources()
    return {"growth_mb": (rss1 - rss0) / 2**20, "unsampled_mb": (rss_unsampled - rss0) / 2**20,
            "threads": [threads0, threads1], "fds": [fds0, fds1], "wrong": wrong,
            "flushed": flushed, "stats": attnscope.stats()}


def test_soak_unsampled_then_sampled(figures: Figures) -> None:
    figures.set("5 soak: calls", f"{UNSAMPLED:,} unsampled + {SAMPLED:,} sampled calls "
                "(timing tier, exporter none; own process)")
    done = subprocess.run([sys.executable, "-m", "tests.reliability.test_soak"],
                          capture_output=True, text=True, timeout=1800,
                          env=clean_env(ATTNSCOPE_RELIABILITY_SIZE="full" if FULL else "ci"))
    assert done.returncode == 0 and not stderr_problems(done.stderr), done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    stats = got["stats"]
    growth_mb, unsampled_mb = got["growth_mb"], got["unsampled_mb"]
    (threads0, threads1), (fds0, fds1) = got["threads"], got["fds"]
    limit = _limit_mb(UNSAMPLED, 1_000_000) + _limit_mb(SAMPLED, 100_000)
    figures.add(rss_growth_mb=round(growth_mb, 1), rss_growth_unsampled_mb=round(unsampled_mb, 1),
                limit_mb=round(limit, 1), threads=(threads0, threads1), open_fds=(fds0, fds1),
                captured=stats["captured"], emitted=stats["emitted"])
    figures.lost = f"{stats['dropped_queue_full']} queue_full"
    assert got["wrong"] == 0 and got["flushed"]
    assert growth_mb < limit, f"RSS grew {growth_mb:.1f} MB (limit {limit:.1f} MB)"
    assert threads1 == threads0, f"threads {threads0} -> {threads1}"
    assert fds1 <= fds0, f"open files {fds0} -> {fds1}"
    assert stats["captured"] == (stats["emitted"] + stats["dropped_queue_full"]
                                 + stats["dropped_trace_cap"] + stats["worker_errors"]
                                 + stats["pending"]), stats


def test_soak_distinct_decorations(figures: Figures) -> None:
    """With Dynamo loaded, as in any process that uses torch.compile or jagged nested tensors
    (attnscope registers traced functions with Dynamo then); loaded here so the result does not
    depend on which tests ran before."""
    import torch._dynamo  # noqa: F401

    figures.set("5 soak: decorations", f"{DECORATIONS:,} distinct attnscope.trace(fn) made at "
                "run time, each called once (sampled) and dropped; torch._dynamo imported")
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0)
    x = torch.ones(2)

    def make(i: int) -> object:
        def fn(t: torch.Tensor) -> torch.Tensor:
            return t * i
        return fn

    for i in range(1_000):  # warm-up
        attnscope.trace(make(i))(x)
    assert attnscope.flush(timeout_s=30)
    threads0, fds0 = _attnscope_threads(), open_fds()
    rss0 = _settled_rss()
    refs = []
    for i in range(DECORATIONS):
        fn = make(i)
        traced = attnscope.trace(fn)
        traced(x)
        if i % 1000 == 0:
            refs.append(weakref.ref(traced))
            refs.append(weakref.ref(traced.__attnscope_site__))  # type: ignore[attr-defined]
        if i % 5000 == 4999:
            attnscope.flush(timeout_s=30)
        del fn, traced
    assert attnscope.flush(timeout_s=60)
    rss1 = _settled_rss()
    threads1, fds1 = _attnscope_threads(), open_fds()
    alive = sum(r() is not None for r in refs)
    growth_mb = (rss1 - rss0) / 2**20
    limit = _limit_mb(DECORATIONS, 100_000)
    figures.add(rss_growth_mb=round(growth_mb, 1), limit_mb=round(limit, 1),
                bytes_per_decoration=round((rss1 - rss0) / DECORATIONS),
                still_alive=f"{alive} of {len(refs)} wrappers/sites",
                attnscope_threads=(len(threads0), len(threads1)), open_fds=(fds0, fds1))
    figures.lost = "n/a"
    assert alive == 0, f"{alive} of {len(refs)} dropped wrappers or call sites are still alive"
    assert growth_mb < limit, f"RSS grew {growth_mb:.1f} MB (limit {limit:.1f} MB)"
    assert threads1 == threads0, f"attnscope's threads {threads0} -> {threads1}"
    assert fds1 <= fds0, f"open files {fds0} -> {fds1}"


if __name__ == "__main__":
    print(json.dumps(_soak_calls()))
