"""The argument summary of a sampled call: shapes, dtypes, devices and scalars, never values.

A tensor becomes a :class:`TensorMeta`; a mask tensor is kept by reference so that the worker can
count unpadded tokens later; bools, numbers and None are kept; anything else is dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .record import MASK_NAMES, TensorMeta

__all__ = ["summarize", "tensor_device", "param_names", "attribute_value"]

_MAX_POSITIONAL = 8
_Tensor = torch.Tensor


def summarize(args: Sequence[Any], kwargs: Mapping[str, Any],
              names: Sequence[str]) -> list[tuple[str, Any]]:
    """``(name, value)`` pairs for the worker, cheap enough for the calling thread."""
    out: list[tuple[str, Any]] = []
    n = len(names)
    for i, value in enumerate(args[:_MAX_POSITIONAL]):
        _add(out, names[i] if i < n else f"arg{i}", value)
    for key, value in kwargs.items():
        _add(out, key, value)
    return out


def _add(out: list[tuple[str, Any]], key: str, value: Any) -> None:
    if isinstance(value, _Tensor):
        out.append((key, value if key in MASK_NAMES else TensorMeta.of(value)))
    elif value is None or isinstance(value, (bool, int, float)):
        out.append((key, value))


def tensor_device(args: Sequence[Any], kwargs: Mapping[str, Any]) -> Any:
    """The device of the first tensor argument, without summarising the others."""
    for value in args[:_MAX_POSITIONAL]:
        if isinstance(value, _Tensor):
            return value.device
    for value in kwargs.values():
        if isinstance(value, _Tensor):
            return value.device
    return None


def param_names(fn: Callable[..., Any], self_first: bool = False,
                bound: bool = False) -> tuple[str, ...]:
    """Positional parameter names of ``fn``.

    ``self_first``: the names as the instance's method sees its arguments, ``self`` first (added
    when ``fn`` is ``bound`` or does not name it).
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        names: tuple[str, ...] = ()
    else:
        names = tuple(p.name for p in params
                      if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD))
    if self_first and (bound or names[:1] != ("self",)):
        return ("self", *names)
    return names


def attribute_value(value: Any) -> Any:
    """A user-given attribute value as attnscope keeps it: a tensor or array (anything with a
    shape and a dtype) as a description of both, never its values, nor a reference to it."""
    if isinstance(value, (str, bool, int, float)) or value is None:
        return value
    if isinstance(value, (list, tuple)):
        return [attribute_value(v) for v in value[:64]]
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        try:
            shape = tuple(int(n) for n in value.shape)
        except Exception:  # nested / jagged tensors: no single shape
            shape = None
        kind = type(value).__name__
        dtype = str(value.dtype).removeprefix("torch.")
        return f"{kind}(shape={shape}, dtype={dtype})" if shape is not None else f"{kind}(dtype={dtype})"
    return value
