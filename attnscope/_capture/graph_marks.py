"""Traced calls inside torch.compile'd code: marks that CUDA graphs of compiled code capture.

Under ``torch.compile`` the wrappers' Python does not run when the compiled code does, so a
CUDA graph that cudagraph trees (``mode="reduce-overhead"``) capture from it would hold no
traced call. With ``compiled_graph_marks`` on (off by default: outside a capture each mark
still costs a few µs of host time per call and step, not yet measured on a GPU), while Dynamo
traces a wrapped call whose tensors are CUDA, :func:`traced_call` puts one custom op before the
call and one after it into the compiled graph
(``attnscope::graph_mark``, registered as an ordered side effect so that no pass drops or swaps
them; they read the call's inputs and its outputs, so the first runs once the inputs exist and
the second once the outputs do; they change no value). On CPU tensors nothing is added. What
orders the call's own kernels between them is only inductor keeping the graph's order for
kernels it does not fuse: a pointwise first step of the call (a scaling of q) that inductor
fuses into the kernel making its input runs before the begin mark.

What the marks cannot carry (the module of an instrumented layer, ``is_causal``) is noted once
while Dynamo traces (``_note``, its number a constant of the graph), so the template's facts
are those a hand-captured call has; numbers are not noted (see :func:`_constant`).

When the compiled code runs, a mark does nothing unless its thread captures a CUDA graph
(:mod:`.graphs`) on a capturing stream: a warm-up run or ``mode="default"`` pays one Python op
call and a dict test per mark. During a capture the begin mark opens a template of the graph
(:mod:`.graph_calls`, its external event pair recorded into the graph) and the end mark closes
it, so replays of compiled graphs are sampled and shown as those of graphs captured by hand.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_leaves as _leaves

from .. import _log
from .._record.capture import Capture
from .._runtime import runtime
from . import args as _args
from . import device as _device
from . import graph_calls as _graph_calls
from .sampling import CallSite

__all__ = ["define", "number", "traced_call", "OP_NAME", "BEGIN", "END"]

OP_NAME = "attnscope::graph_mark"
SCHEMA = "(Tensor[] tensors, int call, int which) -> ()"
BEGIN, END = 0, 1
# Test seam: Dynamo marks calls on CPU tensors as if they were CUDA ones (read while tracing)
AS_CUDA = False
# Marked calls kept per process (one per traced call site, module and constants; a recompile of
# the same call reuses its number): calls past it run in compiled graphs untimed
MAX_CALLS = 4096


def number(site: CallSite) -> int:
    """The number a wrapper's marks carry for ``site`` (taken at wrap time, outside Dynamo)."""
    no = id(site)  # unique while the site lives; the entry goes with it
    runtime.graphs.mark_sites[no] = site
    return no


def define() -> bool:
    """Define the mark op once (when Dynamo loads: never while it traces). False: not there.

    A ``torch.library.Library`` kernel rather than ``custom_op``: a mark outside a capture is
    a dispatcher call to a Python function, 3.1 µs against custom_op's 14.3 µs on a loaded
    2-core CPU (torch.add of 4 floats: 1.6 µs), paid twice per marked call wherever compiled
    code runs without a capture."""
    if runtime.graphs.mark_op is not None:
        return True
    try:
        from torch._library.effects import EffectType

        untyped: Any = torch.library.Library  # torch's Library methods carry no annotations
        lib = untyped(OP_NAME.split("::")[0], "DEF")
        lib.define(OP_NAME.split("::")[1] + SCHEMA)
        lib.impl("graph_mark", _mark, "CompositeExplicitAutograd")
        torch.library.register_fake(OP_NAME, _fake, lib=lib)
        # an ordered effect: kept though it returns nothing, never reordered against another
        torch.library._register_effectful_op(OP_NAME, EffectType.ORDERED, lib=lib)
        # Dynamo calls _note while tracing instead of tracing into it, and puts its result in
        # the graph; marked here, once Dynamo is loaded: torch.compiler's decorator imports it
        torch.compiler.assume_constant_result(_note)  # type: ignore[no-untyped-call]
        runtime.graphs.mark_op = lib  # the library keeps the op registered
    except Exception as exc:  # compiled code is traced as before: call through, no marks
        _log.internal_error("graph-mark", exc)
        return False
    return True


