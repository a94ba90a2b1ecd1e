"""The files ``attnscope run`` writes, named the same way by the program's processes and the CLI.

Each process that samples something writes its own pair of files in the output directory:

- the process the CLI started: ``traces.jaeger.json`` and ``traces.otlp.jsonl``;
- a distributed rank (``RANK`` set, as torchrun does): ``traces.rank<N>.jaeger.json`` ...;
- any other process (a DataLoader worker, a subprocess): ``traces.pid<PID>.jaeger.json`` ...

A process that samples nothing writes nothing. The files are created at the first export, not
at start-up: a launcher (torchrun itself) never claims a name.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ... import _safe_files

__all__ = ["ENV_DIR", "ENV_PARENT", "ENV_SERVICE", "JAEGER", "OTLP", "RunExporter",
           "clear_previous", "count_spans", "is_trace_file", "process_tag", "written"]

ENV_DIR = "ATTNSCOPE_RUN_DIR"  # the output directory (absolute)
ENV_PARENT = "ATTNSCOPE_RUN_PARENT_PID"  # the CLI's pid: its direct child writes the plain names
ENV_SERVICE = "ATTNSCOPE_RUN_SERVICE"  # service.name when OTEL_SERVICE_NAME is not set
JAEGER = "traces.jaeger.json"
OTLP = "traces.otlp.jsonl"
# traces.jaeger.json, traces.rank1.otlp.jsonl, traces.pid42.jaeger.json.1 (a rotated file), and
# traces.1234.jaeger.json (the exporters' own per-process name when a file's lock is taken)
_OURS = re.compile(r"^traces(\.[A-Za-z0-9-]+)?\.(jaeger\.json|otlp\.jsonl)(\.\d+)?$")


def process_tag(environ: Mapping[str, str], pid: int, parent_pid: int) -> str:
    """``""`` for the CLI's own child, ``rank<N>`` for a distributed rank, else ``pid<PID>``."""
    rank = environ.get("RANK", "").strip()
    if rank.isdigit():
        return f"rank{int(rank)}"
    if str(parent_pid) == environ.get(ENV_PARENT, "").strip():
        return ""
    return f"pid{pid}"


def _named(directory: str, base: str, tag: str) -> str:
    if not tag:
        return os.path.join(directory, base)
    stem, ext = base.split(".", 1)
    return os.path.join(directory, f"{stem}.{tag}.{ext}")


class RunExporter:
    """Both file exporters behind one ``exporter=``: every batch goes to each.

    Duck-typed (``export``/``force_flush``/``shutdown``) so that configuring it imports nothing of
    the OpenTelemetry SDK; the two file exporters are created at the first export or flush, in the
    process that exports (a forked child makes its own, under its own names).
    """

    attnscope_writes_files = True  # local work at exit: see export.pipeline

    def __init__(self, directory: str, environ: Mapping[str, str]) -> None:
        self._directory = directory
        self._environ = dict(environ)
        self._lock = threading.Lock()
        self._pid = -1
        self._inner: list[Any] = []

    def _exporters(self) -> list[Any]:
        with self._lock:
            if self._pid != os.getpid():
                from ..._export.jaeger_json import JaegerJSONFileExporter
                from ..._export.otlp_json import OTLPJSONFileExporter

                tag = process_tag(self._environ, os.getpid(), os.getppid())
                self._inner = [
                    JaegerJSONFileExporter(_named(self._directory, JAEGER, tag)),
                    OTLPJSONFileExporter(_named(self._directory, OTLP, tag)),
                ]
                self._pid = os.getpid()
            return self._inner

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        results = [exporter.export(spans) for exporter in self._exporters()]
        ok = all(r == SpanExportResult.SUCCESS for r in results)
        return SpanExportResult.SUCCESS if ok else SpanExportResult.FAILURE

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return all([exporter.force_flush(timeout_millis) for exporter in self._exporters()])

    def shutdown(self) -> None:
        with self._lock:
            inner = self._inner if self._pid == os.getpid() else []
        for exporter in inner:
            exporter.shutdown()


