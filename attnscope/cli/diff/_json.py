"""``attnscope diff --json``: the diary as one JSON document, for CI scripts and dashboards.

The same numbers as the table, unrounded: quantiles in the metric's unit (ns, tokens/s, bytes),
changes and interval ends as fractions (``0.12`` is +12%); a value that could not be computed is
``null``, never NaN (which is not JSON). Each group's ``backends``: per side the backends its calls
ran under and the calls with none known; ``text`` as the table shows it (``eager → sdpa``), null
when no call of either side has a known backend.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ._groups import Backends, Diary, GroupDiff, Key, Noise
from ._stats import Change
from ._text import UNJUDGED_EXIT, backend_text, group_label, method_note, verdict_text

__all__ = ["to_json", "noise_json", "backends_json", "number"]

_UNITS = {"time": "ns", "tokens_per_s": "tokens/s", "memory": "bytes"}


def number(value: float) -> float | None:
    """A figure for JSON: ``None`` for NaN and infinities (not JSON)."""
    return value if math.isfinite(value) else None


_number = number


def backends_json(b: Backends) -> dict[str, Any]:
    """One side's backends: calls per backend (most first); calls with none known apart."""
    return {"names": list(b.names), "calls": {name: n for name, n in b.calls},
            "calls_unknown": b.unknown}


def _backends(g: GroupDiff) -> dict[str, Any]:
    names = bool(g.backends_before.names or g.backends_after.names)
    return {"before": backends_json(g.backends_before), "after": backends_json(g.backends_after),
            "text": backend_text(g) if names else None}


def _change(c: Change) -> dict[str, Any]:
    return {"metric": c.metric.name, "unit": _UNITS[c.metric.value],
            "quantile": c.metric.q, "before": _number(c.before), "after": _number(c.after),
            "change": _number(c.change), "interval": [_number(c.low), _number(c.high)],
            "verdict": verdict_text(c), "calls_before": c.n_before, "calls_after": c.n_after,
            "runs_before": [_number(v) for v in c.runs_before],
            "runs_after": [_number(v) for v in c.runs_after]}


def _group(g: GroupDiff, failed: set[Key], unsure: set[Key]) -> dict[str, Any]:
    return {"module": g.module, "phase": g.phase, "calls_before": g.calls_before,
            "calls_after": g.calls_after, "clock_before": g.clock_before,
            "clock_after": g.clock_after, "gate_failed": (g.module, g.phase) in failed,
            "gate_inconclusive": (g.module, g.phase) in unsure,
            "runs_before": g.runs_before, "runs_after": g.runs_after,
            "backends": _backends(g), "metrics": [_change(c) for c in g.changes]}


def _only(keys: list[tuple[Key, int]]) -> list[dict[str, Any]]:
    return [{"module": module, "phase": phase, "calls": n} for (module, phase), n in keys]


def _noise(n: Noise) -> dict[str, Any]:
    return {"module": n.module, "phase": n.phase, "calls": n.calls,
            "p50_per_run": [_number(v) for v in n.p50s], "noise_floor": _number(n.spread)}


def noise_json(label: str, floors: list[Noise]) -> dict[str, Any]:
    """The document ``--noise --json`` writes: each group's per-run p50 (ns) and noise floor."""
    return {"runs_of": label, "noise": [_noise(n) for n in floors]}


def to_json(result: Diary, *, before: str, after: str, limit: float | None,
            failures: list[tuple[GroupDiff, Change]], judged: bool = True,
            noise: Sequence[list[Noise]] = ()) -> dict[str, Any]:
    """The document ``--json`` writes. ``limit``: the gate in percent (None: no gate asked);
    ``judged``: whether it judged (else ``passed`` is null and the exit code 3)."""
    failed = {(g.module, g.phase) for g, _ in failures}
    straddling = ([(g.module, g.phase) for g, _ in result.gate_inconclusive(limit / 100)]
                  if limit is not None and judged else [])  # in the table's order
    unsure = set(straddling)
    gate = None if limit is None else {
        "fail_if_slower": limit / 100, "passed": not failures if judged else None,
        "judged": judged, "exit_code": (1 if failures else 0) if judged else UNJUDGED_EXIT,
        "inconclusive": [group_label(key) for key in straddling]}
    return {
        "before": before, "after": after,
        "runs": {"before": result.runs_before, "after": result.runs_after},
        "method": ("hierarchical bootstrap over runs, then calls"
                   if max(result.runs_before, result.runs_after) > 1 else
                   "bootstrap over calls (one run per side: run-to-run noise unmeasured)"),
        "method_note": method_note(result),
        "run_to_run_noise_measured": result.run_level,
        "confidence": result.confidence, "min_change": result.min_change,
        "gate": gate,
        "noise": {side: [_noise(n) for n in floor]
                  for side, floor in zip(("before", "after"), noise, strict=False)},
        "groups": [_group(g, failed, unsure) for g in result.groups],
        "only_before": _only(result.only_before), "only_after": _only(result.only_after),
    }
