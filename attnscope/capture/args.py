"""The argument summary of a sampled call: shapes, dtypes, devices and scalars, never values.

A tensor becomes a :class:`TensorMeta`; a mask tensor is kept by reference so that the worker can
count unpadded tokens later; bools, numbers and None are kept; anything else is dropped.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from .. import _log
from ..record.capture import MASK_NAMES, MAX_EXTRA, MAX_NAME, TensorMeta, attribute_value

__all__ = ["summarize", "tensor_device", "param_names", "attribute_value", "add_attributes",
           "check_attributes"]

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


def check_attributes(attributes: Any, where: str) -> None:
    """``attributes=`` of ``trace``/``span``: None or a mapping of name to value, else a
    ``TypeError`` here, at the call that misused (docs/attributes.md)."""
    if attributes is not None and type(attributes) is not dict \
            and not isinstance(attributes, Mapping):
        raise TypeError(f"{where} needs attributes as a dict of name to value, got "
                        f"{type(attributes).__name__}")


def add_attributes(into: dict[str, Any], attributes: Mapping[Any, Any], prefix: str = "") -> None:
    """User attributes into ``into``: names (``prefix`` + ``str(key)``) cut to ``MAX_NAME``, values
    as :func:`attribute_value`, at most ``MAX_EXTRA`` names. Never raises: one whose own code
    raises (a key's ``__str__``, a value's ``shape``, the mapping's ``items()``) is an internal
    error, left out."""
    try:
        for key, value in attributes.items():
            try:
                name = (prefix + str(key))[:MAX_NAME]
                if name in into or len(into) < MAX_EXTRA:
                    into[name] = attribute_value(value)
            except Exception as exc:
                _log.internal_error("attributes", exc)
    except Exception as exc:
        _log.internal_error("attributes", exc)
