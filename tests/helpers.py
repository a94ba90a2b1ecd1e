"""Small helpers shared by the tests (not fixtures)."""

from __future__ import annotations

from typing import Any

import torch


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def brute_force_flops(b: int, h: int, sq: int, skv: int, d: int, dv: int, causal: bool) -> int:
    """Count unmasked (query, key) pairs from an explicit bottom-right causal mask."""
    if causal:
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(skv).unsqueeze(0)
        pairs = int((j <= i + (skv - sq)).sum())
    else:
        pairs = sq * skv
    return 2 * b * h * pairs * (d + dv)
