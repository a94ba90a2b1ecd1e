"""Several Jaeger JSON files (one per process: the ranks of a job) merged into one document.

Each file written by :class:`~attnscope.exporters.JaegerJSONFileExporter` holds whole traces, each
with its own process table (``p1``, ``p2``...). The ranks of a job write the spans of one step
under the same trace id (docs/live.md); merged, a trace holds every rank's spans, and their
processes are renumbered per trace so rank 0's ``p1`` and rank 1's ``p1`` stay apart. A span that
appears in two files (the same file given twice) is kept once. A step's root (``attnscope.step N``,
emitted by rank 0 and covering rank 0's calls only) is widened to cover every rank's spans of its
trace: a straggler's rank span lies under it, and the trace's time under no span is gone.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from typing import Any

from .. import _schema as schema
from .._safe_files import write_text

__all__ = ["merge_jaeger_json", "merged_document"]


def merged_document(paths: Iterable[str | os.PathLike[str]]) -> dict[str, Any]:
    """The Jaeger JSON document ``{"data": [trace, ...]}`` of every trace in ``paths``."""
    traces: dict[str, dict[str, Any]] = {}
    for path in paths:
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        for trace in document.get("data") or ():
            _add_trace(traces, trace)
    for trace in traces.values():
        _widen_step_root(trace["spans"])
    return {"data": list(traces.values())}


# the step attribute, and the start of the root's name (_spans/steps.py root_name)
_STEP_ROOT = schema.STEP.name


def _widen_step_root(spans: list[dict[str, Any]]) -> None:
    roots = [s for s in spans if not s.get("references")
             and str(s.get("operationName", "")).startswith(_STEP_ROOT)
             and any(t.get("key") == _STEP_ROOT for t in s.get("tags") or ())]
    if len(roots) != 1 or len(spans) < 2:
        return
    (root,) = roots
    try:
        start = min(int(s["startTime"]) for s in spans)
        end = max(int(s["startTime"]) + int(s.get("duration", 0)) for s in spans)
    except (KeyError, TypeError, ValueError):
        return  # a span without times: the root is left as it was written
    root["startTime"], root["duration"] = start, end - start


def _add_trace(traces: dict[str, dict[str, Any]], trace: dict[str, Any]) -> None:
    trace_id = str(trace.get("traceID", ""))
    merged = traces.setdefault(trace_id, {"traceID": trace_id, "spans": [], "processes": {}})
    processes: dict[str, Any] = merged["processes"]
    by_json = {json.dumps(p, sort_keys=True): pid for pid, p in processes.items()}
    renamed: dict[str, str] = {}
    for pid, process in (trace.get("processes") or {}).items():
        key = json.dumps(process, sort_keys=True)
        new = by_json.get(key)
        if new is None:
            new = by_json[key] = f"p{len(processes) + 1}"
            processes[new] = process
        renamed[pid] = new
    seen = {span.get("spanID") for span in merged["spans"]}
    for span in trace.get("spans") or ():
        if span.get("spanID") in seen:
            continue
        span = dict(span)
        span["processID"] = renamed.get(span.get("processID", ""), span.get("processID", ""))
        merged["spans"].append(span)


def merge_jaeger_json(out: str | os.PathLike[str], paths: Iterable[str | os.PathLike[str]]) -> int:
    """Write the traces of the Jaeger JSON files ``paths`` to ``out`` as one document (for the
    Jaeger UI's "JSON File" upload); returns the number of traces. ``out`` is replaced whole,
    never written through a link (:class:`~attnscope._safe_files.UnsafePath` when one is there)."""
    document = merged_document(list(paths))
    write_text(out, json.dumps(document, separators=(",", ":")))
    return len(document["data"])
