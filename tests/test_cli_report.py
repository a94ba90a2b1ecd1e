"""`attnscope report` on real trace files (tests/cli_traces.py), run as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnscope.cli.traces import SpanRow, attention_calls, call_backends, load_spans
from tests.support.browser import dom_of
from tests.support.cli_traces import TraceFiles, generate, jaeger_spans

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> TraceFiles:
    # sample_rate < 1: the re-weighted counts differ from the sampled ones. The seed fixes which
    # calls are sampled and profiled (cli_traces seeds the draws): here 25 of the 48 attention
    # calls, 4 of them prefill, 3 profiled. Unseeded, about 1 run in 20 profiled none (a call
    # inside a profiled request, generate() or forward is not profiled: the outer spans compete)
    # and 1 in 256 sampled no prefill call (8 of them at rate 0.5).
    return generate(tmp_path_factory.mktemp("report") / "run", sample_rate=0.5, repeats=4,
                    profile_rate=0.5, seed=3)


def _report(*args: str | Path, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    return subprocess.run([sys.executable, "-m", "attnscope", "report", *map(str, args)],
                          capture_output=True, text=True, timeout=300, env=env, cwd=cwd)


def _json_report(path: Path, tmp_path: Path, *extra: str) -> dict[str, Any]:
    out = tmp_path / f"{path.name}.report.json"
    done = _report(path, "--json", out, *extra)
    assert done.returncode == 0, done.stderr
    assert done.stderr == f"attnscope report: JSON: {out}\n"  # where it wrote, nothing else
    return dict(json.loads(out.read_text()))


def test_both_formats_and_the_directory_give_the_same_rows(traces: TraceFiles) -> None:
    jaeger, otlp = load_spans(traces.jaeger), load_spans(traces.otlp)
    assert load_spans(traces.directory) == otlp  # the directory reads the OTLP file, once
    assert len(jaeger) == len(otlp) == len(jaeger_spans(traces.jaeger))
    by_id = {r.span_id: r for r in otlp}
    for row in jaeger:
        other = by_id[row.span_id]
        assert dict(row.attributes) == dict(other.attributes), row.name
        assert (row.trace_id, row.parent_id, row.name, row.service) == \
            (other.trace_id, other.parent_id, other.name, other.service)
        assert row.start_ns == other.start_ns // 1000 * 1000  # Jaeger keeps microseconds


def test_a_directory_of_several_processes_reads_every_process_once(
        traces: TraceFiles, tmp_path: Path) -> None:
    """`attnscope run -- torchrun ...` writes one file per rank (and none for the launcher)."""
    batches = [json.loads(line) for line in traces.otlp.read_text().splitlines() if line.strip()]
    halves: list[list[str]] = [[], []]
    for batch in batches:  # each span goes to one "rank", in whole OTLP documents
        for part in (0, 1):
            doc = json.loads(json.dumps(batch))
            for rs in doc["resourceSpans"]:
                for ss in rs["scopeSpans"]:
                    ss["spans"] = ss["spans"][part::2]
            halves[part].append(json.dumps(doc))
    run = tmp_path / "run"
    run.mkdir()
    (run / "traces.rank0.otlp.jsonl").write_text("\n".join(halves[0]) + "\n")
    (run / "traces.rank1.otlp.jsonl").write_text("\n".join(halves[1]) + "\n")
    (run / "traces.pid7.otlp.jsonl").write_text("")  # a process that exported nothing
    shutil.copy(traces.jaeger, run / "traces.rank0.jaeger.json")  # the same spans: not read
    assert load_spans(run) == load_spans(traces.otlp)


def test_json_lines_are_split_at_newlines_only_and_share_their_keys(
        traces: TraceFiles, tmp_path: Path) -> None:
    """A line of OTLP/JSON may hold U+2028 and U+0085 raw (valid in JSON strings; the
    Collector's file exporter does not escape them), which ``str.splitlines`` took for line
    breaks: "not JSON". And each span's attribute names are one string per name, not per span
    (the report of a 64 MiB file held a copy of every name for each of its ~40,000 spans)."""
    docs = [json.loads(line) for line in traces.otlp.read_text().splitlines() if line.strip()]
    first = docs[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    first["attributes"].append({"key": "note", "value": {"stringValue": "a\u2028b\x85c"}})
    raw = tmp_path / "raw.otlp.jsonl"
    raw.write_text("\r\n".join(json.dumps(d, ensure_ascii=False) for d in docs) + "\r\n",
                   encoding="utf-8")
    assert "\u2028" in raw.read_text(encoding="utf-8")
    rows, plain = load_spans(raw), load_spans(traces.otlp)
    assert len(rows) == len(plain)
    noted = [r for r in rows if "note" in r.attributes]
    assert [r.attributes["note"] for r in noted] == ["a\u2028b\x85c"]
    assert [{k: v for k, v in r.attributes.items() if k != "note"} for r in rows] == \
        [dict(r.attributes) for r in plain]
    names: dict[str, str] = {}
    for row in rows:
        for key in row.attributes:
            assert names.setdefault(key, key) is key, key


def test_same_numbers_from_either_format(traces: TraceFiles, tmp_path: Path) -> None:
    reports = [_json_report(p, tmp_path) for p in (traces.jaeger, traces.otlp, traces.directory)]
    for report in reports[1:]:
        assert report["groups"] == reports[0]["groups"]
        assert report["overall"] == reports[0]["overall"]


def _raw_calls(path: Path) -> list[dict[str, Any]]:
    """Attention layer spans straight from the Jaeger file: the instrumented layers."""
    return [s for s in jaeger_spans(path)
            if "attnscope.tier" in s["tags"] and "attnscope.num_heads" in s["tags"]
            and "attnscope.kernel.kind" not in s["tags"]]


def test_numbers_match_the_spans(traces: TraceFiles, tmp_path: Path) -> None:
    report = _json_report(traces.jaeger, tmp_path, "--price-per-hour", "3.6")
    raw: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for s in _raw_calls(traces.jaeger):
        raw[(s["tags"]["attnscope.module"], s["tags"]["attnscope.phase"])].append(s["tags"])
    groups = {(g["module"], g["phase"]): g for g in report["groups"]}
    assert set(groups) == set(raw)
    assert {phase for _, phase in raw} == {"prefill", "decode"}
    for key, tags in raw.items():
        g = groups[key]
        # the profiler ran over the profiled calls and those timed inside one: not timed calls
        timed = [t for t in tags if t["attnscope.tier"] == "timing"
                 and "attnscope.profiled_by" not in t] or tags
        walls = np.array([t["attnscope.wall_ns"] for t in timed], dtype=float)
        tokens = sum(t["attnscope.tokens"] for t in timed)  # rates: of the timed calls
        flops = sum(t["attnscope.flops"] for t in timed)
        assert g["calls"] == len(tags)
        assert g["estimated_calls"] == pytest.approx(sum(1 / t["attnscope.sample_rate"]
                                                         for t in tags))
        assert g["wall_ns"]["p50"] == pytest.approx(np.percentile(walls, 50))
        assert g["wall_ns"]["p99"] == pytest.approx(np.percentile(walls, 99))
        assert g["wall_ns"]["max"] == walls.max()
        # totals: of every sampled call, the profiled ones included
        assert g["tokens"] == sum(t["attnscope.tokens"] for t in tags)
        assert g["flops"] == sum(t["attnscope.flops"] for t in tags)
        assert g["tokens_per_s"] == pytest.approx(tokens / walls.sum() * 1e9)
        assert g["tflops"] == pytest.approx(flops / walls.sum() / 1e3)
        assert g["wall_ns"]["min"] == walls.min()
        assert g["wall_ns"]["p5"] == pytest.approx(np.percentile(walls, 5))
        assert g["wall_ns"]["p95"] == pytest.approx(np.percentile(walls, 95))
        # $3.60 an hour is $0.001 a second
        assert g["cost_per_1k_tokens_usd"] == pytest.approx(walls.sum() / 1e9 * 1e-3 / tokens
                                                            * 1e3)
    assert report["overall"]["calls"] == sum(len(t) for t in raw.values())
    assert report["sample_rates"] == [0.5]
    assert report["overall"]["estimated_calls"] == pytest.approx(2 * report["overall"]["calls"])


def test_kernels_and_slowest_calls_match_the_spans(traces: TraceFiles, tmp_path: Path) -> None:
    report = _json_report(traces.otlp, tmp_path, "--top", "3")
    calls = _raw_calls(traces.jaeger)
    profiled = [s["tags"] for s in calls if s["tags"]["attnscope.tier"] == "profile"]
    assert profiled, "the workload profiled no attention call"
    # and the calls timed inside a profiled one, given their kernels from its profile
    enclosed = [s["tags"] for s in calls if s["tags"].get("attnscope.profiled_by") == "enclosing"
                and "attnscope.kernel.top_names" in s["tags"]]
    per_name: dict[str, int] = defaultdict(int)
    for t in profiled + enclosed:
        for name, ns in zip(json.loads(t["attnscope.kernel.top_names"]),
                            json.loads(t["attnscope.kernel.top_ns"]), strict=False):
            per_name[name] += ns
    total = sum(t["attnscope.kernel.total_ns"] for t in profiled + enclosed)
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:3]
    kernels = report["overall"]["kernels"]
    assert [(k["name"], k["ns"]) for k in kernels] == top
    assert kernels[0]["share"] == pytest.approx(top[0][1] / total)
    assert report["overall"]["profiled_calls"] == len(profiled)
    assert report["overall"]["kernel_calls"] == len(profiled) + len(enclosed)
    assert report["overall"]["kernel_calls_enclosed"] == len(enclosed)
    # of the calls the profiler did not slow: neither profiled nor inside or around a profile
    unslowed = [s for s in calls if s["tags"]["attnscope.tier"] != "profile"
                and "attnscope.profiled_by" not in s["tags"]]
    assert len(unslowed) < len(calls)
    slowest = sorted(unslowed, key=lambda s: -s["tags"]["attnscope.wall_ns"])[:3]
    assert [c["span_id"] for c in report["slowest"]] == [s["spanID"] for s in slowest]
    # each with its shape and its time against the median of its layer and phase's unslowed calls
    for rank, (call, span) in enumerate(zip(report["slowest"], slowest, strict=True)):
        tags = span["tags"]
        assert (call["batch_size"], call["seq_len_q"], call["seq_len_kv"]) == \
            (tags["attnscope.batch_size"], tags["attnscope.seq_len_q"],
             tags["attnscope.seq_len_kv"])
        peers = [s["tags"]["attnscope.wall_ns"] for s in unslowed
                 if (s["tags"]["attnscope.module"], s["tags"]["attnscope.phase"])
                 == (tags["attnscope.module"], tags["attnscope.phase"])]
        assert call["times_p50"] == pytest.approx(tags["attnscope.wall_ns"]
                                                  / np.percentile(peers, 50))
        assert call["slow"] is False  # too few calls to judge one
        # the slowest is its own group's slowest, so at or above its median; the next ones may
        # be below theirs (a loaded machine's top three can all be one group's)
        assert rank > 0 or call["times_p50"] >= 1.0


def test_terminal_report_names_every_layer_and_phase(traces: TraceFiles) -> None:
    done = _report(traces.directory, "--price-per-hour", "2")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for module, phase in {(s["tags"]["attnscope.module"], s["tags"]["attnscope.phase"])
                          for s in _raw_calls(traces.jaeger)}:
        assert re.search(rf"{re.escape(module)}\s+{phase}", done.stdout), done.stdout
    assert "Slowest calls" in done.stdout and "$/1k tok" in done.stdout
    slowest = done.stdout[done.stdout.index("Slowest calls"):]
    assert re.search(r"\s\d+×\d+×\d+\s.*\s\d\.?\d*×\s+[0-9a-f]{32}", slowest), slowest
    assert max(len(line.rstrip()) for line in done.stdout.splitlines()) <= 100, done.stdout


def _bad_inputs(tmp: Path) -> dict[str, Path]:
    other = {"data": [{"traceID": "ab" * 16, "processes": {"p1": {"serviceName": "web"}},
                       "spans": [{"traceID": "ab" * 16, "spanID": "cd" * 8, "operationName": "GET",
                                  "references": [], "startTime": 1, "duration": 2,
                                  "tags": [{"key": "http.method", "type": "string",
                                            "value": "GET"}], "processID": "p1"}]}]}
    files = {"not-json.json": "this is { not json", "not-a-trace.json": '{"hello": [1, 2]}',
             "empty-trace.json": '{"data": []}', "empty.jsonl": "",
             "other-tool.json": json.dumps(other), "list.json": "[1, 2, 3]"}
    out = {"missing": tmp / "nope.json"}
    for name, text in files.items():
        (tmp / name).write_text(text)
        out[name] = tmp / name
    (tmp / "empty-dir").mkdir()
    out["dir without a trace"] = tmp / "empty-dir"
    return out


def test_bad_input_is_one_line_and_exit_2(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """Every bad input through ``main()`` in this process; one through the real command too
    (each subprocess costs a torch import)."""
    from attnscope.cli import main

    bad = _bad_inputs(tmp_path)
    for what, path in bad.items():
        assert main(["report", str(path)]) == 2, what
        out, err = capsys.readouterr()
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("attnscope report: error: "), (what, err)
        assert str(path) in lines[0], what
        assert out == ""
    done = _report(bad["other-tool.json"])
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and done.stdout == ""


def test_output_paths_are_checked_before_the_work(traces: TraceFiles, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli import main

    for option in ("--html", "--json"):
        for target in (tmp_path / "missing_dir" / "x.out", tmp_path):
            assert main(["report", str(traces.otlp), option, str(target)]) == 2
            out, err = capsys.readouterr()
            assert out == "", out  # no report printed first
            assert err.startswith(f"attnscope report: error: {option} {target}: "), err
            assert len(err.strip().splitlines()) == 1
    assert not (tmp_path / "missing_dir").exists()


def _closed_stdout(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """``attnscope ARGS | head -0``: nothing reads what the command prints."""
    read, write = os.pipe()
    os.close(read)  # its first write to stdout fails
    try:
        return subprocess.run([sys.executable, "-m", "attnscope", *map(str, args)], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=300, cwd=ROOT)
    finally:
        os.close(write)


def test_the_files_asked_for_are_written_when_the_reader_of_the_output_goes_away(
        traces: TraceFiles, tmp_path: Path) -> None:
    """`attnscope report T --json J --html H | head`: both files, ended as `yes | head` ends."""
    page, doc = tmp_path / "r.html", tmp_path / "r.json"
    done = _closed_stdout("report", traces.otlp, "--json", doc, "--html", page)
    assert done.returncode == -signal.SIGPIPE, done.stderr  # cut output: no plain success
    assert done.stderr == f"attnscope report: JSON: {doc}, HTML report: {page}\n"  # no traceback
    assert json.loads(doc.read_text())["attention_calls"] == len(
        attention_calls(load_spans(traces.otlp)))
    assert page.read_text().rstrip().endswith("</html>")


def test_a_chrome_trace_is_named_as_such(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    """What torch.profiler's export_chrome_trace writes: told apart, and what to do instead."""
    import torch

    from attnscope.cli import main

    path = tmp_path / "trace.json"
    with torch.profiler.profile() as prof:
        torch.ones(4) @ torch.ones(4)
    prof.export_chrome_trace(str(path))
    bare = tmp_path / "events.json"
    bare.write_text(json.dumps(json.loads(path.read_text())["traceEvents"]))
    for trace in (path, bare):
        for argv in (["report", str(trace)], ["diff", str(trace), str(trace)]):
            assert main(argv) == 2
            out, err = capsys.readouterr()
            assert out == "" and len(err.strip().splitlines()) == 1, err
            assert f"{trace}: a Chrome trace" in err and "Perfetto" in err
            assert "jaeger-json:PATH" in err and "not a trace" not in err


def _row(span_id: str, parent: str | None, **attrs: Any) -> SpanRow:
    return SpanRow("t" * 32, span_id, parent, span_id, 0, 1, attrs, None)


def test_attention_calls_outermost_call_with_facts_else_innermost() -> None:
    layer = _row("layer", "model", **{"attnscope.tier": "timing", "attnscope.num_heads": 8})
    rows = [_row("model", None, **{"attnscope.tier": "timing", "attnscope.seq_len_q": 4}),
            layer,
            _row("sdpa", "layer", **{"attnscope.tier": "timing", "attnscope.flops": 10}),
            _row("op", "layer", **{"attnscope.kernel.kind": "cpu_op"})]
    assert attention_calls(rows) == [layer]
    plain = [_row("block", None, **{"attnscope.tier": "timing"}),
             _row("inner", "block", **{"attnscope.tier": "profile"})]
    assert [r.span_id for r in attention_calls(plain)] == ["inner"]


def _named(span_id: str, parent: str | None, name: str, attrs: dict[str, Any]) -> SpanRow:
    return SpanRow("t" * 32, span_id, parent, name, 0, 1, attrs, None)


def test_attention_calls_leave_out_an_inner_site_nested_or_not() -> None:
    """SDPA sampled inside a layer call that was not sampled is that layer's work as much as an
    SDPA nested in a sampled one: reporting it too counts the attention twice."""
    facts = {"attnscope.tier": "timing", "attnscope.flops": 10}
    rows = [_row("block", None, **{"attnscope.tier": "timing"}),  # a decoder layer
            _row("layer", "block", **facts, **{"attnscope.module": "layers.0.attn"}),
            _named("nested", "layer", "sdpa", facts),
            _named("alone", "block", "sdpa", facts),  # its layer call was not sampled
            _row("other", None, **{**facts, "attnscope.module": "head"})]
    assert [r.span_id for r in attention_calls(rows)] == ["layer", "other"]
    # the same site seen only on its own is reported; a call of a site nested in a call of
    # the same site (recursion) is the outer call's, the site stays
    assert [r.span_id for r in attention_calls([rows[0], rows[3]])] == ["alone"]
    same = [_named("outer", None, "f", facts), _named("again", "outer", "f", facts)]
    assert [r.span_id for r in attention_calls(same)] == ["outer"]


def test_html_is_self_contained(traces: TraceFiles, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = _report(traces.directory, "--html", out)
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert text.count("<svg") >= 4
    refs = re.findall(r"""(?:src|href)\s*=\s*["']([^"']*)""", text)
    assert not [r for r in refs if not r.startswith("#")], refs
    assert "<script" not in text and "@import" not in text
    assert not re.findall(r"url\((?!#)", text)  # url(#clip-id) only: nothing outside the file
    # the slowest calls' rows: each call's shape and its time against its row's p50
    report = _json_report(traces.directory, tmp_path)
    slowest = text[text.index("Slowest calls"):]
    assert "<th>B×Sq×Skv</th>" in slowest and "<th>× p50</th>" in slowest
    for call in report["slowest"]:
        row = next(r for r in slowest.split("<tr") if call["span_id"] in r)
        shape = f"{call['batch_size']}×{call['seq_len_q']}×{call['seq_len_kv']}"
        assert f">{shape}<" in row and f">{call['times_p50']:.3g}×<" in row, row


def test_html_renders_in_chromium(traces: TraceFiles, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert _report(traces.directory, "--html", out).returncode == 0
    dom = dom_of(out)
    assert dom.count("<svg") >= 4
    assert "Latency distribution per layer" in dom
    assert "Timeline of one profiled call" in dom


# -- synthetic traces: every attribute known, every figure computed here from them -------------


def _tag(key: str, value: Any) -> dict[str, Any]:
    kind = "string" if isinstance(value, str) else "bool" if isinstance(value, bool) \
        else "float64" if isinstance(value, float) else "int64"
    return {"key": key, "type": kind, "value": value}


class _Trace:
    """Spans for a Jaeger JSON file, and what each call's row should be (``expect``)."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.calls: list[dict[str, Any]] = []  # the attributes of each attention call written

    def call(self, module: str, phase: str | None, expect: str | None, *, wall: int,
             tokens: int, flops: int, tier: str = "timing", backend: str | None = None,
             core: int | None = None, peak: int | None = None, device: int | None = None,
             rate: float = 1.0, inner: str | None = None, extra: bool = False) -> None:
        n = len(self.spans)
        attrs: dict[str, Any] = {
            "attnscope.tier": tier, "attnscope.module": module, "attnscope.wall_ns": wall,
            "attnscope.tokens": tokens, "attnscope.flops": flops, "attnscope.num_heads": 4,
            "attnscope.sample_rate": rate, "attnscope.layer_index": int(module.split(".")[1])}
        for key, value in (("attnscope.phase", phase), ("attnscope.backend", backend),
                           ("attnscope.core_ns", core), ("attnscope.memory.peak_bytes", peak),
                           ("attnscope.device_ns", device),
                           ("attnscope.trigger", "slow_call" if extra else None),
                           ("attnscope.extra", True if extra else None)):
            if value is not None:
                attrs[key] = value
        span_id = f"{n + 1:016x}"
        self.spans.append({"traceID": "a" * 32, "spanID": span_id, "operationName": module,
                           "references": [], "startTime": 1_000_000 + 10 * n,
                           "duration": wall // 1000, "processID": "p1",
                           "tags": [_tag(k, v) for k, v in attrs.items()]})
        if inner:  # the function the layer called, traced inside it (the site's code)
            self.spans.append({"traceID": "a" * 32, "spanID": f"{n + 1:08x}{'f' * 8}",
                               "operationName": inner, "startTime": 1_000_001 + 10 * n,
                               "references": [{"refType": "CHILD_OF", "spanID": span_id}],
                               "duration": 1, "processID": "p1",
                               "tags": [_tag("attnscope.tier", "timing")]})
        self.calls.append(attrs | {"expect": expect})

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps({"data": [{"traceID": "a" * 32, "spans": self.spans,
                                              "processes": {"p1": {"serviceName": "svc"}}}]}))
        return path


def _mixed(rate: float = 0.5) -> _Trace:
    """Four layers: blocks.0 with two sites (its calls run `impl.fast` or `impl.slow` inside),
    blocks.1 with one (device time on some calls), blocks.2 whose profiled calls disagree, and
    blocks.3 that nothing profiled."""
    t = _Trace()
    for i in range(6):
        t.call("blocks.0.attn", "decode", "flash", wall=100_000 + 7_000 * i, tokens=40,
               flops=9_000_000 + i, inner="impl.fast", rate=rate)
        t.call("blocks.0.attn", "decode", "math", wall=300_000 + 11_000 * i ** 2, tokens=40,
               flops=9_000_000, inner="impl.slow", rate=rate)
    t.call("blocks.0.attn", "decode", "flash", wall=900_000, tokens=40, flops=9_000_000,
           tier="profile", backend="flash", core=60_000, peak=547 * 1024, inner="impl.fast")
    t.call("blocks.0.attn", "decode", "math", wall=2_000_000, tokens=40, flops=9_000_000,
           tier="profile", backend="math", core=250_000, peak=600_000, inner="impl.slow")
    for i in range(5):  # 240 tokens, 160 of them in timed calls
        t.call("blocks.1.attn", "prefill", "flash", wall=500_000 + 3_000 * i, tokens=80,
               flops=40_000_000, device=400_000 + 5_000 * i if i % 2 else None, rate=rate)
    t.call("blocks.1.attn", "prefill", "flash", wall=1_500_000, tokens=80, flops=40_000_000,
           tier="profile", backend="flash", core=300_000, peak=1 << 20)
    for i in range(4):
        t.call("blocks.2.attn", "decode", None, wall=200_000 + 1_000 * i, tokens=10,
               flops=1_000_000)
    t.call("blocks.2.attn", "decode", "flash", wall=700_000, tokens=10, flops=1_000_000,
           tier="profile", backend="flash", core=90_000)
    t.call("blocks.2.attn", "decode", "math", wall=800_000, tokens=10, flops=1_000_000,
           tier="profile", backend="math", core=95_000)
    for i in range(3):
        t.call("blocks.3.attn", "decode", None, wall=150_000 + 2_000 * i, tokens=10,
               flops=1_000_000)
    return t


def _time(a: dict[str, Any]) -> int:
    return int(a.get("attnscope.device_ns") or a["attnscope.wall_ns"])


def _expected(calls: list[dict[str, Any]], price: float) -> dict[str, Any]:
    """One row's figures, from the attributes written (the rule in docs/cli.md)."""
    timed = [a for a in calls if a["attnscope.tier"] == "timing"] or calls
    walls = np.array([a["attnscope.wall_ns"] for a in timed], dtype=float)
    profiled = [a for a in calls if a["attnscope.tier"] == "profile"]
    time_ = sum(_time(a) for a in timed)
    tok_s = sum(a["attnscope.tokens"] for a in timed) / time_ * 1e9
    cored = [a for a in profiled if "attnscope.core_ns" in a]
    peaks = [a["attnscope.memory.peak_bytes"] for a in calls if "attnscope.memory.peak_bytes" in a]
    return {
        "calls": len(calls), "profiled_calls": len(profiled), "latency_calls": len(timed),
        "estimated_calls": pytest.approx(sum(1 / a["attnscope.sample_rate"] for a in calls)),
        "tokens": sum(a["attnscope.tokens"] for a in calls),
        "flops": sum(a["attnscope.flops"] for a in calls),
        "wall_ns": {"min": walls.min(), "max": walls.max(), **{
            f"p{q}": pytest.approx(np.percentile(walls, q)) for q in (5, 50, 95, 99)}},
        "time_ns": time_, "tokens_per_s": pytest.approx(tok_s),
        "tflops": pytest.approx(sum(a["attnscope.flops"] for a in timed) / time_ / 1e3),
        "core_tflops": pytest.approx(sum(a["attnscope.flops"] for a in cored)
                                     / sum(a["attnscope.core_ns"] for a in cored) / 1e3)
        if cored else None,
        "memory_peak_bytes": max(peaks) if peaks else None,
        "cost_per_1k_tokens_usd": pytest.approx(price / 3600 / tok_s * 1e3),
    }


def _rows_of(calls: list[dict[str, Any]]) -> dict[tuple[str, str | None, str | None],
                                                  list[dict[str, Any]]]:
    out: dict[tuple[str, str | None, str | None], list[dict[str, Any]]] = defaultdict(list)
    for a in calls:
        out[(a["attnscope.module"], a.get("attnscope.phase"), a["expect"])].append(a)
    return out


def _main_json(capsys: pytest.CaptureFixture[str], *args: str | Path) -> dict[str, Any]:
    from attnscope.cli import main

    assert main(["report", *map(str, args), "--json", "-"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return dict(json.loads(out))


def test_rows_split_by_backend_measured_or_of_the_site(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _mixed()
    report = _main_json(capsys, trace.write(tmp_path / "t.json"))
    got = {(g["module"], g["phase"], g["backend"]): g["label"] for g in report["groups"]}
    assert got == {
        ("blocks.0.attn", "decode", "flash"): "blocks.0.attn · flash",  # impl.fast's site
        ("blocks.0.attn", "decode", "math"): "blocks.0.attn · math",    # impl.slow's site
        ("blocks.1.attn", "prefill", "flash"): "blocks.1.attn",  # one backend: no suffix
        ("blocks.2.attn", "decode", None): "blocks.2.attn · —",  # profiled calls disagree
        ("blocks.2.attn", "decode", "flash"): "blocks.2.attn · flash",
        ("blocks.2.attn", "decode", "math"): "blocks.2.attn · math",
        ("blocks.3.attn", "decode", None): "blocks.3.attn"}  # nothing profiled: unknown
    assert set(got) == set(_rows_of(trace.calls))
    # in the order of the layers, then of each row's first call
    assert [g["label"] for g in report["groups"]][:2] == ["blocks.0.attn · flash",
                                                          "blocks.0.attn · math"]
    by_key = {(g["module"], g["phase"], g["backend"]): g for g in report["groups"]}
    assert by_key[("blocks.0.attn", "decode", "flash")]["backends"] == {"flash": 1}
    assert by_key[("blocks.2.attn", "decode", "flash")]["latency_of"] == "profiled"
    assert by_key[("blocks.2.attn", "decode", None)]["latency_of"] == "timed"


def test_every_figure_of_every_row_against_the_spans(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = _mixed()
    report = _main_json(capsys, trace.write(tmp_path / "t.json"), "--price-per-hour", "2.5")
    expected = {key: _expected(calls, 2.5) for key, calls in _rows_of(trace.calls).items()}
    for g in report["groups"]:
        want = expected[(g["module"], g["phase"], g["backend"])]
        assert {k: g[k] for k in want} == want, g["label"]
    blocks1 = next(g for g in report["groups"] if g["module"] == "blocks.1.attn")
    assert blocks1["tokens"] == 480  # the profiled call's 80 tokens count (timed only: 400)
    assert blocks1["device_ns"]["p50"] == pytest.approx(np.percentile(
        [a["attnscope.device_ns"] for a in trace.calls if "attnscope.device_ns" in a
         and a["attnscope.tier"] == "timing"], 50))
    # all layers: counts and FLOPs of every call, tokens of the busiest module, tok/s a
    # token's time through every layer, core FLOP/s of every profiled call
    calls = trace.calls
    timed = [a for a in calls if a["attnscope.tier"] == "timing"]
    per_module: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for a in timed:
        per_module[a["attnscope.module"]].append(a)
    seconds_per_token = sum(sum(_time(a) for a in m) / 1e9 / sum(a["attnscope.tokens"] for a in m)
                            for m in per_module.values())
    cored = [a for a in calls if "attnscope.core_ns" in a]
    o = report["overall"]
    assert o["calls"] == len(calls) and o["profiled_calls"] == len(calls) - len(timed)
    assert o["flops"] == sum(a["attnscope.flops"] for a in calls)
    totals: dict[str, int] = defaultdict(int)
    for a in calls:
        totals[a["attnscope.module"]] += a["attnscope.tokens"]
    assert o["tokens"] == max(totals.values())
    assert o["time_ns"] == sum(_time(a) for a in timed)
    assert o["tokens_per_s"] == pytest.approx(1 / seconds_per_token)
    assert o["tflops"] == pytest.approx(sum(a["attnscope.flops"] for a in timed)
                                        / sum(_time(a) for a in timed) / 1e3)
    assert o["core_tflops"] == pytest.approx(sum(a["attnscope.flops"] for a in cored)
                                             / sum(a["attnscope.core_ns"] for a in cored) / 1e3)
    assert o["cost_per_1k_tokens_usd"] == pytest.approx(2.5 / 3600 * seconds_per_token * 1e3)
    walls = np.array([a["attnscope.wall_ns"] for a in timed], dtype=float)
    assert o["wall_ns"]["min"] == walls.min() and o["wall_ns"]["max"] == walls.max()
    assert o["wall_ns"]["p5"] == pytest.approx(np.percentile(walls, 5))
    assert o["memory_peak_bytes"] == 1 << 20


def _cells(stdout: str, title: str, label: str, phase: str) -> list[str]:
    """The cells of one row of the table titled ``title`` (split on runs of 2+ spaces)."""
    table = stdout.split(title, 1)[1]
    line = next(x for x in table.splitlines() if re.match(rf"\s*{re.escape(label)}\s+{phase}\b",
                                                          x))
    return re.split(r"\s{2,}", line.strip())


def test_the_terminal_tables_print_those_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli import main
    from attnscope.cli.render.units import duration, si

    trace = _mixed()
    path = trace.write(tmp_path / "t.json")
    assert main(["report", str(path), "--price-per-hour", "2.5"]) == 0
    out, err = capsys.readouterr()
    assert err == "" and max(len(x.rstrip()) for x in out.splitlines()) <= 100, out
    rows = _rows_of(trace.calls)
    for (module, phase, backend), label in (
            (("blocks.0.attn", "decode", "math"), "blocks.0.attn · math"),
            (("blocks.1.attn", "prefill", "flash"), "blocks.1.attn")):
        want = _expected(rows[(module, phase, backend)], 2.5)
        calls = rows[(module, phase, backend)]
        assert _cells(out, "Calls per attention layer", label, phase) == [
            label, phase, str(len(calls)), f"{want['estimated_calls'].expected:,.0f}",
            str(want["profiled_calls"]), f"{want['tokens']:,}", si(want["flops"]), backend]
        walls = np.array([a["attnscope.wall_ns"] for a in calls
                          if a["attnscope.tier"] == "timing"], dtype=float)
        assert _cells(out, "Latency per attention layer", label, phase)[2:] == [
            duration(v) for v in (walls.min(), *np.percentile(walls, [5, 50, 95, 99]),
                                  walls.max())]
        assert _cells(out, "Throughput per attention layer", label, phase)[2:5] == [
            duration(want["time_ns"]), si(want["tokens_per_s"].expected),
            si(want["tflops"].expected * 1e12)]
        assert _cells(out, "Cost at $2.5", label, phase)[2:] == [
            si(want["tokens_per_s"].expected),
            f"{want['cost_per_1k_tokens_usd'].expected:.3g}"]
    assert "Sampled calls: counts, tokens, FLOPs, mem peak · timed: latency" in out
    assert _cells(out, "Latency per attention layer", "blocks.2.attn · flash",
                  "decode")[-1].endswith(" *")  # latency of profiled calls only: marked
    assert "Device time per attention layer" in out  # blocks.1 measured some


def test_est_calls_only_when_a_sample_rate_is_below_1(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from attnscope.cli import main

    for rate, shown in ((1.0, False), (0.5, True)):
        path = _mixed(rate).write(tmp_path / f"{rate}.json")
        html = tmp_path / f"{rate}.html"
        assert main(["report", str(path), "--html", str(html)]) == 0
        out, _ = capsys.readouterr()
        assert ("est. calls" in out) is shown, out
        assert ("≈" in out.splitlines()[1]) is shown
        assert ("<th>est. calls</th>" in html.read_text()) is shown
    # the page's row of one of blocks.0's backends: the same figures as the JSON
    from attnscope.cli.render.units import duration

    calls = _rows_of(_mixed().calls)[("blocks.0.attn", "decode", "math")]
    walls = np.array([a["attnscope.wall_ns"] for a in calls if a["attnscope.tier"] == "timing"],
                     dtype=float)
    row = re.search(r"<tr><td class=\"l\">blocks\.0\.attn · math</td>(.*?)</tr>",
                    (tmp_path / "0.5.html").read_text())
    assert row is not None
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1))
    assert cells[:4] == ["decode", str(len(calls)),
                         f"{sum(1 / a['attnscope.sample_rate'] for a in calls):,.0f}", "1"]
    percentiles = np.percentile(walls, [5, 50, 95, 99])
    assert cells[5:11] == [duration(v) for v in (walls.min(), *percentiles, walls.max())]
    assert cells[-1] == "math"


def test_a_call_outside_the_random_sample_counts_for_itself_alone(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A slow-call profile the sampler had not chosen (`attnscope.extra`, rate 1.0 on the
    span) is one of the calls, but stands for no unsampled call: est. calls is the random
    sample's Σ 1/rate, and its 1.0 is not a rate the trace was sampled at."""
    t = _Trace()
    for i in range(8):
        t.call("blocks.0.attn", "decode", None, wall=100_000 + 1_000 * i, tokens=10,
               flops=1_000_000, rate=0.25)
    t.call("blocks.0.attn", "decode", None, wall=400_000, tokens=10, flops=1_000_000,
           tier="profile", backend="flash", core=90_000, extra=True)
    report = _main_json(capsys, t.write(tmp_path / "extra.json"))
    (group,) = report["groups"]
    assert (group["calls"], group["profiled_calls"]) == (9, 1)
    assert group["estimated_calls"] == pytest.approx(8 / 0.25)  # was 33: the extra at weight 1
    assert report["sample_rates"] == [0.25]


def test_the_demo_trace_reports_two_rows_per_layer_as_its_tables(tmp_path: Path) -> None:
    """`attnscope demo` runs attention.naive then attention.sdpa through the same 4 layers: its
    trace's report has one row per layer and backend, with the calls of each implementation."""
    trace = tmp_path / "demo.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    demo = subprocess.run([sys.executable, "-m", "attnscope", "demo", "--steps", "3",
                           "--seq-len", "32", "--jaeger-json", str(trace)], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    report = _json_report(trace, tmp_path)
    spans = {s["spanID"]: s for s in jaeger_spans(trace)}
    # the forwards are named with their implementation (Jaeger's search list tells them apart)
    forwards = {s["operationName"] for s in spans.values()
                if s["operationName"].startswith("demo.forward")}
    assert forwards == {"demo.forward (naive)", "demo.forward (naive, layers profiled)",
                        "demo.forward (sdpa)", "demo.forward (sdpa, layers profiled)"}
    # a name says what was profiled: the block is timed, the layers under it are profiled
    children: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s in spans.values():
        for r in s["references"]:
            if r["refType"] == "CHILD_OF":
                children[r["spanID"]].append(s)
    for s in spans.values():
        if s["operationName"].endswith("layers profiled)"):
            assert s["tags"]["attnscope.tier"] == "timing"
            layers = [c for c in children[s["spanID"]] if "attnscope.module" in c["tags"]]
            assert len(layers) == 4
            assert all(c["tags"]["attnscope.tier"] == "profile" for c in layers)

    def implementation(span: dict[str, Any]) -> str:
        while "demo.implementation" not in span["tags"]:
            span = spans[next(r["spanID"] for r in span["references"]
                              if r["refType"] == "CHILD_OF")]
        return str(span["tags"]["demo.implementation"])

    expected: dict[tuple[str, str], int] = defaultdict(int)
    for s in _raw_calls(trace):  # the layers' spans (the traced functions inside have no module)
        if "attnscope.module" in s["tags"]:
            expected[(s["tags"]["attnscope.module"], implementation(s))] += 1
    names = {"naive_attention": "math", "sdpa_attention": "flash"}
    got = {(g["module"], g["backend"]): g["calls"] for g in report["groups"]}
    assert got == {(module, names[impl]): n for (module, impl), n in expected.items()}
    assert len(got) == 8  # 4 layers × 2 implementations
    for g in report["groups"]:
        assert g["label"] == f"{g['module']} · {g['backend']}"
    # the demo's own tables, one per implementation, count the same calls per layer
    for impl, table in zip(names, demo.stdout.split("attnscope report — ")[1:], strict=True):
        for (module, which), n in expected.items():
            if which == impl:
                assert re.search(rf"\n\s*{re.escape(module)}\s+—\s+{n}\s", table), table


def test_a_call_missing_a_sampled_nested_call_is_still_its_sites() -> None:
    """Layer calls whose SDPA call was sampled, and those whose was not, are one piece of code:
    they take the backend a profiled one of them recorded (it was a row of its own, "· —").
    Calls of two different functions nested in the same layer (naive, sdpa) stay apart, and one
    with neither nested could be either."""
    facts = {"attnscope.tier": "timing", "attnscope.flops": 10, "attnscope.module": "l0"}
    timed = {"attnscope.tier": "timing"}
    rows = [_named("p", None, "layer", {**facts, "attnscope.tier": "profile",
                                          "attnscope.backend": "flash"}),
            _named("p.sdpa", "p", "sdpa", {"attnscope.tier": "timing"}),
            _named("a", None, "layer", facts),                # its SDPA call not sampled
            _named("b", None, "layer", facts),
            _named("b.sdpa", "b", "sdpa", {"attnscope.tier": "timing"})]
    calls = attention_calls(rows)
    assert {k[1]: v for k, v in call_backends(rows, calls).items()} == \
        {"p": "flash", "a": "flash", "b": "flash"}
    demo = [_named("n", None, "layer", {**facts, "attnscope.tier": "profile",
                                          "attnscope.backend": "math"}),
            _named("n.i", "n", "naive", {"attnscope.tier": "timing"}),
            _named("s", None, "layer", {**facts, "attnscope.tier": "profile",
                                          "attnscope.backend": "flash"}),
            _named("s.i", "s", "fast", {"attnscope.tier": "timing"}),
            _named("n2", None, "layer", facts), _named("n2.i", "n2", "naive", timed),
            _named("s2", None, "layer", facts), _named("s2.i", "s2", "fast", timed),
            _named("x", None, "layer", facts)]
    got = {k[1]: v for k, v in call_backends(demo, attention_calls(demo)).items()}
    assert got == {"n": "math", "s": "flash", "n2": "math", "s2": "flash"}  # x: either
