"""`attnscope report`'s requests section, from synthetic `attnscope.request` spans whose every
figure is known here: each printed number against a computation in this file."""

from __future__ import annotations

import json
import re
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnscope.cli import main
from attnscope.cli.render.units import duration
from tests.support.browser import dom_of

P = "attnscope.request."


def _tag(key: str, value: Any) -> dict[str, Any]:
    kind = "bool" if isinstance(value, bool) else "string" if isinstance(value, str) \
        else "float64" if isinstance(value, float) else "int64"
    return {"key": key, "type": kind, "value": value}


class _Trace:
    """A Jaeger JSON file: two processes, application request spans, attention calls, and the
    request spans the `batch` blocks ended with (``requests``: their attributes, as written)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests: list[dict[str, Any]] = []  # attrs | {"_parent", "_process"}

    def _span(self, name: str, process: str, parent: str | None, attrs: dict[str, Any],
              span_id: str | None = None) -> str:
        span_id = span_id or f"{len(self.spans) + 1:016x}"
        self.spans.append({
            "traceID": "b" * 32, "spanID": span_id, "operationName": name,
            "references": [] if parent is None else [{"refType": "CHILD_OF", "spanID": parent}],
            "startTime": 1_000_000 + 10 * len(self.spans), "duration": 5, "processID": process,
            "tags": [_tag(k, v) for k, v in attrs.items()]})
        return span_id

    def app(self, span_id: str, process: str = "p1") -> str:
        return self._span("POST /generate", process, None, {}, span_id)

    def call(self, process: str = "p1") -> None:
        self._span("LlamaAttention.forward", process, None, {
            "attnscope.tier": "timing", "attnscope.module": "model.layers.0.self_attn",
            "attnscope.phase": "decode", "attnscope.wall_ns": 50_000, "attnscope.flops": 1000,
            "attnscope.num_heads": 4, "attnscope.sample_rate": 1.0})

    def request(self, *, batch: int, row: int, size: int, tokens: int, useful: int,
                padding: int, ns: int, scale: float = 2.0, rid: str | None = None,
                parent: str | None = None, process: str = "p1", phase: str = "decode",
                calls: int = 4, exact: bool = True, unapportioned: int = 0) -> None:
        a: dict[str, Any] = {
            P + "batch": batch, P + "batch_size": size, P + "row": row,
            P + "sampled_calls": calls, P + "calls_unapportioned": unapportioned,
            P + "tokens": tokens, P + "flops": useful + padding, P + "useful_flops": useful,
            P + "padding_flops": padding, P + "kv_bytes_read": 64 * tokens,
            P + "attention_ns": ns, P + f"{phase}.calls": calls,
            P + f"{phase}.flops": useful + padding, P + f"{phase}.attention_ns": ns,
            P + "all_calls.flops": int((useful + padding) * scale),
            P + "all_calls.attention_ns": int(ns * scale)}
        if rid is not None:
            a[P + "id"] = rid
        if not exact:
            a[P + "exact"] = False
        self._span("attnscope.request", process, parent, a)
        self.requests.append(a | {"_parent": parent, "_process": process})

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({"data": [{"traceID": "b" * 32, "spans": self.spans,
                                              "processes": {"p1": {"serviceName": "svc-a"},
                                                            "p2": {"serviceName": "svc-b"}}}]}))
        return path


def _served() -> _Trace:
    """Batch 1 of svc-a: a long prompt (app1) and two short ones; then three decode steps
    (batches 2-4), each declaring its rows, where "req-z" (a plain id) joins at step 3; batch 1
    of svc-b is another process's block (the same id, another batch)."""
    t = _Trace()
    for app in ("app1", "app2", "app3"):
        t.app(app)
    t.app("app4", "p2")
    t.call()
    t.call("p2")
    t.request(batch=1, row=0, size=3, tokens=3000, useful=9_000_000, padding=0, ns=800_000,
              parent="app1", phase="prefill", calls=2)
    t.request(batch=1, row=1, size=3, tokens=40, useful=120_000, padding=8_880_000,
              ns=100_000, parent="app2", phase="prefill", calls=2, exact=False)
    t.request(batch=1, row=2, size=3, tokens=90, useful=270_000, padding=8_730_000, ns=100_000,
              parent="app3", phase="prefill", calls=2, unapportioned=1)
    for step in range(3):
        batch = 2 + step
        t.request(batch=batch, row=0, size=3, tokens=2, useful=6000 + step, padding=10,
                  ns=30_000 + 1000 * step, parent="app1")
        t.request(batch=batch, row=1, size=3, tokens=2, useful=200, padding=5_810, ns=9_000,
                  parent="app2")
        if step >= 1:
            t.request(batch=batch, row=2, size=3, tokens=5, useful=500, padding=5_510,
                      ns=12_000, rid="req-z", scale=4.0)
    t.request(batch=1, row=0, size=1, tokens=700, useful=2_100_000, padding=0, ns=400_000,
              parent="app4", process="p2", phase="prefill", calls=2)
    return t


