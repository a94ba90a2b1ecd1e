"""`attnscope report` on real trace files (tests/cli_traces.py), run as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnscope.cli.traces import SpanRow, attention_calls, load_spans
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
    assert done.stderr == ""
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
        timed = [t for t in tags if t["attnscope.tier"] == "timing"] or tags
        walls = np.array([t["attnscope.wall_ns"] for t in timed], dtype=float)
        tokens = sum(t["attnscope.tokens"] for t in timed)
        flops = sum(t["attnscope.flops"] for t in timed)
        assert g["calls"] == len(tags)
        assert g["estimated_calls"] == pytest.approx(sum(1 / t["attnscope.sample_rate"]
                                                         for t in tags))
        assert g["wall_ns"]["p50"] == pytest.approx(np.percentile(walls, 50))
        assert g["wall_ns"]["p99"] == pytest.approx(np.percentile(walls, 99))
        assert g["wall_ns"]["max"] == walls.max()
        assert g["tokens"] == tokens and g["flops"] == flops
        assert g["tokens_per_s"] == pytest.approx(tokens / walls.sum() * 1e9)
        assert g["tflops"] == pytest.approx(flops / walls.sum() / 1e3)
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
    per_name: dict[str, int] = defaultdict(int)
    for t in profiled:
        for name, ns in zip(json.loads(t["attnscope.kernel.top_names"]),
                            json.loads(t["attnscope.kernel.top_ns"]), strict=False):
            per_name[name] += ns
    total = sum(t["attnscope.kernel.total_ns"] for t in profiled)
    top = sorted(per_name.items(), key=lambda kv: -kv[1])[:3]
    kernels = report["overall"]["kernels"]
    assert [(k["name"], k["ns"]) for k in kernels] == top
    assert kernels[0]["share"] == pytest.approx(top[0][1] / total)
    assert report["overall"]["profiled_calls"] == len(profiled)
    slowest = sorted(calls, key=lambda s: -s["tags"]["attnscope.wall_ns"])[:3]
    assert [c["span_id"] for c in report["slowest"]] == [s["spanID"] for s in slowest]


def test_terminal_report_names_every_layer_and_phase(traces: TraceFiles) -> None:
    done = _report(traces.directory, "--price-per-hour", "2")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    for module, phase in {(s["tags"]["attnscope.module"], s["tags"]["attnscope.phase"])
                          for s in _raw_calls(traces.jaeger)}:
        assert re.search(rf"{re.escape(module)}\s+{phase}", done.stdout), done.stdout
    assert "Slowest calls" in done.stdout and "$/1k tok" in done.stdout
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


def test_html_renders_in_chromium(traces: TraceFiles, tmp_path: Path) -> None:
    browser = shutil.which("chromium") or shutil.which("chromium-browser") \
        or shutil.which("google-chrome")
    if browser is None:
        pytest.skip("no chromium on this machine (apt-get install chromium)")
    out = tmp_path / "report.html"
    assert _report(traces.directory, "--html", out).returncode == 0
    done = subprocess.run([browser, "--headless", "--no-sandbox", "--disable-gpu",
                           "--enable-logging=stderr", "--v=0", "--dump-dom", out.as_uri()],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count("<svg") >= 4
    assert "Latency distribution per layer" in done.stdout
    assert "Timeline of one profiled call" in done.stdout
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line
               or "Uncaught" in line or "net::ERR" in line]
    assert not console, console
