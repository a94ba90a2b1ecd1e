"""The attention implementations ``attnscope compare`` knows, and the user's ``module:function``.

Every implementation is called as ``fn(q, k, v, is_causal=...)`` with ``q`` of shape
``(B, H, S, D)`` and ``k``/``v`` of shape ``(B, H_kv, keys, D)`` (keys: ``--kv-len``, else S):
the shapes the user asked for, so attnscope's spans see the real head counts. Whether one can
run here is decided in two steps: a rule on the device *type* given as data
(:func:`static_reason`, testable without a GPU), then a first call (the probe, in
``_measure``) whose error says the rest.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import math
import os
import sys
from collections.abc import Callable
from typing import Any

import torch

from .._errors import CLIError

__all__ = ["BUILTIN", "SDPA_BACKENDS", "Impl", "static_reason", "resolve", "load_user",
           "naive_attention", "repeat_kv", "build"]

AttentionFn = Callable[..., torch.Tensor]

# name → the SDPBackend member it forces (looked up by name: older torch may lack one)
SDPA_BACKENDS = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
                 "cudnn": "CUDNN_ATTENTION"}
# the order of the report and of the default set
BUILTIN = ("naive", "math", "flash", "efficient", "cudnn", "flex")
_CUDA_ONLY = {"efficient": "SDPA's memory-efficient backend has CUDA kernels only",
              "cudnn": "SDPA's cuDNN backend needs a CUDA device"}
# compiling flex_attention for the CPU took ~18 s on the 2-core machine this was written on
_FLEX_CPU = "compiling it for the CPU takes tens of seconds; ask for it with --impl flex"


@dataclasses.dataclass
class Impl:
    """One implementation to compare: its name, the call, the context it runs in, notes."""

    name: str
    fn: AttentionFn
    user: bool = False
    context: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext
    notes: list[str] = dataclasses.field(default_factory=list)


def static_reason(name: str, device_type: str, requested: bool) -> tuple[str, str] | None:
    """(status, reason) when a built-in implementation is not run on ``device_type``, else None.

    Status ``unavailable`` (it cannot run here) or ``skipped`` (it could, but is left out of the
    default set; ``requested`` — named with ``--impl`` — runs it anyway).
    """
    if name in _CUDA_ONLY and device_type != "cuda":
        return "unavailable", _CUDA_ONLY[name]
    if name in SDPA_BACKENDS and not hasattr(torch.nn.attention.SDPBackend, SDPA_BACKENDS[name]):
        return "unavailable", (f"this torch ({torch.__version__}) has no "
                               f"SDPBackend.{SDPA_BACKENDS[name]}")
    if name == "flex":
        try:
            importlib.import_module("torch.nn.attention.flex_attention")
        except ImportError as exc:
            return "unavailable", f"torch.nn.attention.flex_attention does not import: {exc}"
        if device_type == "cpu" and not requested:
            return "skipped", _FLEX_CPU
    return None


def repeat_kv(t: torch.Tensor, heads: int) -> torch.Tensor:
    """K or V with its heads repeated to ``heads`` (each KV head serves consecutive query heads)."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    is_causal: bool = False) -> torch.Tensor:
    """matmul → softmax → matmul, written out; causal aligned bottom-right, K/V repeated for GQA."""
    k, v = repeat_kv(k, q.shape[1]), repeat_kv(v, q.shape[1])
    scores = q @ k.transpose(-1, -2) * (1.0 / math.sqrt(q.shape[-1]))
    if is_causal:
        sq, skv = q.shape[-2], k.shape[-2]
        keep = torch.ones(sq, skv, dtype=torch.bool, device=q.device).tril(skv - sq)
        scores = scores.masked_fill(~keep, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def _sdpa(name: str, gqa: bool) -> Impl:
    backend = getattr(torch.nn.attention.SDPBackend, SDPA_BACKENDS[name])

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           is_causal: bool = False) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal,
                                                                enable_gqa=gqa)

    def context() -> contextlib.AbstractContextManager[Any]:
        return torch.nn.attention.sdpa_kernel(backend)

    notes = ["GQA through enable_gqa=True"] if gqa else []
    return Impl(name, fn, context=context, notes=notes)


