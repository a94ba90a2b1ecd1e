"""Small helpers shared by the tests (not fixtures)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

import attnscope


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


@attnscope.trace
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


@attnscope.trace
def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def traced_spans(spans: list[Any]) -> list[Any]:
    """attnscope's call spans (kernel children carry no tier)."""
    return [s for s in spans if "attnscope.tier" in (s.attributes or {})]


def children_of(spans: list[Any], parent: Any) -> list[Any]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def descendants_of(spans: list[Any], parent: Any) -> list[Any]:
    """Every span below ``parent`` (op spans nest under op spans)."""
    out: list[Any] = []
    todo = [parent]
    while todo:
        kids = children_of(spans, todo.pop())
        out.extend(kids)
        todo.extend(kids)
    return out


def base_name(span: Any) -> str:
    """A span's name without the phase a layer's span name ends with (``"x (decode)"``: ``x``)."""
    name = str(span.name)
    for phase in (" (prefill)", " (decode)"):
        if name.endswith(phase):
            return name[: -len(phase)]
    return name