RUN_INFO = "run.json"
# the settings a run states (the child reads them from these variables)
_SETTING_VARS = {"sample_rate": "ATTNSCOPE_SAMPLE_RATE", "profile_rate": "ATTNSCOPE_PROFILE_RATE",
                 "overhead_budget": "ATTNSCOPE_OVERHEAD_BUDGET",
                 "warmup_calls": "ATTNSCOPE_WARMUP_CALLS"}


def write_run_info(directory: Path, *, command: list[str], argv: list[str],
                   environ: Mapping[str, str], started_ns: int, ended_ns: int,
                   exit_code: int) -> None:
    """``run.json``: what ``attnscope run`` ran and how (read back by ``report`` and ``diff``),
    beside the trace files; none when the run wrote none. A write that fails is one line on
    stderr: the traces are still there. Written whole and never through a link (a link planted
    at the name is refused)."""
    if not written(directory):
        return
    import platform
    import socket

    from ..._version import __version__

    def iso(ns: int) -> str:
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns / 1e9)) + \
            f".{ns // 1_000_000 % 1000:03d}Z"

    info = {
        "command": list(command), "argv": list(argv),
        "started": iso(started_ns), "ended": iso(ended_ns),
        "duration_s": round((ended_ns - started_ns) / 1e9, 3), "exit_code": exit_code,
        "host": socket.gethostname(), "arch": platform.machine(),
        "python": platform.python_version(), "attnscope_version": __version__,
        "settings": {name: _setting(environ.get(var), int if name == "warmup_calls" else float)
                     for name, var in _SETTING_VARS.items()},
    }
    try:
        _safe_files.write_text(directory / RUN_INFO, json.dumps(info, indent=2) + "\n")
    except OSError as exc:
        print(f"attnscope run: cannot write {directory / RUN_INFO} "
              f"({exc.strerror or type(exc).__name__})", file=sys.stderr)


def _setting(raw: str | None, kind: type[int] | type[float]) -> int | float | None:
    """A setting's variable as the number the program reads from it (as ``report --json`` and
    the resource state it); None when unset or not a finite number (the program then warned and
    took the default)."""
    if raw is None:
        return None
    try:
        value = kind(raw.strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def is_run_file(name: str) -> bool:
    """True for a file ``attnscope run`` writes into its directory: traces, locks, run.json."""
    return name == RUN_INFO or is_trace_file(name)


def is_trace_file(name: str) -> bool:
    """True for the name of a trace file a run writes, or of its lock file."""
    return _OURS.match(name.removesuffix(".lock")) is not None


def clear_previous(directory: Path) -> list[Path]:
    """Remove the trace files (and their lock files) and ``run.json`` an earlier run left in
    ``directory`` (OTLP lines would be appended to them); returns what was removed. A link at
    one of those names is removed too (the link, never what it points to: attnscope would refuse
    to write through it). Other files are left alone."""
    removed = []
    for path in sorted(directory.iterdir()):
        # (PATH.lock: left by a process killed before its exporter shut down)
        if is_run_file(path.name) and (path.is_symlink() or path.is_file()):
            path.unlink()
            removed.append(path)
    return removed


def written(directory: Path) -> list[Path]:
    """The trace files in ``directory``: the plain names first, then the others by name."""
    found = [p for p in directory.iterdir()
             if _OURS.match(p.name) and p.is_file() and not p.is_symlink()]
    return sorted(found, key=lambda p: (p.name not in (JAEGER, OTLP), p.name))


def count_spans(path: Path) -> int | None:
    """Spans in a Jaeger JSON document; None when it cannot be read as one."""
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        return sum(len(trace.get("spans", ())) for trace in document.get("data", ()))
    except (OSError, ValueError, AttributeError, TypeError):
        return None
