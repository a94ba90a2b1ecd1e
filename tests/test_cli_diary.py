"""The performance diary (issue 22 §3): ``attnscope diff --append-diary PATH.jsonl`` writes one
JSON line per comparison, ``attnscope.cli.diary`` reads it back as a table, JSON and an HTML page;
and diff shows each side's backends per group (§2, grouping by implementation).

The traces are synthetic Jaeger files written here, so every figure the entry and the diary table
hold is computed again below from the call times the test chose (numpy's default quantile written
out, ``statistics.median``), never read back from attnscope."""

from __future__ import annotations

import io
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import textwrap
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from attnscope.cli import main
from attnscope.cli.diary import load, render_html, run_diary_report, summary, to_json
from tests.support.browser import dom_of

ROOT = Path(__file__).resolve().parent.parent

# (module, phase): what each group ran under on each side; None: never profiled (unknown)
BACKENDS = {"before": {"layer0": "math", "layer1": "math", "layer2": None},
            "after": {"layer0": "math", "layer1": "flash", "layer2": None}}
COMMANDS = {"before": ["python", "app.py", "--impl", "eager"],
            "after": ["python", "app.py", "--impl", "sdpa"]}


def _linear_quantile(values: Sequence[float], q: float) -> float:
    """numpy's default ("linear", Hyndman & Fan type 7), written out here."""
    ordered = sorted(values)
    h = (len(ordered) - 1) * q
    lo = math.floor(h)
    return ordered[lo] + (h - lo) * (ordered[min(lo + 1, len(ordered) - 1)] - ordered[lo])


def _tag(key: str, value: Any) -> dict[str, Any]:
    kind = "string" if isinstance(value, str) else "int64"
    return {"key": key, "type": kind, "value": value}