def _expected(t: _Trace) -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Per request (summed over its spans) and per batch, from the attributes as written."""
    per: dict[str, dict[str, Any]] = defaultdict(lambda: defaultdict(int))
    blocks: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for a in t.requests:
        name = a.get(P + "id") or f"span {a['_parent']}"
        r = per[name]
        r["spans"] += 1
        for key in ("tokens", "useful_flops", "padding_flops", "sampled_calls",
                    "kv_bytes_read"):
            r[key] += a[P + key]
        r["estimated_attention_ns"] += a[P + "all_calls.attention_ns"]
        r["estimated_flops"] += a[P + "all_calls.flops"]
        r["sampled_attention_ns"] += a[P + "attention_ns"]
        r.setdefault("blocks", set()).add((a["_process"], a[P + "batch"]))
        r["exact"] = r.get("exact", True) and a.get(P + "exact", True)
        blocks[(a["_process"], a[P + "batch"])].append(a | {"_name": name})
    batches = []
    for (_, batch), rows in blocks.items():
        total = sum(a[P + "all_calls.attention_ns"] for a in rows)
        longest = max(rows, key=lambda a: a[P + "tokens"])
        useful = sum(a[P + "useful_flops"] for a in rows)
        padding = sum(a[P + "padding_flops"] for a in rows)
        batches.append({"batch": batch, "rows": len(rows), "longest": longest["_name"],
                        "tokens": longest[P + "tokens"],
                        "share": longest[P + "all_calls.attention_ns"] / total,
                        "useful": longest[P + "useful_flops"] / useful,
                        "padding": padding / (useful + padding)})
    return {k: dict(v) for k, v in per.items()}, batches


def _report(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[str, dict[str, Any]]:
    assert main(["report", *map(str, args), "--json", "-"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert main(["report", *map(str, args)]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out, document


def test_every_request_figure_against_the_spans(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = _served()
    per, batches = _expected(t)
    text, document = _report(capsys, t.write(tmp_path / "t.json"), "--top", "3")
    got = document["requests"]
    assert got["requests"] == len(per) == 5 and got["request_spans"] == len(t.requests) == 12
    assert got["calls_unapportioned"] == 1
    # the costliest first, by the estimated attention time of all calls
    ranked = sorted(per, key=lambda k: -per[k]["estimated_attention_ns"])
    assert [r["request"] for r in got["top"]] == ranked[:3]
    for r in got["top"]:
        want = per[r["request"]]
        for key in ("spans", "tokens", "useful_flops", "padding_flops", "sampled_calls",
                    "kv_bytes_read", "estimated_attention_ns", "estimated_flops",
                    "sampled_attention_ns", "exact"):
            assert r[key] == want[key], (r["request"], key)
        assert r["batches"] == len(want["blocks"])
        assert r["padding_share"] == pytest.approx(
            want["padding_flops"] / (want["useful_flops"] + want["padding_flops"]))
    app1 = next(r for r in got["top"] if r["request"] == "span app1")
    assert app1["phases"] == {
        "prefill": {"calls": 2, "flops": 9_000_000, "attention_ns": 800_000},
        "decode": {"calls": 12, "flops": 3 * 6010 + 3, "attention_ns": 93_000}}
    times = np.array([v["estimated_attention_ns"] for v in per.values()], dtype=float)
    assert got["estimated_attention_ns"] == pytest.approx(
        {"p50": np.percentile(times, 50), "p95": np.percentile(times, 95), "max": times.max()})
    b = got["batches"]
    assert b["count"] == len(batches) == 5  # svc-a 1-4 and svc-b 1: batch ids are per process
    # a batch of one request row has no share to speak of: svc-b's batch 1 is left out
    shares = [x["share"] for x in batches if x["rows"] > 1]
    paddings = [x["padding"] for x in batches]
    assert len(shares) == 4
    assert b["longest_request_share"] == pytest.approx(
        {"median": statistics.median(shares), "max": max(shares)})
    assert b["padding_share"] == pytest.approx(
        {"median": statistics.median(paddings), "max": max(paddings)})
    usefuls = [x["useful"] for x in batches if x["rows"] > 1]
    assert b["longest_request_useful_share"] == pytest.approx(
        {"median": statistics.median(usefuls), "max": max(usefuls)})
    each = {(x["service"], x["batch"]): x for x in b["each"]}
    assert each[("svc-a", 1)]["longest_request"] == "span app1"  # 3000 tokens
    assert each[("svc-a", 1)]["longest_request_share"] == pytest.approx(1600 / 2000)
    assert each[("svc-a", 4)]["longest_request"] == "req-z"  # 5 tokens: joined at step 3
    assert each[("svc-b", 1)]["longest_request_share"] == 1.0

    # the terminal prints those figures, each estimated one saying so
    assert "Costliest requests (top 3 of 5 by estimated attention time, all calls)" in text
    for r in got["top"]:
        line = next(x for x in text.splitlines() if x.strip().startswith(r["request"] + " "))
        cells = re.split(r"\s{2,}", line.strip())
        assert cells[:2] == [r["request"], duration(r["estimated_attention_ns"])]
        assert f"{r['tokens']:,}" in cells and f"{r['padding_share']:.1%}" in cells
        assert cells[-1] == str(r["batches"]) and cells[-2] == str(r["sampled_calls"])
    assert _cells(text, "Estimated attention time per request", "5") == [
        "5", "12", *(duration(v) for v in (np.percentile(times, 50), np.percentile(times, 95),
                                            times.max()))]
    title = "Batches: the longest request's share (est.), padding share"
    assert _cells(text, title, "batches") == ["batches", "4", "4", "5"]
    assert _cells(text, title, "median") == [
        "median", f"{statistics.median(shares):.1%}", f"{statistics.median(usefuls):.1%}",
        f"{statistics.median(paddings):.1%}"]
    assert _cells(text, title, "max") == ["max", f"{max(shares):.1%}", f"{max(usefuls):.1%}",
                                          f"{max(paddings):.1%}"]
    worst = max((x for x in batches if x["rows"] > 1), key=lambda x: x["share"])
    assert (f"Largest share: batch {worst['batch']} of svc-a, {worst['longest']} "
            f"({worst['tokens']:,} tokens, {worst['rows']} request rows)") in " ".join(
                text.split())
    assert "† 1 request(s)" in text and "est., estimated:" in text
    assert "1 sampled call(s) inside batch blocks could not be apportioned" in text


def _cells(text: str, title: str, first: str) -> list[str]:
    """The cells of the row starting ``first`` in the table titled ``title``."""
    table = text.split(title, 1)[1]
    line = next(x for x in table.splitlines() if x.strip().startswith(first + " "))
    return re.split(r"\s{2,}", line.strip())


def test_the_section_fits_80_columns_and_is_on_the_html_page(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    t = _served()
    t.request(batch=9, row=0, size=1, tokens=1, useful=1, padding=0, ns=10_000_000,
              rid="a-request-id-the-application-made-rather-long")
    path = t.write(tmp_path / "t.json")
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    section = text.split("Costliest requests", 1)[1]
    assert max(len(line) for line in section.splitlines()) <= 80
    assert "a-request-id-the-application-made-rather-long" in section  # folded, never cut
    html = tmp_path / "r.html"
    assert main(["report", str(path), "--html", str(html)]) == 0
    capsys.readouterr()
    dom = dom_of(html)
    assert "Requests: what attention cost each one (estimated)" in dom
    assert "<th>est. attention</th>" in dom


def test_no_section_without_request_spans(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = _Trace()
    t.call()
    path = t.write(tmp_path / "t.json")
    text, document = _report(capsys, path)
    assert document["requests"] is None
    assert "request" not in text.lower()
    html = tmp_path / "r.html"
    assert main(["report", str(path), "--html", str(html)]) == 0
    assert "Requests:" not in html.read_text()
