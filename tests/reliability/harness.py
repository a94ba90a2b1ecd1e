"""The reliability suite's shared pieces: sizes, the figures record, timing and process checks.

Sizes: ``ATTNSCOPE_RELIABILITY_SIZE`` = ``ci`` (default; the whole directory in a few minutes on a
2-core machine) or ``full`` (the sizes of issue 10, for ``scripts/reliability.py``). Both are read
when this module is imported: the suite's conftest removes every ``ATTNSCOPE_*`` variable before
each test.

Figures: when ``ATTNSCOPE_RELIABILITY_OUT`` names a file, each test that recorded figures appends
one JSON line to it at teardown (scenario, load, fault, what was lost, result, command); the runner
turns those lines into the table of docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

SIZE = os.environ.get("ATTNSCOPE_RELIABILITY_SIZE", "ci").strip().lower() or "ci"
if SIZE not in ("ci", "full"):
    raise ValueError(f"ATTNSCOPE_RELIABILITY_SIZE must be 'ci' or 'full', got {SIZE!r}")
OUT = os.environ.get("ATTNSCOPE_RELIABILITY_OUT") or None
FULL = SIZE == "full"

# Sentinel values for the privacy scenario (and the fuzzer's scalars): distinctive in every
# rendering (str of a tensor, repr of a float, scientific notation, JSON).
FLOAT_SENTINEL = 7654321.5
INT_SENTINEL = 271828182
STR_SENTINEL = "SENTINEL-b7f3c2"
SENTINEL_PATTERNS = ("7654321.5", "7.6543e+06", "7.65432e+06", "7.654321e+06", "271828182",
                     "2.7183e+08", "2.71828e+08", "b7f3c2")


def sized(ci: int, full: int) -> int:
    """The number to use at the current size."""
    return full if FULL else ci


def leaks(text: str) -> list[str]:
    """The sentinel renderings found in ``text``."""
    return [p for p in SENTINEL_PATTERNS if p in text]


# ---- figures -------------------------------------------------------------------------------------


@dataclass
class Figures:
    """One test's row of the figures table (written at teardown, with the test's outcome)."""

    scenario: str = ""
    load: str = ""
    fault: str = "none"
    lost: str = ""
    figures: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    recorded: bool = False

    def set(self, scenario: str, load: str, fault: str = "none") -> None:
        self.scenario, self.load, self.fault, self.recorded = scenario, load, fault, True

    def add(self, **values: Any) -> None:
        self.figures.update(values)
        self.recorded = True

    def note(self, text: str) -> None:
        self.notes.append(text)


def command_for(nodeid: str) -> str:
    return f'ATTNSCOPE_RELIABILITY_SIZE={SIZE} python -m pytest "{nodeid}" -q'


def write_figures(fig: Figures, nodeid: str, outcome: str, reason: str, duration_s: float) -> None:
    if OUT is None or not fig.recorded:
        return
    row = {
        "test": nodeid, "size": SIZE, "scenario": fig.scenario, "load": fig.load,
        "fault": fig.fault, "lost": fig.lost, "figures": fig.figures, "notes": fig.notes,
        "result": outcome, "reason": reason[:400], "duration_s": round(duration_s, 2),
        "command": command_for(nodeid),
    }
    with open(OUT, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(row, default=str) + "\n")


# ---- measuring -----------------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, int(round(q / 100.0 * (len(ordered) - 1)))))
    return ordered[idx]


def latency_summary(values_s: list[float]) -> dict[str, float]:
    """p50/p99/max in microseconds."""
    return {"p50_us": round(statistics.median(values_s) * 1e6, 1) if values_s else float("nan"),
            "p99_us": round(percentile(values_s, 99) * 1e6, 1),
            "max_us": round(max(values_s) * 1e6, 1) if values_s else float("nan")}


def timed_calls(fn: Callable[[], Any], n: int) -> list[float]:
    out = []
    perf = time.perf_counter
    for _ in range(n):
        t0 = perf()
        fn()
        out.append(perf() - t0)
    return out


def rss_bytes() -> int:
    return int(psutil.Process().memory_info().rss)


def open_fds() -> int:
    return int(psutil.Process().num_fds())


# ---- subprocesses --------------------------------------------------------------------------------


def clean_env(**extra: str) -> dict[str, str]:
    """A user's shell: none of the suite's ATTNSCOPE_/OTEL_ settings; this checkout importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def run_script(path: Path, timeout_s: float, env: dict[str, str] | None = None
               ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(path)], capture_output=True, text=True,
                          timeout=timeout_s, env=env if env is not None else clean_env())


def stderr_problems(stderr: str) -> list[str]:
    """Lines that say something went wrong inside the process (not the app's own output)."""
    bad = ("Traceback", "attnscope internal error", "Segmentation fault", "Fatal Python error",
           "Exception ignored", "core dumped")
    return [line for line in stderr.splitlines() if any(b in line for b in bad)]


def otlp_json_spans(path: Path) -> list[dict[str, Any]]:
    """Every span in an OTLP/JSON-lines file (one ExportTraceServiceRequest per line)."""
    if not path.exists():
        return []
    spans: list[dict[str, Any]] = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        request = json.loads(line)
        for rs in request.get("resourceSpans", ()):
            for ss in rs.get("scopeSpans", ()):
                spans.extend(ss.get("spans", ()))
    return spans


def iter_lines(proc: subprocess.Popen[str]) -> Iterator[str]:
    assert proc.stdout is not None
    for line in proc.stdout:
        yield line.rstrip("\n")
