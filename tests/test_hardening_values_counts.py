"""Issue 35 §12: the export identity counts the same spans on both sides.

``spans_to_export`` counts every span attnscope hands to its own pipeline, as it hands it (call
spans, kernel and operator children, step and request spans); the pipeline counts the same spans
as they end. So, once nothing is pending,
``spans_to_export == exported + export_failed + export_dropped + export_in_flight`` — also when
calls are profiled (each brings child spans), where ``emitted`` (one per call) was compared before
and came out 50 against 100 exported.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import attnscope
from attnscope.cli.traces import load_spans

CALLS = 50
SETTINGS: dict[str, Any] = {"sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0,
                            "metrics": False}
PROFILED: dict[str, Any] = {**SETTINGS, "profile_rate": 1.0, "profile_max_per_minute": 100_000.0}
EXPORT = ("exported", "export_failed", "export_dropped", "export_in_flight")


@attnscope.trace
def _attention(q: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, q, q)


def _calls(n: int = CALLS) -> None:
    q = torch.randn(1, 2, 8, 16)
    for _ in range(n):
        _attention(q)


def _settled() -> dict[str, int]:
    assert attnscope.flush(timeout_s=30)
    stats = attnscope.stats()
    assert stats["pending"] == 0 and stats["captured"] == stats["emitted"] == CALLS, stats
    return stats


def _holds(stats: dict[str, int]) -> bool:
    return stats["spans_to_export"] == sum(stats[k] for k in EXPORT)


@pytest.mark.parametrize("kind", ("jaeger-json", "otlp-json"))
def test_profiled_calls_count_their_children_on_both_sides(tmp_path: Path, kind: str) -> None:
    path = tmp_path / ("t.json" if kind == "jaeger-json" else "t.jsonl")
    attnscope.configure(exporter=f"{kind}:{path}", **PROFILED)
    _calls()
    stats = _settled()
    assert stats["profiled"] == CALLS
    assert _holds(stats), stats
    # every span in the file, the kernel children too, was counted as handed on and exported
    in_file = len(load_spans(path))
    assert stats["spans_to_export"] == stats["exported"] == in_file > CALLS, (stats, in_file)


class _Failing(SpanExporter):
    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        return None


def test_a_failing_exporter_fails_every_span_handed_on() -> None:
    attnscope.configure(exporter=_Failing(), **PROFILED)
    _calls()
    assert not attnscope.flush(timeout_s=30)  # spans were lost
    stats = attnscope.stats()
    assert stats["pending"] == 0 and stats["export_failed"] > CALLS, stats
    assert _holds(stats) and stats["spans_to_export"] == stats["export_failed"], stats


def test_step_spans_are_counted_on_both_sides() -> None:
    exporter = InMemorySpanExporter()
    attnscope.configure(exporter=exporter, **SETTINGS, profile_rate=0.0)
    for step in range(5):
        with attnscope.step(step):
            _calls(CALLS // 5)
    attnscope.step(None)
    _calls(0)
    stats = _settled()
    assert _holds(stats), stats
    assert stats["spans_to_export"] == len(exporter.get_finished_spans()) > CALLS, stats


def test_spans_the_providers_sampler_drops_are_not_handed_on(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "always_off")
    attnscope.configure(exporter=InMemorySpanExporter(), **PROFILED)
    _calls()
    stats = _settled()
    assert {k: stats[k] for k in ("spans_to_export", *EXPORT)} == dict.fromkeys(
        ("spans_to_export", *EXPORT), 0)


def test_an_applications_provider_counts_nothing_on_either_side() -> None:
    provider = TracerProvider(shutdown_on_exit=False)
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    attnscope.configure(tracer_provider=provider, **PROFILED)
    _calls()
    stats = _settled()
    assert len(memory.get_finished_spans()) > CALLS  # delivered the application's way
    assert {k: stats[k] for k in ("spans_to_export", *EXPORT)} == dict.fromkeys(
        ("spans_to_export", *EXPORT), 0)


@pytest.mark.internal_errors("pipeline")
def test_without_a_pipeline_every_span_is_handed_on_and_dropped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from attnscope._export import pipeline

    def broken(cfg: Any) -> Any:
        raise RuntimeError("no pipeline")

    monkeypatch.setattr(pipeline, "build", broken)
    attnscope.configure(exporter=InMemorySpanExporter(), **PROFILED)
    _calls()
    attnscope.flush(timeout_s=30)
    stats = attnscope.stats()
    assert stats["pending"] == 0 and stats["emitted"] == CALLS, stats
    assert _holds(stats) and stats["spans_to_export"] == stats["export_dropped"] == CALLS, stats
