"""Figures a device test leaves for ``scripts/gpu_check.py``: one JSON line per measurement.

When ``ATTNSCOPE_DEVICE_FIGURES`` names a file, :func:`record` appends ``{"check": ..., ...}`` to
it; the acceptance run gathers the lines into its one JSON of figures. Unset (the usual test run),
it does nothing. Read at each call: the suite's conftest clears ``ATTNSCOPE_*`` variables before
every test, so the path is taken from the process environment the run started with.
"""

from __future__ import annotations

import json
import os
from typing import Any

__all__ = ["ENV", "record"]

ENV = "ATTNSCOPE_DEVICE_FIGURES"
_AT_START = os.environ.get(ENV)


def record(check: str, **fields: Any) -> None:
    """Append one measurement (plain JSON values) to the figures file, if one is named."""
    path = os.environ.get(ENV) or _AT_START
    if not path:
        return
    with open(path, "a", encoding="utf-8") as out:
        out.write(json.dumps({"check": check, **fields}, default=str) + "\n")