def traced_call(no: int, names: tuple[str, ...], fn: Callable[..., Any], args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)`` as Dynamo traces it, between two marks when its first tensor is
    CUDA. ``no``: the site's number (:func:`number`); ``names``: its parameter names."""
    if runtime.graphs.mark_op is None or not runtime.sampler.graph_marks:
        return fn(*args, **kwargs)  # off (the default): Dynamo traces nothing of ours
    tensors, keys, scalars = _split(args, kwargs, names)
    if not tensors or (tensors[0].device.type != "cuda" and not AS_CUDA):
        return fn(*args, **kwargs)
    instance = args[0] if args and isinstance(args[0], torch.nn.Module) else None
    call = _note(no, instance, tuple(keys), tuple(scalars))  # a constant of the graph
    mark = torch.ops.attnscope.graph_mark.default
    mark(tensors, call, BEGIN)
    result = fn(*args, **kwargs)
    # every tensor of the result (a tuple, a dict, a ModelOutput): the end mark runs after all;
    # with none, after the inputs at least
    out = [t for t in _leaves(result) if isinstance(t, torch.Tensor)] or tensors
    mark(out, call, END)
    return result


def _split(args: tuple[Any, ...], kwargs: dict[str, Any], names: tuple[str, ...]
           ) -> tuple[list[torch.Tensor], list[str], list[tuple[str, Any]]]:
    """The tensors, their parameter names, and the plain constants (is_causal) among the
    arguments: what the extractor reads besides the module."""
    tensors: list[torch.Tensor] = []
    keys: list[str] = []
    scalars: list[tuple[str, Any]] = []
    items = [(names[i] if i < len(names) else f"arg{i}", v) for i, v in enumerate(args)]
    for key, value in items + list(kwargs.items()):
        if isinstance(value, torch.Tensor):
            tensors.append(value)
            keys.append(key)
        elif _constant(value):
            scalars.append((key, value))
    return tensors, keys, scalars


def _constant(value: Any) -> bool:
    """None, a bool or a str, as Dynamo evaluates the test. Numbers are left out: under dynamic
    shapes an int or a float may be a SymInt or SymFloat that Dynamo's ``type()`` calls int or
    float, and ``_note`` could not take it (a graph break in the user's code); a SymBool is
    never ``True`` itself."""
    return value is None or value is True or value is False or type(value) is str


def _note(no: int, instance: Any, keys: tuple[str, ...], scalars: tuple[tuple[str, Any], ...]
          ) -> int:
    """Run once while Dynamo traces (its result is a constant of the graph): the call's facts
    that are no tensor, kept for the marks under the number returned (0: not kept). Never
    raises: an exception here would be the user's compile failing."""
    try:
        calls = runtime.graphs.mark_calls
        key = (no, None if instance is None else id(instance), keys, scalars)
        for call, (facts, ref) in calls.items():  # a recompile of the same call: its number
            if facts == key and (ref is None or ref() is instance):
                return call
        if len(calls) >= MAX_CALLS:
            return 0
        call = len(calls) + 1
        calls[call] = (key, None if instance is None else weakref.ref(instance))
        return call
    except Exception as exc:  # number 0: the call runs in the graph untimed
        _log.internal_error("graph-mark", exc)
        return 0


def _fake(tensors: list[torch.Tensor], call: int, which: int) -> None:
    return None


def _mark(tensors: list[torch.Tensor], call: int, which: int) -> None:
    """The mark as compiled code runs it: nothing unless this thread captures a CUDA graph."""
    capturing = runtime.graphs.capturing
    if not capturing:  # a warm-up run, mode="default", eager replays of inductor's code
        return
    try:
        rec = capturing.get(threading.get_ident())
        if rec is None:
            return
        if which == BEGIN:  # pushed even when not kept: the end mark pops its own begin's
            rec.marks.append(_begin(rec, tensors, call))
        elif rec.marks:
            cap = rec.marks.pop()
            if cap is not None:
                _graph_calls.close_template(cap, None)
    except Exception as exc:  # the call runs in the graph untimed
        _log.internal_error("graph-mark", exc)


def _begin(rec: Any, tensors: list[torch.Tensor], call: int) -> Capture | None:
    """The begin mark during a capture: a template opened for the graph (None: not kept)."""
    facts = runtime.graphs.mark_calls.get(call)
    if facts is None:
        return None
    (no, _, keys, scalars), ref = facts
    site = runtime.graphs.mark_sites.get(no)
    kwargs: dict[str, Any] = dict(scalars)
    kwargs.update(zip(keys, tensors, strict=False))
    device = _args.tensor_device((), kwargs)
    if site is None or device is None or device.type != "cuda" \
            or not _device.stream_capturing(device):
        return None
    instance = None if ref is None else ref()
    if site.kind == "method" and instance is None:  # its extractor would miss the module
        args: tuple[Any, ...] = ()
        extract = False
    else:
        args, extract = (() if instance is None else (instance,)), True
    # nesting among compiled calls only: an eager span around the compiled code is no call of
    # the graph (open_template keeps a parent only when it is one)
    outer = next((c for c in reversed(rec.marks) if c is not None), None)
    cap = Capture()
    _graph_calls.open_template(cap, rec, site, args, kwargs, None, device,
                               None if outer is None else outer.capture_id, extract=extract)
    return cap
