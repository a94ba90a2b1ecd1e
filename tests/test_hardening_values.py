"""Issue 35 §8 and §21: any timeout works (infinity means wait); uninstrument() and
instrumented_modules() refuse a non-module with a clear ``TypeError`` as instrument() does."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import attnscope
from attnscope.cli.traces import load_spans

KINDS = ("jaeger-json", "otlp-json")
HUGE = (math.inf, 1e12, 10**400)


@attnscope.trace
def _double(x: torch.Tensor) -> torch.Tensor:
    return x * 2


def _traced_to(path: Path, kind: str, calls: int = 3) -> None:
    attnscope.configure(exporter=f"{kind}:{path}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0, metrics=False)
    for _ in range(calls):
        _double(torch.ones(2))


# -- §8: shutdown(timeout_s=math.inf) / flush(timeout_s=math.inf) -------------------------------

@pytest.mark.parametrize("timeout_s", HUGE, ids=("inf", "1e12", "10**400"))
@pytest.mark.parametrize("kind", KINDS)
def test_shutdown_with_an_endless_timeout_writes_the_file(tmp_path: Path, kind: str,
                                                          timeout_s: float) -> None:
    path = tmp_path / ("t.json" if kind == "jaeger-json" else "t.jsonl")
    _traced_to(path, kind)
    assert attnscope.shutdown(timeout_s=timeout_s) is True
    assert len(load_spans(path)) == 3
    stats = attnscope.stats()
    assert (stats["exported"], stats["internal_errors"]) == (3, 0)


@pytest.mark.parametrize("timeout_s", HUGE, ids=("inf", "1e12", "10**400"))
@pytest.mark.parametrize("kind", KINDS)
def test_flush_with_an_endless_timeout_exports(tmp_path: Path, kind: str,
                                               timeout_s: float) -> None:
    path = tmp_path / ("t.json" if kind == "jaeger-json" else "t.jsonl")
    _traced_to(path, kind)
    assert attnscope.flush(timeout_s=timeout_s) is True
    stats = attnscope.stats()
    assert (stats["exported"], stats["internal_errors"]) == (3, 0)
    assert attnscope.shutdown(timeout_s=timeout_s) is True
    assert len(load_spans(path)) == 3


def test_an_ordinary_timeout_is_passed_on_unchanged(monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    from attnscope._worker import stopping

    seen: list[object] = []
    real = stopping.flush
    def recorded(timeout_s: float) -> bool:
        seen.append(timeout_s)
        return real(timeout_s)

    monkeypatch.setattr(stopping, "flush", recorded)
    _traced_to(tmp_path / "t.json", "jaeger-json")
    for timeout_s in (0, 2.5, 30, math.nan):
        attnscope.flush(timeout_s=timeout_s)
    attnscope.flush(timeout_s=math.inf)
    assert seen[:3] == [0, 2.5, 30] and math.isnan(seen[3])  # type: ignore[arg-type]
    assert isinstance(seen[4], float) and 1e8 < seen[4] < 1e10


# -- §21: uninstrument() / instrumented_modules() on something that is not a module ----------------

NOT_MODULES = (None, 3, "model", object(), [torch.nn.Linear(2, 2)], torch.nn.Linear)


@pytest.mark.parametrize("entry", ("instrument", "uninstrument", "instrumented_modules"))
@pytest.mark.parametrize("value", NOT_MODULES, ids=lambda v: type(v).__name__)
def test_entry_points_refuse_a_non_module_with_a_type_error(entry: str, value: object) -> None:
    with pytest.raises(TypeError, match=rf"^attnscope\.{entry} expects an nn\.Module, got "
                                        rf"{type(value).__name__}$"):
        getattr(attnscope, entry)(value)
    assert attnscope.stats()["internal_errors"] == 0


def test_uninstrument_and_instrumented_modules_still_take_a_module() -> None:
    model = torch.nn.Sequential(torch.nn.MultiheadAttention(8, 2, batch_first=True))
    attnscope.instrument(model)
    assert attnscope.instrumented_modules(model) == ["0"]
    assert attnscope.uninstrument(model) is model
    assert attnscope.instrumented_modules(model) == []
