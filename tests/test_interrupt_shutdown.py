"""A Ctrl-C while ``attnscope.shutdown()`` waits (a notebook's user stops waiting).

Before: the worker, already taken out of service, was neither stopped nor put back. Every later
``flush()`` waited its whole timeout for it and said False, and the next traced call started a
second worker that found the trace file held and wrote a second file beside it. A Ctrl-C once the
worker was told to stop left its pipeline never closed. Deterministic: the wait raises the
interrupt itself (a real SIGINT lands there the same way: ``Event.wait`` returns to Python).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

import attnscope
from attnscope._export.pipeline import Pipeline
from attnscope._runtime import runtime
from attnscope._worker.loop import Worker

from .support.cli_traces import jaeger_spans


def _attention(q: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)


_traced = attnscope.trace(name="attn")(_attention)
_Q = torch.ones(1, 2, 4, 8)


def _configure(path: Path) -> None:
    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)


def _three_calls(tmp_path: Path) -> tuple[Path, Worker]:
    """Three traced calls into a Jaeger JSON file; the file and the worker running."""
    path = tmp_path / "trace.json"
    _configure(path)
    for _ in range(3):
        _traced(_Q)
    worker = runtime.worker.current
    assert worker is not None
    return path, worker


def _interrupt_once(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> list[int]:
    """``cls.name`` raises KeyboardInterrupt on its first call, then is itself again."""
    real = getattr(cls, name)
    fired: list[int] = []

    def interrupted(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not fired:
            fired.append(1)
            raise KeyboardInterrupt
        return real(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, interrupted)
    return fired


def _shutdown_cut_short(monkeypatch: pytest.MonkeyPatch, cls: type, name: str) -> None:
    """``attnscope.shutdown()``, a Ctrl-C landing in ``cls.name`` (raised on to the caller)."""
    fired = _interrupt_once(monkeypatch, cls, name)
    with pytest.raises(KeyboardInterrupt):
        attnscope.shutdown(timeout_s=30)
    assert fired == [1]


def test_a_ctrl_c_while_shutdown_drains_leaves_the_worker_running(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, worker = _three_calls(tmp_path)
    _shutdown_cut_short(monkeypatch, Worker, "wait_idle")
    # back in service, as if shutdown() had not been called
    assert runtime.worker.current is worker and not worker.stopping
    assert worker not in runtime.worker.retiring and not runtime.worker.closing
    _traced(_Q)
    assert attnscope.flush(timeout_s=30)  # before: False after its whole timeout
    assert attnscope.shutdown(timeout_s=30)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]  # before: a second file
    assert [s["operationName"] for s in jaeger_spans(path)] == ["attn"] * 4
    s = attnscope.stats()
    assert (s["captured"], s["emitted"], s["pending"]) == (4, 4, 0)


def test_a_ctrl_c_once_the_worker_stops_closes_its_pipeline_aside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path, worker = _three_calls(tmp_path)
    # told to stop, then cut short as the exporters flush (a collector that hangs)
    _shutdown_cut_short(monkeypatch, Pipeline, "force_flush")
    assert worker.stopping
    assert runtime.worker.current is None
    # the rest runs aside; flush() waits for it (before: the pipeline was never closed)
    assert attnscope.flush(timeout_s=30)
    assert not runtime.worker.closing
    assert not any(t.name == "attnscope-shutdown" and t.is_alive() for t in threading.enumerate())
    assert [s["operationName"] for s in jaeger_spans(path)] == ["attn"] * 3
    _traced(_Q)  # a new worker, a new pipeline: the file was let go, so the same file
    assert attnscope.shutdown(timeout_s=30)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["trace.json"]
    s = attnscope.stats()
    assert (s["captured"], s["emitted"], s["pending"]) == (4, 4, 0)


def test_configure_cut_short_never_puts_the_old_worker_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # configure() with a new exporter shuts the old worker down under the new settings: put
    # back, it would export under them through the old pipeline
    _configure(tmp_path / "old.json")
    _traced(_Q)
    old = runtime.worker.current
    assert old is not None
    _interrupt_once(monkeypatch, Worker, "wait_idle")
    with pytest.raises(KeyboardInterrupt):
        attnscope.configure(exporter=f"jaeger-json:{tmp_path / 'new.json'}")
    assert runtime.worker.current is None
    assert attnscope.flush(timeout_s=30)
    assert not old.thread.is_alive() and not runtime.worker.closing
    _traced(_Q)
    assert attnscope.shutdown(timeout_s=30)
    assert len(jaeger_spans(tmp_path / "old.json")) == 1
    assert len(jaeger_spans(tmp_path / "new.json")) == 1