def _write_run(directory: Path, side: str, times: dict[str, list[int]], *,
               run_json: bool) -> None:
    """One run directory: a Jaeger file with each group's timed calls (wall ns), plus one
    profiled call (``attnscope.backend``) in each group whose backend is known."""
    directory.mkdir(parents=True)
    spans, n = [], 0
    for module, walls in times.items():
        backend = BACKENDS[side][module]
        calls = [(w, "timing") for w in walls] + ([(10**9, "profile")] if backend else [])
        for wall, tier in calls:
            n += 1
            tags = [_tag("attnscope.tier", tier), _tag("attnscope.module", module),
                    _tag("attnscope.phase", "decode"), _tag("attnscope.wall_ns", int(wall)),
                    _tag("attnscope.num_heads", 4)]
            if tier == "profile":
                tags.append(_tag("attnscope.backend", backend))
            spans.append({"traceID": f"{n:032x}", "spanID": f"{n:016x}",
                          "operationName": module, "startTime": 1_000 + n,
                          "duration": int(wall) // 1000, "tags": tags, "processID": "p1"})
    process = {"serviceName": "app", "tags": [
        _tag("host.name", f"host-{side}"), _tag("attnscope.version", "9.9.9"),
        _tag("process.command_args", json.dumps(COMMANDS[side] + ["--from-resource"]))]}
    (directory / "traces.jaeger.json").write_text(json.dumps(
        {"data": [{"traceID": "0" * 32, "spans": spans, "processes": {"p1": process}}]}))
    if run_json:  # what `attnscope run` records: the command as typed wins over the resource's
        (directory / "run.json").write_text(json.dumps(
            {"command": COMMANDS[side], "started": f"2026-01-0{1 if side == 'before' else 2}"
                                                  "T00:00:00Z"}))


def _side(root: Path, side: str, seed: int, n_runs: int, slow: float) -> list[dict[str, list]]:
    """``n_runs`` runs (a repeat directory when several): layer0 the same calls on both sides
    (same seed), layer1 ``slow`` times slower AFTER, layer2 10 calls (too few for a verdict)."""
    truth = []
    for k in range(n_runs):
        rng = np.random.default_rng(seed * 100 + k)
        factor = 1.0 + 0.02 * k  # a little run-to-run noise, the same on both sides
        base = {"layer0": rng.lognormal(13.0, 0.2, 80), "layer1": rng.lognormal(13.5, 0.2, 80),
                "layer2": rng.lognormal(13.2, 0.2, 10)}
        scale = {"layer0": 1.0, "layer1": slow, "layer2": 1.5 if slow != 1.0 else 1.0}
        # whole microseconds first, then scaled: an exact 2x
        times = {m: [int(round(v * factor / 1000) * 1000 * scale[m]) for v in values]
                 for m, values in base.items()}
        where = root if n_runs == 1 else root / f"run-{k + 1}"
        _write_run(where, side, times, run_json=k == 0)
        truth.append(times)
    return truth


@pytest.fixture(scope="module")
def sides(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("diary")
    out: dict[str, Any] = {"tmp": tmp}
    for name, side, runs, slow in (("b1", "before", 1, 1.0), ("a1", "after", 1, 2.0),
                                   ("b3", "before", 3, 1.0), ("a3", "after", 3, 2.0),
                                   ("same3", "after", 3, 1.0)):
        out[name] = tmp / name
        out["truth_" + name] = _side(tmp / name, side, 7, runs, slow)
    return out


def _diff(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str, str]:
    code = main(["diff", *map(str, args)])
    out, err = capsys.readouterr()
    return code, out, err


def _python_m(*args: str | Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, COLUMNS="250")
    return subprocess.run([sys.executable, "-m", "attnscope", *map(str, args)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)


# -- the entry -------------------------------------------------------------------------------


def test_an_entry_holds_every_figure_of_the_comparison(sides: dict[str, Any],
                                                       tmp_path: Path) -> None:
    """Through the real command: one line, every figure recomputed here from the call times."""
    diary = tmp_path / "perf.jsonl"
    done = _python_m("diff", sides["b1"], sides["a1"], "--append-diary", diary,
                     "--diary-note", "eager → sdpa in layer1")
    assert done.returncode == 0, done.stderr
    lines = diary.read_text().splitlines()
    assert len(lines) == 1
    entry = json.loads(lines[0])
    assert entry["schema"] == 1 and entry["note"] == "eager → sdpa in layer1"
    assert entry["date"].endswith("Z") and entry["date"][:2] == "20"
    for side, name in (("before", "b1"), ("after", "a1")):
        assert entry[side]["paths"] == [str(sides[name])] and entry[side]["runs"] == 1
        info = entry[side]["run_info"]
        assert info["command"] == " ".join(COMMANDS[side])  # run.json's, not the resource's
        assert info["hosts"] == [f"host-{side}"] and info["versions"]["attnscope"] == "9.9.9"
        assert entry[side]["noise"] is None  # one run: no floor measured
    assert entry["run_to_run_noise_measured"] is False
    assert entry["gate"] == {"fail_if_slower": None, "outcome": "no gate", "exit_code": None,
                             "failed": []}
    by = {g["module"]: g for g in entry["groups"]}
    assert list(by) == ["layer0", "layer1", "layer2"]
    truth_b, truth_a = sides["truth_b1"][0], sides["truth_a1"][0]
    for module, group in by.items():
        assert group["phase"] == "decode"
        for q, name in ((0.5, "p50"), (0.95, "p95"), (0.99, "p99")):
            m = group["time_ns"][name]
            b, a = _linear_quantile(truth_b[module], q), _linear_quantile(truth_a[module], q)
            assert m["before"] == pytest.approx(b) and m["after"] == pytest.approx(a)
            assert m["change"] == pytest.approx(a / b - 1)
        known = 1 if BACKENDS["before"][module] else 0
        assert group["calls_before"] == len(truth_b[module]) + known
    assert [by[m]["verdict"] for m in by] == ["no change", "slower", "too few calls (< 20)"]
    assert by["layer1"]["time_ns"]["p50"]["change"] == pytest.approx(1.0)
    lo, hi = by["layer1"]["time_ns"]["p50"]["interval"]
    assert 0 < lo <= 1.0 <= hi
    assert by["layer2"]["time_ns"]["p50"]["interval"] == [None, None]  # too few: none computed
    # backends: the profiled call's, given to the timed calls of its site; none known: null
    assert by["layer1"]["backend"] == "math → flash" and by["layer0"]["backend"] == "math"
    assert by["layer2"]["backend"] is None
    assert by["layer1"]["backends_before"] == {"names": ["math"], "calls": {"math": 81},
                                               "calls_unknown": 0}
    assert by["layer2"]["backends_after"] == {"names": [], "calls": {}, "calls_unknown": 10}


def test_multi_run_entries_hold_the_noise_floor_and_the_gate(
        sides: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    diary = tmp_path / "perf.jsonl"
    # failed: layer1 2x slower over 3 runs a side; the diary does not change the exit code
    code, out, err = _diff(capsys, sides["b3"], sides["a3"], "--fail-if-slower", "20",
                           "--append-diary", diary)
    assert code == 1 and "FAIL: layer1 (decode)" in out and not err
    # passed: A/A over 3 runs
    assert _diff(capsys, sides["b3"], sides["same3"], "--fail-if-slower", "20",
                 "--append-diary", diary)[0] == 0
    # not judged: one run a side (exit 3)
    assert _diff(capsys, sides["b1"], sides["a1"], "--fail-if-slower", "20",
                 "--append-diary", diary)[0] == 3
    failed, passed, unjudged = (json.loads(x) for x in diary.read_text().splitlines())
    assert failed["gate"] == {"fail_if_slower": 0.2, "outcome": "failed", "exit_code": 1,
                              "failed": ["layer1 (decode)"]}
    assert passed["gate"]["outcome"] == "passed" and passed["gate"]["exit_code"] == 0
    assert unjudged["gate"]["outcome"] == "not judged" and unjudged["gate"]["exit_code"] == 3
    assert failed["run_to_run_noise_measured"] is True
    assert failed["before"]["runs"] == 3 and failed["before"]["paths"] == [str(sides["b3"])]
    # the side's first run gives the metadata
    assert failed["before"]["run_info"]["command"] == " ".join(COMMANDS["before"])
    for side, name in (("before", "b3"), ("after", "a3")):
        floors = {n["module"]: n for n in failed[side]["noise"]}
        for module in ("layer0", "layer1", "layer2"):
            per_run = [statistics.median(t[module]) for t in sides["truth_" + name]]
            assert floors[module]["runs"] == 3
            assert floors[module]["p50_per_run"] == pytest.approx(per_run)
            assert floors[module]["noise_floor"] == pytest.approx(max(per_run) / min(per_run) - 1)
    layer1 = next(g for g in failed["groups"] if g["module"] == "layer1")
    per_b = [statistics.median(t["layer1"]) for t in sides["truth_b3"]]
    per_a = [statistics.median(t["layer1"]) for t in sides["truth_a3"]]
    assert layer1["time_ns"]["p50"]["before"] == pytest.approx(statistics.median(per_b))
    assert layer1["time_ns"]["p50"]["change"] == pytest.approx(
        statistics.median(per_a) / statistics.median(per_b) - 1)
    assert layer1["gate_failed"] is True and layer1["runs_before"] == 3


def test_concurrent_appends_never_interleave(tmp_path: Path) -> None:
    """Eight processes append lines far larger than a pipe buffer at once: eight whole lines."""
    diary = tmp_path / "perf.jsonl"
    program = textwrap.dedent("""
        import sys
        from attnscope.cli.diff._diary import append
        k = int(sys.argv[2])
        append(sys.argv[1], {"schema": 1, "writer": k, "pad": str(k) * 300_000})
    """)
    procs = [subprocess.Popen([sys.executable, "-c", program, str(diary), str(k)], cwd=ROOT)
             for k in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    docs = [json.loads(line) for line in diary.read_text().splitlines()]
    assert sorted(d["writer"] for d in docs) == list(range(8))
    assert all(d["pad"] == str(d["writer"]) * 300_000 for d in docs)


def test_an_entry_after_a_line_left_without_its_newline_is_its_own_line(
        sides: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    diary = tmp_path / "perf.jsonl"
    diary.write_text('{"schema": 1, "cut sh')
    assert _diff(capsys, sides["b1"], sides["a1"], "--append-diary", diary)[0] == 0
    lines = diary.read_text().splitlines()
    assert len(lines) == 2 and json.loads(lines[1])["schema"] == 1


@pytest.mark.parametrize("case", ["no_dir", "is_dir", "long_note", "note_alone", "noise"])
def test_bad_diary_options_fail_before_the_work(
        case: str, sides: dict[str, Any], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    args: list[str | Path] = [sides["b1"], sides["a1"]]
    args += {"no_dir": ["--append-diary", tmp_path / "no" / "d.jsonl"],
             "is_dir": ["--append-diary", tmp_path],
             "long_note": ["--append-diary", tmp_path / "d.jsonl", "--diary-note", "x" * 501],
             "note_alone": ["--diary-note", "what changed"],
             "noise": ["--append-diary", tmp_path / "d.jsonl"]}[case]
    if case == "noise":
        args = ["--noise", sides["b3"], *args[2:]]
    if case == "long_note":
        with pytest.raises(SystemExit) as exit_:
            _diff(capsys, *args)
        assert exit_.value.code == 2
        assert capsys.readouterr().err.strip().splitlines()[-1].endswith(
            "argument --diary-note: 501 characters; at most 500")
    else:
        code, out, err = _diff(capsys, *args)
        assert code == 2 and not out, out
        assert len(err.strip().splitlines()) == 1 and err.startswith("attnscope diff: error: ")
    assert not (tmp_path / "d.jsonl").exists()
    # 500 characters is allowed
    assert _diff(capsys, sides["b1"], sides["a1"], "--append-diary", tmp_path / "ok.jsonl",
                 "--diary-note", "y" * 500)[0] == 0


def test_a_failure_while_writing_is_one_line_and_exit_2(
        sides: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> None:
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full on this system")
    code, out, err = _diff(capsys, sides["b1"], sides["a1"], "--append-diary", "/dev/full")
    assert code == 2 and "layer1 (decode)" in out  # the comparison was shown first
    assert err.strip().splitlines() == [
        "attnscope diff: error: --append-diary /dev/full: cannot write there "
        "(No space left on device)"]


def test_the_entry_is_written_when_the_reader_of_the_output_goes_away(
        sides: dict[str, Any], tmp_path: Path) -> None:
    """`attnscope diff ... --append-diary D | head -2`: the entry asked for is in the diary."""
    diary = tmp_path / "diary.jsonl"
    done = _closed_stdout("diff", sides["b1"], sides["a1"], "--append-diary", diary)
    # its output was cut, and that is not a plain success: ended as `yes | head` ends
    assert done.returncode == -signal.SIGPIPE, done.stderr
    assert done.stderr == b""
    (line,) = diary.read_text().splitlines()
    assert json.loads(line)["before"]["paths"] == [str(sides["b1"])]


def test_a_tripped_gate_keeps_its_exit_code_when_the_reader_of_the_output_goes_away(
        sides: dict[str, Any], tmp_path: Path) -> None:
    """`diff ... --fail-if-slower 5 | head`: 1, the gate's own code, and its entry says so."""
    diary = tmp_path / "diary.jsonl"
    done = _closed_stdout("diff", sides["b1"], sides["a1"], "--call-level-gate",
                          "--fail-if-slower", "5", "--append-diary", diary)
    assert done.returncode == 1, done.stderr
    (line,) = diary.read_text().splitlines()
    assert json.loads(line)["gate"]["outcome"] == "failed"


def _closed_stdout(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """``attnscope ARGS | head -0``: nothing reads what the command prints."""
    read, write = os.pipe()
    os.close(read)  # its first write to stdout fails
    try:
        return subprocess.run([sys.executable, "-m", "attnscope", *map(str, args)], stdout=write,
                              stderr=subprocess.PIPE, timeout=120, cwd=ROOT)
    finally:
        os.close(write)


# -- diff shows the backends -----------------------------------------------------------------


def test_diff_shows_each_sides_backends_per_group(
        sides: dict[str, Any], capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    code, out, _ = _diff(capsys, sides["b1"], sides["a1"])
    assert code == 0
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in out.splitlines()
            if line.startswith("│")]
    layers = [r[0] for r in rows if r[0]]
    assert layers == ["layer0 (decode)", "backend math", "layer1 (decode)",
                      "backend math → flash", "layer2 (decode)", "backend —"]
    code, doc_text, _ = _diff(capsys, sides["b1"], sides["a1"], "--json", "-")
    by = {g["module"]: g["backends"] for g in json.loads(doc_text)["groups"]}
    assert by["layer1"]["text"] == "math → flash" and by["layer2"]["text"] is None
    assert by["layer1"]["after"] == {"names": ["flash"], "calls": {"flash": 81},
                                     "calls_unknown": 0}
    page = tmp_path / "diff.html"
    assert _diff(capsys, sides["b1"], sides["a1"], "--html", page)[0] == 0
    assert "<td class=\"l\">backend math → flash</td>" in page.read_text()
    monkeypatch.setenv("COLUMNS", "80")  # narrow: each group under its own heading
    _, narrow, _ = _diff(capsys, sides["b1"], sides["a1"])
    assert "layer1 (decode) · backend math → flash" in narrow


# -- the diary read back ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def filled(sides: dict[str, Any]) -> dict[str, Any]:
    """A diary of three entries: one run a side, 3 runs with the gate failing, A/A passing."""
    diary = sides["tmp"] / "filled.jsonl"
    for args in ([sides["b1"], sides["a1"], "--diary-note", "switch layer1 to flash"],
                 [sides["b3"], sides["a3"], "--fail-if-slower", "20"],
                 [sides["b3"], sides["same3"], "--fail-if-slower", "20"]):
        main(["diff", *map(str, args), "--append-diary", str(diary), "--json", os.devnull])
    return {"path": diary, "entries": [json.loads(x) for x in diary.read_text().splitlines()]}


def _expected_rows(sides: dict[str, Any]) -> list[list[str]]:
    """The diary table's rows, from the call times alone."""
    def p50(name: str, module: str) -> float:
        return statistics.median(statistics.median(t[module]) for t in sides["truth_" + name])

    rows = []
    for k, (b, a, note, verdicts, gate) in enumerate((
            ("b1", "a1", "switch layer1 to flash", "1 slower, 1 no change, 1 too few calls",
             "no gate"),
            ("b3", "a3", "—", "1 slower, 1 no change, 1 too few calls", "failed (20%)"),
            ("b3", "same3", "—", "2 no change, 1 too few calls", "passed (20%)")), 1):
        changes = {m: p50(a, m) / p50(b, m) - 1 for m in ("layer0", "layer1", "layer2")}
        largest = max(changes, key=lambda m: abs(changes[m]))
        # _side: layer1 slower AFTER but in the A/A pair, layer2 too few calls for a verdict
        verdict = {"layer0": "no change", "layer1": "no change" if a == "same3" else "slower",
                   "layer2": "too few calls"}[largest]
        said = "" if verdict == "slower" else f": {verdict}"
        after_cmd = " ".join(COMMANDS["after"])
        rows.append([str(k), None, note, f"{' '.join(COMMANDS['before'])} → {after_cmd}",
                     f"{1 if b == 'b1' else 3} / {1 if b == 'b1' else 3}", verdicts,
                     f"{changes[largest] * 100:+.1f}% {largest} (decode){said}", gate])
    return rows


def test_the_diary_table_pins_every_figure(sides: dict[str, Any], filled: dict[str, Any],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "250")
    out = io.StringIO()
    assert run_diary_report(str(filled["path"]), out=out) == 0
    text = out.getvalue()
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()
            if line.startswith("│")]
    expected = _expected_rows(sides)
    assert len(rows) == 3, text
    for row, want, entry in zip(rows, expected, filled["entries"], strict=True):
        want[1] = entry["date"].replace("T", " ")
        assert row == want, text
    assert "attnscope performance diary: 3 entries" in text
    # the A/A entry's largest change is that of layer0/1/2 under noise only: small
    assert abs(float(rows[2][6].split("%")[0])) < 10


def test_the_json_document_and_summary_agree_with_the_table(
        sides: dict[str, Any], filled: dict[str, Any], tmp_path: Path) -> None:
    out_json = tmp_path / "diary.json"
    assert run_diary_report(str(filled["path"]), json_path=str(out_json),
                            out=io.StringIO()) == 0
    doc = json.loads(out_json.read_text())
    assert doc == json.loads(json.dumps(to_json(filled["entries"])))
    assert doc["schema"] == 1 and doc["entries"] == 3 and doc["diary"] == filled["entries"]
    first = doc["rows"][0]
    assert first["verdicts"] == {"slower": 1, "no change": 1, "too few calls": 1}
    assert first["largest_p50_change"]["group"] == "layer1 (decode)"
    assert first["largest_p50_change"]["change"] == pytest.approx(1.0)
    assert first["before_command"] == " ".join(COMMANDS["before"])
    assert doc["rows"][1]["gate"] == {"fail_if_slower": 0.2, "outcome": "failed"}
    stdout = io.StringIO()
    assert run_diary_report(str(filled["path"]), json_path="-", out=stdout) == 0
    assert json.loads(stdout.getvalue()) == doc  # '-': the document instead of the table
    assert summary(filled["entries"][2])["gate"]["outcome"] == "passed"


def test_malformed_lines_are_skipped_and_counted_on_one_line(
        filled: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    diary = tmp_path / "mixed.jsonl"
    good = filled["path"].read_text().splitlines()
    diary.write_text("\n".join([good[0], "not json", "", '{"schema": 2, "date": "x"}',
                                good[1], "[1, 2]", '{"schema": 1, "cut']) + "\n")
    entries = load(str(diary))
    assert [e["date"] for e in entries] == [json.loads(good[i])["date"] for i in (0, 1)]
    err = capsys.readouterr().err
    assert err.splitlines() == [f"attnscope diary {diary}: skipped 4 malformed lines (lines 2, "
                                "4, 6, 7; not a schema-1 diary entry)"]


def test_an_empty_or_missing_diary(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    out = io.StringIO()
    assert run_diary_report(str(empty), out=out) == 0
    assert out.getvalue().startswith(f"diary {empty}: no entries yet")
    from attnscope.cli import CLIError

    with pytest.raises(CLIError, match="cannot read it"):
        run_diary_report(str(tmp_path / "missing.jsonl"), out=io.StringIO())
    with pytest.raises(CLIError, match="does not exist"):  # checked before reading the diary
        run_diary_report(str(empty), html=str(tmp_path / "no" / "d.html"))


def test_the_html_page_has_the_table_and_both_plots(
        sides: dict[str, Any], filled: dict[str, Any], tmp_path: Path) -> None:
    page = render_html(filled["entries"])
    assert page.count("<svg") == 2 and "<script" not in page and "http" not in page.split(
        "<svg", 1)[0]
    assert "p50 time per layer over the entries" in page
    assert "p99 time per layer over the entries" in page
    for row in _expected_rows(sides):
        for cell in row[2:]:
            assert cell.replace("→", "&#8594;") in page or cell in page, cell
    out = tmp_path / "diary.html"
    assert run_diary_report(str(filled["path"]), html=str(out), out=io.StringIO()) == 0
    dom = dom_of(out)
    assert dom.count("<svg") == 2 and "switch layer1 to flash" in dom


def test_the_largest_change_is_by_size_either_way_and_unknown_figures_are_left_out() -> None:
    def group(module: str, change: float | None, verdict: str) -> dict[str, Any]:
        return {"module": module, "phase": None, "verdict": verdict,
                "time_ns": {"p50": {"change": change}}}

    entry = {"schema": 1, "date": "2026-01-01T00:00:00Z", "note": None,
             "before": {"paths": ["a"], "runs": 1, "run_info": {"command": None}},
             "after": {"paths": ["b"], "runs": 2, "run_info": {}},
             "groups": [group("up", 0.3, "slower"), group("down", -0.5, "faster"),
                        group("none", None, "too few calls (< 20 in a run)"),
                        group("flat", 0.0, "no change")],
             "gate": {"fail_if_slower": None, "outcome": "no gate"}}
    row = summary(entry)
    assert row["largest_p50_change"] == {"group": "down", "change": -0.5, "verdict": "faster"}
    assert row["verdicts"] == {"slower": 1, "no change": 1, "faster": 1, "too few calls": 1}
    assert (row["before_command"], row["after_command"]) == ("a", "b")  # no command: the paths
    assert "-50.0% down<" in render_html([entry])  # a direction: nothing added
    assert "1 entry, " in render_html([entry]) and "2 entries, " in render_html([entry] * 2)
    # a larger change of a group too few calls judged: shown, with what its verdict was
    entry["groups"].append(group("few", -0.9, "too few calls (< 20 in a run)"))
    row = summary(entry)
    assert row["largest_p50_change"] == {"group": "few", "change": -0.9,
                                         "verdict": "too few calls"}
    assert "-90.0% few: too few calls<" in render_html([entry])


def test_report_diary_on_the_command_line(filled: dict[str, Any], tmp_path: Path) -> None:
    done = _python_m("report", "--diary", filled["path"], "--json", tmp_path / "d.json")
    assert done.returncode == 0, done.stderr
    assert "attnscope performance diary: 3 entries" in done.stdout
    assert json.loads((tmp_path / "d.json").read_text())["entries"] == 3
    for args, message in (([], "no trace given"),
                          ([filled["path"], "--diary", filled["path"]], "not both")):
        bad = _python_m("report", *args)
        assert bad.returncode == 2 and bad.stdout == ""
        assert len(bad.stderr.strip().splitlines()) == 1 and message in bad.stderr