def sdpa_repeating(name: str) -> Impl:
    """An SDPA backend that refused ``enable_gqa``: K/V repeated inside the call (timed with it)."""
    inner = _sdpa(name, gqa=False)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           is_causal: bool = False) -> torch.Tensor:
        heads = q.shape[1]
        return inner.fn(q, repeat_kv(k, heads), repeat_kv(v, heads), is_causal=is_causal)

    return Impl(name, fn, context=inner.context,
                notes=["no kernel with enable_gqa: K/V repeated to H heads inside the call"])


def _flex(shape: tuple[int, int, int, int], device: torch.device, causal: bool, gqa: bool,
          keys: int) -> Impl:
    from torch.nn.attention import flex_attention as flex

    block_mask = None
    if causal:  # made once, outside the timed calls, as a model would
        def causal_mod(b: Any, h: Any, q_idx: Any, kv_idx: Any) -> Any:
            return q_idx >= kv_idx

        block_mask = flex.create_block_mask(causal_mod, None, None, shape[2], keys,
                                            device=str(device))
    compiled = torch.compile(flex.flex_attention)

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
           is_causal: bool = False) -> torch.Tensor:
        out: torch.Tensor = compiled(q, k, v, block_mask=block_mask, enable_gqa=gqa)
        return out

    notes = ["torch.compile(flex_attention); compiled on the first (warm-up) call"]
    return Impl("flex", fn, notes=notes + (["causal as a BlockMask"] if causal else []))


def build(name: str, shape: tuple[int, int, int, int], kv_heads: int, device: torch.device,
          causal: bool, keys: int | None = None) -> Impl:
    """A built-in implementation for these inputs (``keys``: per sequence, when not S; causal
    only where they are S, so top-left and bottom-right alignment agree)."""
    gqa = kv_heads != shape[1]
    if name == "naive":
        notes = ["K/V repeated to H heads inside the call"] if gqa else []
        return Impl("naive", naive_attention, notes=notes)
    if name == "flex":
        return _flex(shape, device, causal, gqa, shape[2] if keys is None else keys)
    return _sdpa(name, gqa)


def load_user(spec: str) -> Impl:
    """``module:function`` → an implementation; a bad spec or import is a :class:`CLIError`."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise CLIError(f"unknown implementation {spec!r}: expected one of {', '.join(BUILTIN)} "
                       "or module:function")
    if os.getcwd() not in sys.path:  # as `python -m` would: modules next to the user first
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the user's module: any error it raises on import
        raise CLIError(f"cannot import {module_name!r} for {spec!r}: "
                       f"{type(exc).__name__}: {_one_line(exc)}") from None
    fn = module
    for part in attr.split("."):
        if not hasattr(fn, part):
            raise CLIError(f"module {module_name!r} has no {attr!r} (for {spec!r})")
        fn = getattr(fn, part)
    if not callable(fn):
        raise CLIError(f"{spec!r} is not callable")
    return Impl(spec, fn, user=True)


def resolve(names: list[str]) -> list[tuple[str, bool]]:
    """``--impl`` values (repeated or comma-separated) → [(name, requested)] in report order.

    Nothing given: every built-in, not requested. Unknown names without a colon are errors.
    """
    given = [n.strip() for value in names for n in value.split(",") if n.strip()]
    if not given:
        return [(name, False) for name in BUILTIN]
    out: list[tuple[str, bool]] = []
    for name in given:
        if name not in BUILTIN and ":" not in name:
            raise CLIError(f"unknown implementation {name!r}: expected one of "
                           f"{', '.join(BUILTIN)} or module:function")
        if (name, True) not in out:
            out.append((name, True))
    return out


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else ""
