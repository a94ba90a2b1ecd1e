"""CUDA graphs: the calls captured into a graph, and its replays, sampled like calls.

A decorator does not run when a graph replays: the replay launches the captured kernels and no
Python of the model. So attnscope patches the graph class itself (``torch.cuda.CUDAGraph``, once,
reversibly): ``capture_begin`` makes a :class:`~attnscope._record.graphs.GraphRecord` current for
the capturing thread and sends every call site's next call to :func:`.wrapper.enter`, which keeps
each instrumented call on a capturing stream as a template with an external event pair
(:mod:`.graph_calls`); ``capture_end`` hangs the complete record on the graph; ``replay`` counts
the replay and, when its own call site's countdown runs out, goes through the same
enter → replay → leave as any call, with a pooled event pair around the replay. The worker builds
the replay's span and one child per template (``worker.replays``). ``torch.cuda.graph(...)``,
transformers' and vLLM's captures and torch.compile's cudagraph trees all call these methods.

While a graph captures, every call site's countdown is kept at 1, on every thread (a countdown is
shared by all threads: another thread's draw must not let the capture's next call by): each
call of a site on another thread then pays a decision, by a fresh draw (the sampled share stays
the configured rate; under ``step()`` those draws repeat the step's first one, so consistent
sampling does not hold for them), until the capture ends, when every site draws again
(:meth:`Sampler._invalidate`). Captures are short and happen at warm-up; their cost is the
capture's, never a replay's.
"""

from __future__ import annotations

import functools
import inspect
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import _log
from .. import _schema as schema
from .._record.graphs import GRAPH_KEY, REPLAY_NAME, GraphRecord
from .._runtime import runtime
from . import wrapper as _wrapper
from .sampling import CallSite

__all__ = ["install", "uninstall", "record_of"]

_METHODS = ("capture_begin", "capture_end", "replay")


def install(cls: Any = None) -> bool:
    """Patch ``cls`` (default: ``torch.cuda.CUDAGraph``, when torch is loaded) once; True when
    this call patched it. Never imports torch."""
    if cls is None:
        torch = sys.modules.get("torch")
        cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
        if cls is None:
            return False
    with runtime.graphs.lock:
        if cls in runtime.graphs.hooks:
            return False
        own = {name: cls.__dict__.get(name) for name in _METHODS}
        found = {name: getattr(cls, name) for name in _METHODS}
        runtime.graphs.hooks[cls] = own  # None: inherited, deleted again by uninstall()
        cls.capture_begin = _begin_hook(found["capture_begin"])
        cls.capture_end = _end_hook(found["capture_end"])
        cls.replay = _replay_hook(found["replay"])
    return True


def uninstall(cls: Any = None) -> bool:
    """Put back what :func:`install` replaced on ``cls`` (tests); True when something was."""
    if cls is None:
        torch = sys.modules.get("torch")
        cls = getattr(getattr(torch, "cuda", None), "CUDAGraph", None)
    with runtime.graphs.lock:
        own = runtime.graphs.hooks.pop(cls, None)
        if own is None:
            return False
        for name, method in own.items():
            if method is None:
                delattr(cls, name)
            else:
                setattr(cls, name, method)
    return True


def record_of(graph: Any) -> GraphRecord | None:
    """The record a graph's completed capture left (None: nothing instrumented was captured)."""
    rec: GraphRecord | None = graph.__dict__.get(GRAPH_KEY)
    return rec


# ---- the three patched methods -------------------------------------------------------------------


def _begin_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)  # the user's errors, unchanged; nothing before
        try:
            _began(self)
        except Exception as exc:  # the capture goes on; its calls are not kept
            _log.internal_error("graph-capture", exc)
        return result

    return capture_begin


def _end_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
        ok = False
        try:
            result = original(self, *args, **kwargs)
            ok = True
        finally:  # a failed capture: its record is discarded, and sampling goes back to normal
            try:
                _ended(self, ok)
            except Exception as exc:
                _log.internal_error("graph-capture", exc)
        return result

    return capture_end


def _replay_hook(original: Callable[..., Any]) -> Callable[..., Any]:
    if _takes_self_only(original):  # torch's: packing no arguments is most of a replay's cost
        return _bare_replay_hook(original)

    @functools.wraps(original)
    def replay(self: Any, *args: Any, **kwargs: Any) -> Any:
        rec = self.__dict__.get(GRAPH_KEY)
        if rec is None:  # nothing of ours in this graph
            return original(self, *args, **kwargs)
        rec.generation += 1  # before the launch: the worker's check for an overwritten replay
        site = rec.site
        site.countdown -= 1
        if site.countdown > 0:
            return original(self, *args, **kwargs)
        return _sampled(self, rec, original, args, kwargs)

    return replay


def _bare_replay_hook(original: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """:func:`_replay_hook` for a ``replay(self)``: the same steps, no argument packing (an
    unpatched graph's replay pays ~250 ns for ``*args, **kwargs`` on a CPU, issue 40)."""
    @functools.wraps(original)
    def replay(self: Any) -> Any:
        rec = self.__dict__.get(GRAPH_KEY)
        if rec is None:
            return original(self)
        rec.generation += 1
        site = rec.site
        site.countdown -= 1
        if site.countdown > 0:
            return original(self)
        return _sampled(self, rec, original, (), {})

    return replay


def _takes_self_only(fn: Callable[..., Any]) -> bool:
    try:
        return list(inspect.signature(fn).parameters) == ["self"]
    except (TypeError, ValueError):  # a builtin without a signature: the general hook
        return False


# ---- what they do ----------------------------------------------------------------------------


def _began(graph: Any) -> None:
    graph.__dict__.pop(GRAPH_KEY, None)  # captured again: the old record no longer describes it
    if not runtime.sampler.enabled:
        return
    thread = threading.get_ident()
    rec = GraphRecord(None, thread)
    runtime.graphs.capturing[thread] = rec
    runtime.sampler._invalidate()  # every site's next call enters the wrapper's decision


def _ended(graph: Any, ok: bool) -> None:
    rec = runtime.graphs.capturing.pop(threading.get_ident(), None)
    if rec is None:
        return
    runtime.sampler._invalidate()  # back to countdowns drawn afresh
    if not ok or not rec.templates:
        return
    rec.site = _replay_site(graph)
    rec.complete = True
    graph.__dict__[GRAPH_KEY] = rec


def _replay_site(graph: Any) -> CallSite:
    """The call site a graph's replays are sampled by: one per graph, registered like any."""
    site = CallSite(key=f"{REPLAY_NAME}:{id(graph)}", name=REPLAY_NAME, kind="function")
    site.attributes[schema.CODE_FUNCTION_NAME.name] = f"{type(graph).__qualname__}.replay"
    runtime.sampler.register(site)
    return site


def _sampled(graph: Any, rec: GraphRecord, original: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any]) -> Any:
    """A replay whose countdown ran out: decided and, when sampled, timed like a call."""
    site = rec.site
    active = None
    # One flat try, as wrapper._sampled: a Ctrl-C on any line from enter() on reaches leave()
    try:
        active = _wrapper.enter(site, (), {}, replay=(rec, rec.generation))
        if active is None:
            return original(graph, *args, **kwargs)
        result = original(graph, *args, **kwargs)
    except BaseException as exc:
        if active is not None:
            _wrapper.leave(site, active, exc)
        raise
    else:
        _wrapper.leave(site, active, None, result)
        return result
    finally:
        if active is not None and not active[0].end_perf_ns:
            _wrapper.leave(site, active, sys.exc_info()[1])
