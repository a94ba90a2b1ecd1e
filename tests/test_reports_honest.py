"""Reports that state what happened (issue 38 §2): the settings in force, every span of the
profiled call on its timeline with labels that never overlap, one backend cell for "all layers"
in the terminal and the page, and one stderr line where `report` wrote its files."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest

from attnscope.cli.report import run_report
from attnscope.cli.run._output import write_run_info

ROOT = Path(__file__).resolve().parent.parent
_SVG = "{http://www.w3.org/2000/svg}"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    return env | {"OMP_NUM_THREADS": "1"}


def _cli(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "attnscope", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=_env(), cwd=cwd)


def _section(page: str, heading: str) -> str:
    start = page.index(f"<h2>{heading}</h2>")
    return page[start:page.index("</section>", start)]


# ---- 1: the settings in force ----------------------------------------------------------------


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """`attnscope demo` (small), then `attnscope report` of its trace: text, --json and --html."""
    tmp = tmp_path_factory.mktemp("demo")
    trace, html, doc = tmp / "demo.json", tmp / "r.html", tmp / "r.json"
    done = _cli("demo", "--steps", "1", "--seq-len", "32", "--jaeger-json", trace, cwd=tmp)
    assert done.returncode == 0, done.stderr
    report = _cli("report", trace, "--html", html, "--json", doc, cwd=tmp)
    assert report.returncode == 0, report.stderr
    return {"text": report.stdout, "stderr": report.stderr, "page": html.read_text(),
            "json": json.loads(doc.read_text()), "html_path": html, "json_path": doc,
            "trace": trace}


_DEMO_SETTINGS = {"sample_rate": 1.0, "profile_rate": 0.0, "overhead_budget": 1.0,
                  "warmup_calls": 0}
_DEMO_LINE = "configured: sample rate 1, profile rate 0, overhead budget 1, warmup calls 0"


def test_the_demo_report_states_the_settings_the_demo_ran_with(demo: dict[str, Any]) -> None:
    """The demo samples every call (its report says "sample rate 1" from the spans): the
    resource says so too, in the terminal, the JSON and the page's Run card alike (they said the
    defaults, 0.01 / 0.05 / 0.01 / 10: the resource was built before the demo's configure())."""
    assert _DEMO_LINE in demo["text"].splitlines()
    assert "(sample rate 1)" in demo["text"]
    assert demo["json"]["run"]["settings"] == _DEMO_SETTINGS
    assert demo["json"]["sample_rates"] == [1.0]
    assert _DEMO_LINE in _section(demo["page"], "Run")


_LATER = """
import attnscope, torch
attnscope.configure(exporter="jaeger-json:{trace}", sample_rate=1.0, warmup_calls=0,
                    overhead_budget=1.0, profile_rate=0.0, metrics=False)

@attnscope.trace(name="attn")
def attn(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)

q = torch.zeros(1, 2, 4, 8)
for _ in range(3):
    attn(q, q, q)
attnscope.flush(timeout_s=30)
# the pipeline (and its resource) was built above; these settings change without a new one
attnscope.configure(warmup_calls=1)
for _ in range(6):
    attn(q, q, q)
attnscope.shutdown(timeout_s=30)
"""


def test_a_later_configure_is_what_the_later_spans_state(tmp_path: Path) -> None:
    """The root cause: the resource was built once, with the pipeline, and configure() changes
    the settings it states without building a new one. The spans after the change carry the
    settings in force then: the report lists both, in order, as one process."""
    trace = tmp_path / "t.json"
    done = subprocess.run([sys.executable, "-c", _LATER.format(trace=trace)],
                          capture_output=True, text=True, timeout=120, env=_env(), cwd=ROOT)
    assert done.returncode == 0, done.stderr
    kept = {}
    for t in json.loads(trace.read_text())["data"]:  # process ids are per trace
        for s in t["spans"]:
            tags = {tag["key"]: tag["value"] for tag in t["processes"][s["processID"]]["tags"]}
            kept[s["spanID"]] = (s["startTime"], tags["attnscope.config.warmup_calls"])
    ordered = [warmup for _, warmup in sorted(kept.values())]
    assert ordered[:3] == [0, 0, 0] and ordered[3:] and set(ordered[3:]) == {1}, ordered
    out = io.StringIO()
    assert run_report(trace, json_path="-", out=out) == 0
    run = json.loads(out.getvalue())["run"]
    assert run["settings"] == {"sample_rate": 1.0, "profile_rate": 0.0,
                               "overhead_budget": 1.0, "warmup_calls": [0, 1]}
    assert run["processes"] == 1
    text = io.StringIO()
    assert run_report(trace, out=text) == 0
    assert ("configured: sample rate 1, profile rate 0, overhead budget 1, warmup calls 0 / 1"
            in text.getvalue().splitlines())


# ---- 2: the timeline of one profiled call ----------------------------------------------------


