"""``attnscope diff --append-diary PATH.jsonl``: one comparison as one line of the performance
diary (the format is :mod:`..diary`'s), appended with a single ``write`` on an ``O_APPEND``
descriptor, so two diffs appending to one diary at once give two whole lines, never a mix."""

from __future__ import annotations

import datetime as _dt
import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

from .._errors import CLIError
from ..diary import NOTE_LIMIT, SCHEMA
from ._groups import Diary, GroupDiff, Key, Noise
from ._json import backends_json, number
from ._stats import Change
from ._text import UNJUDGED_EXIT, backend_text, method_note, verdict_text

__all__ = ["note", "entry", "append", "gate_outcome"]

_QUANTILES = ("p50", "p95", "p99")


def note(text: str) -> str:
    """argparse type for ``--diary-note``: what the user changed, at most ``NOTE_LIMIT``
    characters (a diary line stays a line a person can read)."""
    import argparse

    if len(text) > NOTE_LIMIT:
        raise argparse.ArgumentTypeError(f"{len(text)} characters; at most {NOTE_LIMIT}")
    return text


def gate_outcome(limit: float | None, judged: bool, failed: bool) -> str:
    if limit is None:
        return "no gate"
    if not judged:
        return "not judged"
    return "failed" if failed else "passed"


def _metric(c: Change) -> dict[str, Any]:
    return {"before": number(c.before), "after": number(c.after), "change": number(c.change),
            "interval": [number(c.low), number(c.high)], "verdict": verdict_text(c)}


def _group(g: GroupDiff, failed: set[Key]) -> dict[str, Any]:
    times = {c.metric.name: c for c in g.changes if c.metric.value == "time"}
    p50 = g.p50()
    named = bool(g.backends_before.names or g.backends_after.names)
    return {"module": g.module, "phase": g.phase,
            "backend": backend_text(g) if named else None,
            "backends_before": backends_json(g.backends_before),
            "backends_after": backends_json(g.backends_after),
            "calls_before": g.calls_before, "calls_after": g.calls_after,
            "runs_before": g.runs_before, "runs_after": g.runs_after,
            "verdict": verdict_text(p50) if p50 is not None else None,
            "gate_failed": (g.module, g.phase) in failed,
            "time_ns": {q: _metric(times[q]) for q in _QUANTILES if q in times}}


def _noise(floor: Sequence[Noise]) -> list[dict[str, Any]]:
    return [{"module": n.module, "phase": n.phase, "runs": len(n.p50s),
             "p50_per_run": [number(v) for v in n.p50s], "noise_floor": number(n.spread)}
            for n in floor]


def entry(result: Diary, *, note_text: str | None, paths: Sequence[Sequence[str]],
          runs: Sequence[int], info: Sequence[Mapping[str, Any]], limit: float | None,
          judged: bool, failures: list[tuple[GroupDiff, Change]],
          floors: Sequence[list[Noise]], now: _dt.datetime | None = None) -> dict[str, Any]:
    """The diary entry of one comparison (keys in docs/cli.md). ``info``: each side's first
    run's ``runinfo.run_info``; ``floors``: each side's noise floor (empty: one run a side)."""
    when = (now or _dt.datetime.now(_dt.timezone.utc)).astimezone(_dt.timezone.utc)
    failed = {(g.module, g.phase) for g, _ in failures}
    exit_code = (1 if failures else 0) if judged else UNJUDGED_EXIT
    sides = {}
    for i, side in enumerate(("before", "after")):
        sides[side] = {"paths": list(paths[i]), "runs": runs[i], "run_info": dict(info[i]),
                       "noise": _noise(floors[i]) if i < len(floors) and runs[i] > 1 else None}
    return {
        "schema": SCHEMA,
        "date": when.isoformat(timespec="seconds").replace("+00:00", "Z"),
        "note": note_text,
        **sides,
        "method": method_note(result),
        "run_to_run_noise_measured": result.run_level,
        "confidence": result.confidence, "min_change": result.min_change,
        "gate": {"fail_if_slower": None if limit is None else limit / 100,
                 "outcome": gate_outcome(limit, judged, bool(failures)),
                 "exit_code": None if limit is None else exit_code,
                 "failed": sorted(f"{m} ({p})" if p else m for m, p in failed)},
        "groups": [_group(g, failed) for g in result.groups],
        "only_before": [{"module": m, "phase": p, "calls": n}
                        for (m, p), n in result.only_before],
        "only_after": [{"module": m, "phase": p, "calls": n} for (m, p), n in result.only_after],
    }


def append(path: str, document: Mapping[str, Any]) -> None:
    """``document`` as one line at the end of the diary ``path`` (created if missing).

    One ``os.write`` of the whole line on an ``O_APPEND`` descriptor, under an exclusive
    ``flock`` where there is one: concurrent appenders add whole lines, one after the other. A
    file whose last line was left without its newline (edited by hand) gets one first, in the
    same write, so the new entry is never glued onto it; the lock keeps that look from seeing
    another appender's line half written."""
    line = json.dumps(document, separators=(",", ":"), ensure_ascii=False) + "\n"
    data = line.encode("utf-8")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            _lock(fd)  # released by the close
            if _ends_without_newline(path):
                data = b"\n" + data
            written = os.write(fd, data)
        finally:
            os.close(fd)
    except OSError as exc:
        raise CLIError(f"--append-diary {path}: cannot write there "
                       f"({exc.strerror or exc})") from None
    if written != len(data):  # a full disk part-way: say so rather than leave a silent stub
        raise CLIError(f"--append-diary {path}: only {written} of {len(data)} bytes written "
                       "(disk full?); the last line of the diary is incomplete")


def _lock(fd: int) -> None:
    try:
        import fcntl
    except ImportError:  # Windows: O_APPEND alone
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # a filesystem without locks (some network mounts): O_APPEND alone
        pass


def _ends_without_newline(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            if f.tell() == 0:
                return False
            f.seek(-1, os.SEEK_END)
            return f.read(1) != b"\n"
    except OSError:
        return False
