"""A first run, as a new user makes it (issue 11 items 6, 8, 9, 10): short programs in a
subprocess, their stdout and stderr read whole."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.e2e.otlp_fakes import free_port

ROOT = Path(__file__).resolve().parent.parent

_PROGRAM = """
import torch, attnscope
{setup}
@attnscope.trace
def attention(q):
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)

q = torch.randn(1, 4, 32, 16)
for _ in range({calls}):
    attention(q)
{after}
"""


def _run(setup: str = "", after: str = "", calls: int = 100, env: dict[str, str] | None = None,
         timeout: float = 120.0) -> subprocess.CompletedProcess[str]:
    code = _PROGRAM.format(setup=textwrap.dedent(setup), after=textwrap.dedent(after), calls=calls)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ATTNSCOPE_"))}
    clean.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=clean, cwd=ROOT)


# ---- 6: no collector ---------------------------------------------------------------------------


def test_no_collector_one_attnscope_line_no_exporter_noise_bounded_exit(tmp_path: Path) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    end, exited = tmp_path / "end", tmp_path / "exited"
    setup = f"""
        import atexit, time
        attnscope.configure(sample_rate=1.0, warmup_calls=0)
        # registered before the worker starts: runs after attnscope's exit flush
        atexit.register(lambda: open({str(exited)!r}, "w").write(repr(time.time())))
        """
    proc = _run(setup=setup, after=f"open({str(end)!r}, 'w').write(repr(time.time()))",
                env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    (line,) = lines
    assert line.startswith("attnscope: nothing is listening at " + endpoint)
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in line and "jaeger-json:" in line
    # the exit flush does not wait out the exporter's 10 s timeout on an endpoint that refuses
    # (0.2 s since issue 38; the 1.8 s median at load 10 is a figure in docs/reliability.md). The
    # bound here is what a loaded CI machine keeps: up to 4.1 s was seen at load 10 on 2 cores
    assert float(exited.read_text()) - float(end.read_text()) < 8.0


def test_no_collector_exporter_lines_kept_where_the_app_configured_them() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    setup = """
        import logging, sys
        otel = logging.getLogger("opentelemetry")
        otel.setLevel(logging.WARNING)
        otel.addHandler(logging.StreamHandler(sys.stdout))
        attnscope.configure(sample_rate=1.0, warmup_calls=0, exporter="otlp-http", metrics=False)
        """
    proc = _run(setup=setup, after="attnscope.flush(timeout_s=3)", calls=3,
                env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint})
    assert proc.returncode == 0, proc.stderr
    assert "nothing is listening" in proc.stderr  # attnscope's own line, as ever
    assert "Failed to export" in proc.stdout or "Transient error" in proc.stdout, proc.stdout


# ---- 8: the profile tier prints nothing ---------------------------------------------------------


def test_profile_tier_at_default_settings_prints_nothing(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    proc = _run(setup=f"attnscope.configure(sample_rate=1.0, warmup_calls=0, profile_rate=1.0, "
                      f"exporter='jaeger-json:{path}')", calls=30)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr == ""  # kineto's "External init callback ..." included
    spans = [s for t in json.loads(path.read_text())["data"] for s in t["spans"]]
    tiers = {tag["value"] for s in spans for tag in s["tags"] if tag["key"] == "attnscope.tier"}
    assert "profile" in tiers


# ---- 9: nothing sampled ----------------------------------------------------------------------


def test_nothing_sampled_still_writes_an_empty_trace_and_says_why(tmp_path: Path) -> None:
    path = tmp_path / "trace.json"
    setup = f"""
        import logging, sys
        log = logging.getLogger("attnscope")
        log.setLevel(logging.INFO)
        log.addHandler(logging.StreamHandler(sys.stderr))
        attnscope.configure(exporter="jaeger-json:{path}")
        """
    proc = _run(setup=setup, after="assert attnscope.stats()['emitted'] == 0", calls=5)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(path.read_text()) == {"data": []}
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert "no call was sampled" in lines[0]
    assert "sample_rate=1.0, warmup_calls=0" in lines[0]


def test_nothing_sampled_default_logging_prints_nothing(tmp_path: Path) -> None:
    path = tmp_path / "trace.jsonl"
    proc = _run(setup=f"attnscope.configure(exporter='otlp-json:{path}')",
                after=f"assert attnscope.flush()\nimport os; assert os.path.exists({str(path)!r})",
                calls=5)
    assert proc.returncode == 0, proc.stderr
    assert (proc.stdout, proc.stderr) == ("", "")
    assert path.read_text() == ""  # OTLP/JSON lines: no request yet


def test_file_exists_after_flush_with_a_worker_and_no_span(tmp_path: Path) -> None:
    from attnscope.exporters import JaegerJSONFileExporter

    path = tmp_path / "t.json"
    exporter = JaegerJSONFileExporter(path)
    try:
        assert exporter.force_flush()
        assert json.loads(path.read_text()) == {"data": []}
    finally:
        exporter.shutdown()


# ---- 10: a fresh install has what the first command needs --------------------------------------


def test_numpy_is_a_dependency() -> None:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert any(d.split(">")[0].split("=")[0].strip() == "numpy" for d in deps)


@pytest.mark.slow
def test_demo_stderr_is_quiet(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "attnscope.cli", "demo"], capture_output=True,
                          text=True, timeout=300, cwd=tmp_path,
                          env={k: v for k, v in os.environ.items()
                               if not k.startswith(("OTEL_", "ATTNSCOPE_"))})
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert proc.stdout
