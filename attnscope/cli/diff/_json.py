"""``attnscope diff --json``: the diary as one JSON document, for CI scripts and dashboards.

The same numbers as the table, unrounded: quantiles in the metric's unit (ns, tokens/s, bytes),
changes and interval ends as fractions (``0.12`` is +12%); a value that could not be computed is
``null``, never NaN (which is not JSON).
"""

from __future__ import annotations

import math
from typing import Any

from ._groups import Diary, GroupDiff, Key
from ._stats import Change
from ._text import verdict_text

__all__ = ["to_json"]

_UNITS = {"time": "ns", "tokens_per_s": "tokens/s", "memory": "bytes"}


def _number(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _change(c: Change) -> dict[str, Any]:
    return {"metric": c.metric.name, "unit": _UNITS[c.metric.value],
            "quantile": c.metric.q, "before": _number(c.before), "after": _number(c.after),
            "change": _number(c.change), "interval": [_number(c.low), _number(c.high)],
            "verdict": verdict_text(c), "calls_before": c.n_before, "calls_after": c.n_after}


def _group(g: GroupDiff, failed: set[Key]) -> dict[str, Any]:
    return {"module": g.module, "phase": g.phase, "calls_before": g.calls_before,
            "calls_after": g.calls_after, "clock_before": g.clock_before,
            "clock_after": g.clock_after, "gate_failed": (g.module, g.phase) in failed,
            "metrics": [_change(c) for c in g.changes]}


def _only(keys: list[tuple[Key, int]]) -> list[dict[str, Any]]:
    return [{"module": module, "phase": phase, "calls": n} for (module, phase), n in keys]


def to_json(result: Diary, *, before: str, after: str, limit: float | None,
            failures: list[tuple[GroupDiff, Change]]) -> dict[str, Any]:
    """The document ``--json`` writes. ``limit``: the gate in percent (None: no gate asked)."""
    failed = {(g.module, g.phase) for g, _ in failures}
    return {
        "before": before, "after": after,
        "confidence": result.confidence, "min_change": result.min_change,
        "gate": None if limit is None else {"fail_if_slower": limit / 100,
                                            "passed": not failures},
        "groups": [_group(g, failed) for g in result.groups],
        "only_before": _only(result.only_before), "only_after": _only(result.only_after),
    }
