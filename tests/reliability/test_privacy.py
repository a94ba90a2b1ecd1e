"""Scenario 7: privacy. A sentinel value in every tensor (inputs, masks, the KV cache of an
instrumented module, tensors given as attribute values), in scalar and string arguments, never
leaves the process: not in exported spans, not in the ``attnscope`` logger's records (an internal
error included, at DEBUG, where tracebacks are shown), not in ``profile_dir`` Chrome traces.

The application's own exception text is the one exception: it is recorded (OTel convention), capped
at 4 KB, so a sentinel placed after the first 4 KB of a message must not appear either.
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import attnscope
from attnscope._capture import profiler_session as _profiler
from attnscope._derive import call as derive
from tests.reliability.harness import (
    FLOAT_SENTINEL,
    INT_SENTINEL,
    STR_SENTINEL,
    Figures,
    leaks,
    otlp_json_spans,
    sized,
)

pytestmark = pytest.mark.reliability

CALLS = sized(ci=20, full=500)
MESSAGE_CAP = 4096


def _tensor(*shape: int) -> torch.Tensor:
    return torch.full(shape, FLOAT_SENTINEL)


@attnscope.trace(name="attention")
def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor,
              factor: float, count: int, tag: str, note: Any = None) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    return torch.mul(out, factor) + count  # the scalars reach torch ops (profiler inputs)


def _traffic() -> None:
    q = _tensor(1, 2, 4, 8)
    mask = torch.full((1, 1, 4, 4), FLOAT_SENTINEL)
    ints = torch.full((3,), INT_SENTINEL, dtype=torch.int64)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    attnscope.instrument(mha)
    for _ in range(CALLS):
        attention(q, q, q, mask, FLOAT_SENTINEL, INT_SENTINEL, STR_SENTINEL, note=ints)
        attention(q, k=q, v=q, attn_mask=mask, factor=FLOAT_SENTINEL, count=INT_SENTINEL,
                  tag=STR_SENTINEL, note=[STR_SENTINEL, INT_SENTINEL])
        x = _tensor(1, 4, 8)
        mha(x, x, x, key_padding_mask=torch.zeros(1, 4, dtype=torch.bool))
        with attnscope.span("block", attributes={"app.tensor": _tensor(2), "app.ints": ints}) as s:
            s.set(app_value=_tensor(3), app_list=[_tensor(1)])
        traced_with_attrs(q)
    # the application's own error: its message is kept, capped
    message = "x" * (MESSAGE_CAP + 100) + STR_SENTINEL
    with pytest.raises(ValueError):
        failing(message)


@attnscope.trace(name="with-attrs", attributes={"app.tensor": _tensor(2)})
def traced_with_attrs(q: torch.Tensor) -> torch.Tensor:
    return q.sum()


@attnscope.trace(name="failing")
def failing(message: str) -> None:
    raise ValueError(message)


def test_sentinel_never_in_exported_spans(tmp_path: Path, figures: Figures) -> None:
    figures.set("7 privacy: spans", f"{CALLS} rounds: traced SDPA, an instrumented "
                "nn.MultiheadAttention, span() with tensor attributes, a 4 KB+ exception message",
                "sentinel 7654321.5 / 271828182 / 'SENTINEL-b7f3c2' in every tensor and argument")
    out = tmp_path / "spans.jsonl"
    attnscope.configure(exporter=f"otlp-json:{out}", sample_rate=1.0, warmup_calls=0,
                        overhead_budget=1.0, profile_rate=0.0)
    _traffic()
    assert attnscope.flush(timeout_s=30)
    text = out.read_text()
    spans = otlp_json_spans(out)
    found = leaks(text)
    figures.add(spans=len(spans), bytes=len(text), leaked=found)
    figures.lost = "n/a"
    assert spans, "nothing exported"
    where = [(s["name"], a["key"]) for s in spans for a in s.get("attributes", [])
             if leaks(str(a))]
    events = [(s["name"], str(e)[:200]) for s in spans for e in s.get("events", [])
              if leaks(str(e))]
    assert not found, f"sentinel {found} exported in attributes {where[:8]}, events {events[:2]}"
    for s in spans:
        for e in s.get("events", []):
            for a in e.get("attributes", []):
                if a["key"] == "exception.message":
                    assert len(a["value"].get("stringValue", "")) <= MESSAGE_CAP + 64


def _render_like_rich(record: logging.LogRecord) -> str:
    """A record as a handler that shows locals (rich's ``show_locals``, structlog's dev
    renderer) would print it: message, structured fields, and any exception with its frames."""
    text = logging.Formatter("%(levelname)s %(name)s %(message)s").format(record)
    text += " " + repr(getattr(record, "attnscope", ""))
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        text += "".join(traceback.TracebackException.from_exception(
            exc, capture_locals=True).format())
    return text


@pytest.mark.internal_errors("capture", "worker")
def test_sentinel_never_in_logs(caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch,
                                figures: Figures) -> None:
    """Internal errors on both sides while the sentinel tensors are in their frames' locals."""
    figures.set("7 privacy: logs", "the traffic above with internal errors injected on the "
                "worker (derive) and at capture (argument summary), logger at DEBUG",
                "sentinel in every tensor and argument")
    from attnscope._capture import args as _args
    from attnscope._record import capture as _capture

    def failing_derive(summary: Any, instance: Any = None) -> Any:
        raise RuntimeError("injected worker failure")

    reached: list[bool] = []

    def failing_meta(cls: Any, fields: Any) -> Any:  # a tensor argument's summary
        reached.append(True)
        raise RuntimeError("injected capture failure")

    monkeypatch.setattr(derive, "derive", failing_derive)
    # the pairs summary (instrumented calls' fallback) and a traced call's flat summary made
    # pairs on the calling thread (a call with a mask: the mask is in the frame)
    monkeypatch.setattr(_args, "_meta_new", failing_meta)
    monkeypatch.setattr(_capture, "_meta_new", failing_meta)
    caplog.set_level(logging.DEBUG, logger="attnscope")
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0)
    _traffic()
    attnscope.flush(timeout_s=30)
    records = [r for r in caplog.records if r.name.startswith("attnscope")]
    rendered = [_render_like_rich(r) for r in records]
    found = sorted({p for text in rendered for p in leaks(text)})
    figures.add(records=len(records), internal_errors=attnscope.stats()["internal_errors"],
                leaked=found)
    figures.lost = "n/a"
    assert attnscope.stats()["internal_errors"] > 0, "the injected failures were not reached"
    assert reached, "the injected capture failure was not reached"
    assert records, "nothing was logged"
    bad = [text[:300] for text in rendered if leaks(text)]
    assert not found, f"sentinel {found} in log records, e.g. {bad[:2]}"


def test_sentinel_never_in_profile_files(tmp_path: Path, figures: Figures) -> None:
    figures.set("7 privacy: profile_dir", f"{CALLS} rounds, every call profiled "
                "(profile_rate=1.0), Chrome traces written to profile_dir",
                "sentinel in every tensor and argument")
    assert _profiler.warm_up(), "the profiler must warm up on CPU"
    profile_dir = tmp_path / "traces"
    attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=1.0, profile_max_per_minute=1e6,
                        profile_dir=str(profile_dir))
    _traffic()
    assert attnscope.flush(timeout_s=60)
    files = [p for p in profile_dir.rglob("*") if p.is_file()]
    leaked = {p.name: leaks(p.read_text(errors="replace")) for p in files}
    leaked = {k: v for k, v in leaked.items() if v}
    figures.add(files=len(files), files_with_sentinel=len(leaked),
                leaked=sorted({x for v in leaked.values() for x in v}))
    figures.lost = "n/a"
    assert files, "no Chrome trace was written"
    assert not leaked, (f"sentinel in {len(leaked)} of {len(files)} profile files, e.g. "
                        f"{next(iter(leaked.items()))}")
