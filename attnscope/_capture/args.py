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
from .._record.capture import MASK_NAMES, MAX_EXTRA, MAX_NAME, TensorMeta, attribute_value

__all__ = ["summarize", "summarize_flat", "tensor_device", "param_names", "attribute_value",
           "add_attributes", "check_attributes"]

_MAX_POSITIONAL = 8
_Tensor = torch.Tensor
_Meta = TensorMeta
_meta_new = tuple.__new__  # TensorMeta(...) without NamedTuple's __new__ wrapper
_SCALARS = (bool, int, float)


def summarize(args: Sequence[Any], kwargs: Mapping[str, Any],
              names: Sequence[str]) -> list[tuple[str, Any]]:
    """``(name, value)`` pairs for the worker, cheap enough for the calling thread.

    One loop, no call per argument: it was half of a timed call's own time (three tensors: 4.2
    µs of thread CPU through a helper and :meth:`TensorMeta.of` each, 2.7 µs inline, on a loaded
    2-core machine; ``benchmarks/bench_hotpath.py``)."""
    out: list[tuple[str, Any]] = []
    n = len(names)
    i = 0
    for value in args[:_MAX_POSITIONAL] if len(args) > _MAX_POSITIONAL else args:
        if isinstance(value, _Tensor):
            key = names[i] if i < n else f"arg{i}"
            # a nested tensor's shape is () (TensorMeta.of); built without the classmethod
            out.append((key, value if key in MASK_NAMES else _meta_new(_Meta, (
                () if value.is_nested else value.shape, value.dtype, value.device))))
        elif value is None or isinstance(value, _SCALARS):
            out.append((names[i] if i < n else f"arg{i}", value))
        i += 1
    if kwargs:
        for key, value in kwargs.items():
            if isinstance(value, _Tensor):
                out.append((key, value if key in MASK_NAMES else _meta_new(_Meta, (
                    () if value.is_nested else value.shape, value.dtype, value.device))))
            elif value is None or isinstance(value, _SCALARS):
                out.append((key, value))
    return out


def summarize_flat(args: Sequence[Any], kwargs: Mapping[str, Any],
                   names: Sequence[str]) -> tuple[list[Any], Any, bool]:
    """:func:`summarize`'s summary flat (``capture.expand_summary`` makes the pairs), with the
    device of its first tensor and whether it holds a tensor by reference (a mask).

    A traced call's summary, made this way on the calling thread: no pair or
    :class:`TensorMeta` per argument. Those were 6 of the 11 objects a sampled call of three
    tensors left for the garbage collector, ~1 µs of the call's thread CPU with its collections
    (``benchmarks/bench_hotpath.py``)."""
    out: list[Any] = []
    device = None
    held = False
    n = len(names)
    i = 0
    for value in args[:_MAX_POSITIONAL] if len(args) > _MAX_POSITIONAL else args:
        if isinstance(value, _Tensor):
            key = names[i] if i < n else f"arg{i}"
            if key in MASK_NAMES:
                out += (key, value, None, None)
                held = True
                if device is None:
                    device = value.device
            else:
                on = value.device
                # a nested tensor's shape is () (TensorMeta.of)
                out += (key, () if value.is_nested else value.shape, value.dtype, on)
                if device is None:
                    device = on
        elif value is None or isinstance(value, _SCALARS):
            out += (names[i] if i < n else f"arg{i}", value, None, None)
        i += 1
    if kwargs:
        for key, value in kwargs.items():
            if isinstance(value, _Tensor):
                if key in MASK_NAMES:
                    out += (key, value, None, None)
                    held = True
                    if device is None:
                        device = value.device
                else:
                    on = value.device
                    out += (key, () if value.is_nested else value.shape, value.dtype, on)
                    if device is None:
                        device = on
            elif value is None or isinstance(value, _SCALARS):
                out += (key, value, None, None)
    return out, device, held


def tensor_device(args: Sequence[Any], kwargs: Mapping[str, Any], first: int = 0) -> Any:
    """The device of the first tensor argument, without summarising the others; positional
    arguments from ``first`` on (a method's instance is no tensor: ``isinstance`` on a module
    goes through torch's ``__instancecheck__``)."""
    for value in args[first:_MAX_POSITIONAL]:
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
