"""A profile that lands on the SDPA call inside a layer call is the layer call's profile.

``attnscope run`` traces each layer's attention and SDPA itself, each sampled on its own, so a
profile often lands on the SDPA call of a layer call that was only timed. The report used to
drop it (SDPA nested in a layer is the layer's work): "No profiled calls", the layer's backend
unknown, and the layer call, slowed by the profiler, counted in the latency. The SDPA calls that
ran inside a layer call that was not sampled were a row of their own, their attention counted a
second time in "all layers".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._runtime import runtime
from attnscope._worker import latency
from attnscope.cli.report import backend_cell
from attnscope.cli.summary import summarize
from attnscope.cli.traces import attention_calls

from .support.helpers import traced_to_file

_CALLS, _PROFILED = 20, 2


def _layer(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out: torch.Tensor = F.scaled_dot_product_attention(q, k, v)  # looked up now: the wrapper
    return out


def _trace(tmp_path: Path, seen: list[tuple[str, bool]] | None = None,
           monkeypatch: pytest.MonkeyPatch | None = None) -> tuple[Path, list[Any]]:
    layer = attnscope.trace(_layer, name="layer")
    q = torch.randn(2, 4, 32, 16)
    path = tmp_path / "t.json"
    if seen is not None and monkeypatch is not None:
        observe = latency.Escalator.observe

        def spy(self: Any, cap: Any, *args: Any, **kwargs: Any) -> Any:
            seen.append((cap.site.name, cap.in_profile))
            return observe(self, cap, *args, **kwargs)

        monkeypatch.setattr(latency.Escalator, "observe", spy)

    def run() -> None:
        attnscope.instrument_sdpa()
        try:
            with torch.no_grad():
                for _ in range(_CALLS):
                    layer(q, q, q)
                assert attnscope.flush(timeout_s=30)
                # on demand (attnscope trigger): the next sampled SDPA calls are profiled; the
                # layer calls around them stay on the timing tier (profile rate 0)
                runtime.grants.set_trigger(_PROFILED, "scaled_dot_product_attention")
                for _ in range(_PROFILED):
                    layer(q, q, q)
        finally:
            attnscope.uninstrument_sdpa()

    return path, traced_to_file(path, "jaeger-json", run)


def test_the_layer_call_holding_a_profiled_call_says_so_and_names_its_backend(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[str, bool]] = []
    _, rows = _trace(tmp_path, seen, monkeypatch)
    sdpa = [r for r in rows if r.name == "scaled_dot_product_attention"]
    layers = [r for r in rows if r.name == "layer"]
    assert len(sdpa) == len(layers) == _CALLS + _PROFILED
    profiled = [r for r in sdpa if r.attributes["attnscope.tier"] == "profile"]
    assert len(profiled) == _PROFILED and all(r.attributes.get("attnscope.backend")
                                              for r in profiled)
    held = [r for r in layers if "attnscope.profiled_by" in r.attributes]
    assert sorted(r.span_id for r in held) == sorted(str(r.parent_id) for r in profiled)
    by_id = {r.span_id: r for r in profiled}
    for layer in held:
        assert layer.attributes["attnscope.tier"] == "timing"
        assert layer.attributes["attnscope.profiled_by"] == "nested"
        inner = next(r for r in profiled if r.parent_id == layer.span_id)
        for key in ("attnscope.backend", "attnscope.backend.fallback",
                    "attnscope.implementation.ran"):
            assert layer.attributes.get(key) == inner.attributes.get(key), key
        assert "a call in it profiled" in layer.attributes["attnscope.summary"]
        assert by_id[inner.span_id] is inner
    assert all("attnscope.backend" not in r.attributes for r in layers if r not in held)
    # the latency estimate never learned the slowed layer calls (nor could mark one slow)
    assert sorted(seen).count(("layer", True)) == _PROFILED
    assert ("layer", False) in seen


def test_the_report_counts_it_profiled_with_its_kernels_and_leaves_it_out_of_latency(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli import main

    path, rows = _trace(tmp_path)
    calls = attention_calls(rows)
    assert {r.name for r in calls} == {"layer"}  # SDPA in a layer is the layer's work
    profiled = [r for r in rows if r.attributes.get("attnscope.tier") == "profile"]
    backend = profiled[0].attributes["attnscope.backend"]

    assert main(["report", str(path), "--json", "-"]) == 0
    doc = json.loads(capsys.readouterr().out)
    (group,) = doc["groups"]
    assert group["module"] == "layer" and group["backend"] == backend
    assert group["calls"] == _CALLS + _PROFILED and group["profiled_calls"] == _PROFILED
    assert group["latency_calls"] == _CALLS
    walls = sorted(int(r.attributes["attnscope.wall_ns"]) for r in calls
                   if "attnscope.profiled_by" not in r.attributes)
    assert group["wall_ns"]["max"] == walls[-1] and group["wall_ns"]["min"] == walls[0]
    # kernels: the profiled SDPA calls' own, as an independent sum of their top five
    expected: dict[str, int] = {}
    for r in profiled:
        for name, ns in zip(r.attributes["attnscope.kernel.top_names"],
                            r.attributes["attnscope.kernel.top_ns"], strict=True):
            expected[name] = expected.get(name, 0) + int(ns)
    total = sum(int(r.attributes["attnscope.kernel.total_ns"]) for r in profiled)
    got = {k["name"]: (k["ns"], k["share"]) for k in group["kernels"]}
    assert got == {name: (ns, pytest.approx(ns / total)) for name, ns in expected.items()}

    assert main(["report", str(path)]) == 0
    out = capsys.readouterr().out
    assert (f"{_CALLS} timed, {_PROFILED} profiled ({_PROFILED} through the call nested in it)"
            in " ".join(out.split()))
    assert f"Top kernels/ops of the {_PROFILED} profiled calls" in out
    assert "No profiled calls" not in out


def test_a_profiled_inner_call_on_its_own_still_gives_its_kernels(tmp_path: Path) -> None:
    """An SDPA call profiled while its layer call was not sampled: its layer is not known, but
    its kernels are the program's attention kernels (the overall table's)."""
    _, rows = _trace(tmp_path)
    profiled = {r.span_id for r in rows if r.attributes.get("attnscope.tier") == "profile"}
    kept = [r for r in rows if r.span_id not in {p.parent_id for p in rows
                                                 if p.span_id in profiled}]
    summary = summarize(attention_calls(kept), rows=kept)
    assert summary.overall.profiled == 0 and summary.overall.profiles == _PROFILED
    assert summary.overall.kernels and all(g.profiles == 0 for g in summary.groups)
    backends = {r.attributes["attnscope.backend"] for r in rows if r.span_id in profiled}
    assert all(g.backend is None for g in summary.groups)  # whose layer call, not known
    assert backend_cell(summary, summary.overall) == ",".join(sorted(backends))


def test_only_the_calls_holding_the_profile_are_marked(tmp_path: Path) -> None:
    """A block holding two layer calls, the first one's SDPA call profiled: the block and that
    layer call held the profile; the second layer call ran without it and stays a timed call
    (a ``nested`` parent is not an ``enclosing`` one)."""
    layer = attnscope.trace(_layer, name="layer")
    q = torch.randn(2, 4, 32, 16)

    def run() -> None:
        attnscope.instrument_sdpa()
        try:
            with torch.no_grad():
                for _ in range(3):
                    layer(q, q, q)
                assert attnscope.flush(timeout_s=30)
                runtime.grants.set_trigger(1, "scaled_dot_product_attention")
                with attnscope.span("block"):
                    layer(q, q, q)
                    layer(q, q, q)
        finally:
            attnscope.uninstrument_sdpa()

    rows = traced_to_file(tmp_path / "t.json", "jaeger-json", run)
    (block,) = [r for r in rows if r.name == "block"]
    first, second = sorted((r for r in rows if r.name == "layer" and r.parent_id == block.span_id),
                           key=lambda r: r.start_ns)
    assert block.attributes.get("attnscope.profiled_by") == "nested"
    assert "attnscope.backend" not in block.attributes  # no attention call: what ran is its calls'
    assert first.attributes.get("attnscope.profiled_by") == "nested"
    assert "attnscope.profiled_by" not in second.attributes
    assert [r.span_id for r in attention_calls(rows) if "attnscope.profiled_by" not in
            r.attributes][-1] == second.span_id


def test_the_attention_call_timed_inside_a_profiled_block_takes_its_fallback_verdict(
        tmp_path: Path) -> None:
    """The verdict of a profiled call that is no attention call (a decoder layer, a block) is
    judged on the one SDPA call made in it: the attention call timed inside it made that call."""
    layer = attnscope.trace(_layer, name="layer")
    q = torch.randn(2, 4, 32, 16)

    def run() -> None:
        with torch.no_grad():
            for _ in range(2):
                with attnscope.sampling(force=True, profile=True), attnscope.span("block"):
                    layer(q, q, q)
            with attnscope.sampling(force=True, profile=True), attnscope.span("two"):
                layer(q, q, q)
                layer(q, q, q)

    rows = traced_to_file(tmp_path / "t.json", "jaeger-json", run, profile_max_per_minute=1000)
    verdict = ("attnscope.backend.fallback", "attnscope.backend.expected",
               "attnscope.backend.reason")
    blocks = [r for r in rows if r.name == "block"]
    assert len(blocks) == 2
    for block in blocks:
        assert block.attributes["attnscope.tier"] == "profile"
        assert "attnscope.backend.fallback" in block.attributes
        (inner,) = [r for r in rows if r.name == "layer" and r.parent_id == block.span_id]
        assert inner.attributes["attnscope.profiled_by"] == "enclosing"
        assert {k: inner.attributes.get(k) for k in verdict} == \
            {k: block.attributes.get(k) for k in verdict}
    (two,) = [r for r in rows if r.name == "two"]
    assert all("attnscope.backend.fallback" not in r.attributes
               for r in rows if r.name == "layer" and r.parent_id == two.span_id)