def _geometry(page: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The timeline's bars and texts, from the page's SVG: x ranges, rows and names."""
    body = _section(page, "Timeline of one profiled call")
    svg = ET.fromstring(body[body.index("<svg"):body.index("</svg>") + len("</svg>")])
    bars, texts = [], []
    for el in svg:
        if el.tag == _SVG + "rect":
            x, w = float(el.get("x", 0)), float(el.get("width", 0))
            title = el.find(_SVG + "title")
            bars.append({"cls": el.get("class"), "x0": x, "x1": x + w,
                         "y": float(el.get("y", 0)), "h": float(el.get("height", 0)),
                         "title": "" if title is None else title.text or ""})
        elif el.tag == _SVG + "text":
            x, length = float(el.get("x", 0)), float(el.get("textLength", 0))
            assert el.get("lengthAdjust") == "spacingAndGlyphs"  # the glyphs fill textLength
            texts.append({"cls": el.get("class"), "x0": x, "x1": x + length,
                          "y": float(el.get("y", 0)), "text": el.text or "",
                          "after": bars[-1] if bars else None})
    return bars, texts


def _assert_no_overlap(texts: list[dict[str, Any]]) -> None:
    for i, a in enumerate(texts):
        for b in texts[i + 1:]:
            if a["y"] == b["y"]:
                assert a["x1"] <= b["x0"] or b["x1"] <= a["x0"], (a["text"], b["text"])


def _assert_labels_inside_their_bars(texts: list[dict[str, Any]]) -> None:
    for t in texts:
        if t["cls"] == "label":
            bar = t["after"]
            assert bar["x0"] <= t["x0"] and t["x1"] <= bar["x1"], (t["text"], bar["title"])
            assert bar["y"] <= t["y"] <= bar["y"] + bar["h"]


def test_the_demo_timeline_draws_the_attention_call_inside_the_layer(
        demo: dict[str, Any]) -> None:
    bars, texts = _geometry(demo["page"])
    (call,) = [b for b in bars if b["cls"] == "call"]
    nested = [b for b in bars if b["cls"] == "nested"]
    # the layer calls attention.naive or attention.sdpa: a bar of its own, not a blank gap
    assert len(nested) == 1 and nested[0]["title"].startswith("attention."), nested
    assert nested[0]["y"] > call["y"]
    ops_inside = [b for b in bars if b["cls"] == "op" and b["y"] > nested[0]["y"]
                  and nested[0]["x0"] <= b["x0"] and b["x1"] <= nested[0]["x1"] + 0.75]
    assert ops_inside  # its own operators, a lane below it
    _assert_no_overlap(texts)
    _assert_labels_inside_their_bars(texts)


def _tags(attrs: dict[str, Any]) -> list[dict[str, Any]]:
    def kind(v: Any) -> str:
        return "string" if isinstance(v, str) else "float64" if isinstance(v, float) else "int64"
    return [{"key": k, "type": kind(v), "value": v} for k, v in attrs.items()]


def _llama_decode(path: Path, small_ops: int = 40) -> Path:
    """A Llama decode call as attnscope writes it: the layer's span (profiled), its projections
    as operators, SDPA traced inside it with its kernel below, and a run of small adjacent ops
    (µs, start times) whose labels the old timeline drew on top of each other."""
    spans: list[dict[str, Any]] = []

    def add(span_id: str, parent: str | None, name: str, start: int, dur: int,
            attrs: dict[str, Any]) -> None:
        spans.append({"traceID": "b" * 32, "spanID": span_id, "operationName": name,
                      "references": [] if parent is None else
                      [{"refType": "CHILD_OF", "spanID": parent}],
                      "startTime": start, "duration": dur, "processID": "p1",
                      "tags": _tags(attrs)})

    op = {"attnscope.kernel.kind": "cpu_op", "attnscope.kernel.device": "cpu"}
    t0 = 1_000_000
    add("c" * 16, None, "model.layers.0.self_attn", t0, 1000, {
        "attnscope.tier": "profile", "attnscope.module": "model.layers.0.self_attn",
        "attnscope.phase": "decode", "attnscope.num_heads": 8, "attnscope.wall_ns": 1_000_000,
        "attnscope.sample_rate": 1.0, "attnscope.layer_index": 0})
    add("1" * 16, "c" * 16, "aten::linear", t0 + 10, 150, op)
    for i in range(small_ops):  # 5 µs each, back to back: 200 µs of the call
        add(f"{0x100 + i:016x}", "c" * 16, "aten::some_long_operator_name", t0 + 170 + 5 * i, 5,
            op)
    add("2" * 16, "c" * 16, "scaled_dot_product_attention", t0 + 380, 430,
        {"attnscope.tier": "timing", "attnscope.flops": 1000})
    add("3" * 16, "2" * 16, "aten::_scaled_dot_product_flash_attention_for_cpu", t0 + 390, 400,
        op)
    add("4" * 16, "c" * 16, "aten::linear", t0 + 820, 150, op)
    path.write_text(json.dumps({"data": [{"traceID": "b" * 32, "spans": spans,
                                          "processes": {"p1": {"serviceName": "svc"}}}]}))
    return path


def test_a_llama_decode_timeline_draws_sdpa_and_no_label_overlaps(tmp_path: Path) -> None:
    trace = _llama_decode(tmp_path / "llama.json")
    html = tmp_path / "r.html"
    assert run_report(trace, html=str(html), out=io.StringIO()) == 0
    bars, texts = _geometry(html.read_text())
    (call,) = [b for b in bars if b["cls"] == "call"]
    (sdpa,) = [b for b in bars if b["title"].startswith("scaled_dot_product_attention ")]
    assert sdpa["cls"] == "nested"
    # 430 of the call's 1000 µs, from 380 µs: its place and width on the axis
    scale = (call["x1"] - call["x0"]) / 1000
    assert sdpa["x0"] == pytest.approx(380 * scale, abs=0.01)
    assert sdpa["x1"] - sdpa["x0"] == pytest.approx(430 * scale, abs=0.01)
    kernel = [b for b in bars if "flash_attention_for_cpu" in b["title"]]
    assert len(kernel) == 1 and kernel[0]["y"] > sdpa["y"]
    assert len([b for b in bars if "some_long_operator_name" in b["title"]]) == 40
    labels = [t for t in texts if t["cls"] == "label"]
    assert any(t["text"].startswith("scaled_dot_product_attention") and "(43%)" in t["text"]
               for t in labels)
    _assert_no_overlap(texts)
    _assert_labels_inside_their_bars(texts)
    assert [t for t in texts if t["cls"] == "tick"]  # an axis, its labels clear of each other


# ---- 3: the "all layers" backend -------------------------------------------------------------


def _backend_trace(path: Path) -> Path:
    spans = []
    for i, backend in enumerate(["flash", "math", "flash"]):
        spans.append({"traceID": "d" * 32, "spanID": f"{i + 1:016x}",
                      "operationName": f"blocks.{i}.attn", "references": [],
                      "startTime": 1_000_000 + 100 * i, "duration": 50, "processID": "p1",
                      "tags": _tags({"attnscope.tier": "timing",
                                     "attnscope.module": f"blocks.{i}.attn",
                                     "attnscope.num_heads": 4, "attnscope.wall_ns": 50_000,
                                     "attnscope.sample_rate": 1.0, "attnscope.backend": backend,
                                     "attnscope.layer_index": i})})
    path.write_text(json.dumps({"data": [{"traceID": "d" * 32, "spans": spans,
                                          "processes": {"p1": {"serviceName": "svc"}}}]}))
    return path


def test_the_all_layers_backend_is_the_same_in_the_terminal_and_the_page(
        tmp_path: Path) -> None:
    trace, html = _backend_trace(tmp_path / "t.json"), tmp_path / "r.html"
    out = io.StringIO()
    assert run_report(trace, html=str(html), out=out) == 0
    text = out.getvalue()
    calls_table = text[text.index("Calls per attention layer"):text.index("Latency per")]
    (line,) = [ln for ln in calls_table.splitlines() if ln.strip().startswith("all layers")]
    terminal = line.split()[-1]
    table = _section(html.read_text(), "Per layer and phase")
    row = re.search(r"<tr><td[^>]*>all layers</td>(.*?)</tr>", table)
    assert row is not None
    page = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))[-1]
    assert terminal == page == "flash,math"


# ---- 4: where the files went, and run.json's numbers -----------------------------------------


def test_report_says_on_stderr_where_it_wrote(demo: dict[str, Any], tmp_path: Path) -> None:
    assert demo["stderr"] == (f"attnscope report: JSON: {demo['json_path']}, "
                              f"HTML report: {demo['html_path']}\n")
    html = tmp_path / "only.html"
    done = _cli("report", demo["trace"], "--html", html)
    assert done.returncode == 0 and done.stderr == f"attnscope report: HTML report: {html}\n"
    piped = _cli("report", demo["trace"], "--json", "-")
    assert piped.returncode == 0 and piped.stderr == ""  # the JSON is on stdout: nothing to say
    json.loads(piped.stdout)


def test_run_json_settings_are_numbers(tmp_path: Path) -> None:
    (tmp_path / "traces.jaeger.json").write_text("{}")  # run.json is written beside a trace
    write_run_info(tmp_path, command=["python", "a.py"], argv=["python", "a.py"],
                   environ={"ATTNSCOPE_SAMPLE_RATE": "1.0", "ATTNSCOPE_PROFILE_RATE": "0.05",
                            "ATTNSCOPE_OVERHEAD_BUDGET": "nan", "ATTNSCOPE_WARMUP_CALLS": "10"},
                   started_ns=1, ended_ns=2, exit_code=0)
    settings = json.loads((tmp_path / "run.json").read_text())["settings"]
    assert settings == {"sample_rate": 1.0, "profile_rate": 0.05, "overhead_budget": None,
                        "warmup_calls": 10}
    assert type(settings["warmup_calls"]) is int and type(settings["sample_rate"]) is float
