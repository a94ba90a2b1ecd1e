"""Span and trace ids that nothing in the application can make repeat: not ``random.seed()``
(the usual way to make an ML run reproducible), not ``torch.compile`` restoring the ``random``
state, not a fork; and a forked child samples other calls than its parent and siblings."""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import attnscope
from attnscope.testing import capture_spans


@pytest.fixture(autouse=True)
def _random_state() -> Iterator[None]:
    state = random.getstate()  # other tests' draws stay as they were
    yield
    random.setstate(state)


def _traced() -> object:
    @attnscope.trace(name="outer")
    def outer(x: torch.Tensor) -> torch.Tensor:
        return inner(x) + 1

    @attnscope.trace(name="inner")
    def inner(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    return outer


def test_random_seed_between_calls_repeats_no_id(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    attnscope.configure(exporter=f"jaeger-json:{path}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    outer = _traced()
    try:
        for _ in range(5):
            random.seed(0)  # transformers.set_seed(0), seed_everything(0), ...
            outer(torch.ones(2))  # type: ignore[operator]
            assert attnscope.flush(timeout_s=30)  # the worker draws the ids now
            random.seed(0)
    finally:
        assert attnscope.shutdown(timeout_s=30)
    spans = [s for t in json.loads(path.read_text())["data"] for s in t["spans"]]
    assert len(spans) == 10
    assert len({s["spanID"] for s in spans}) == 10
    assert len({s["traceID"] for s in spans}) == 5  # each outer call a trace, inner under it
    for s in spans:
        if s["operationName"] == "inner":
            (ref,) = s["references"]
            assert ref["traceID"] == s["traceID"]


def test_capture_spans_ids_survive_random_seed() -> None:
    outer = _traced()
    with capture_spans() as spans:
        for _ in range(3):
            random.seed(1)
            outer(torch.ones(2))  # type: ignore[operator]
            attnscope.flush(timeout_s=30)
    assert len(spans) == 6
    assert len({s.context.span_id for s in spans}) == 6
    assert len({s.context.trace_id for s in spans}) == 3


_CHILDREN = textwrap.dedent(
    """
    import json, os, sys
    import attnscope
    out = sys.argv[1]
    attnscope.trace  # loads the library
    attnscope.configure(exporter="none", sample_rate=0.2, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0)
    pids = []
    for k in range(2):
        pid = os.fork()
        if pid == 0:
            attnscope.configure(exporter=f"otlp-json:{out}/child{k}.jsonl", sample_rate=0.2,
                                warmup_calls=0, overhead_budget=1.0, profile_rate=0.0)
            for i in range(400):
                with attnscope.span("work", attributes={"i": i}):
                    pass
            attnscope.shutdown(timeout_s=30)
            os._exit(0)
        pids.append(pid)
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    """
)


def _sampled(path: Path) -> tuple[set[int], set[str]]:
    """(the i of each sampled block, its span ids) of one child's OTLP/JSON file."""
    calls, ids = set(), set()
    for line in path.read_text().splitlines():
        for rs in json.loads(line)["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for span in ss["spans"]:
                    attrs = {a["key"]: a["value"] for a in span["attributes"]}
                    if "i" in attrs:
                        calls.add(int(attrs["i"]["intValue"]))
                        ids.add(span["spanId"])
    return calls, ids


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_forked_children_sample_other_calls_and_draw_other_ids(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", _CHILDREN, str(tmp_path)], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    (calls0, ids0), (calls1, ids1) = (_sampled(tmp_path / f"child{k}.jsonl") for k in (0, 1))
    # 400 blocks at rate 0.2 each: about 80 sampled; the same 80 only if the draws were shared
    assert 40 < len(calls0) < 140 and 40 < len(calls1) < 140
    assert calls0 != calls1
    assert not ids0 & ids1
