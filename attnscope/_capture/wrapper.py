"""The one fast path every traced call runs through, and the one enter → call → close around it.

The unsampled path is a countdown decrement and a compare. A call whose countdown ran out enters
:func:`enter`, which decides a tier and, when sampled, opens a :class:`Capture` (shapes, clocks,
CUDA events, a profiler session); the user's call runs outside every attnscope guard; then
:func:`leave` closes the capture and hands it to the worker. ``trace`` on functions, methods and
async functions, ``span()`` blocks, instrumented forwards and ``generate`` all use these two;
their differences are parameters of the call site (an extractor, an ``on_result`` hook).
"""

from __future__ import annotations

import contextvars
import functools
import importlib
import inspect
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

from .. import _log
from .. import _schema as schema
from .._record.capture import (
    MAX_NAME,
    NO_FACTS,
    TIER_NONE,
    TIER_PROFILE,
    TIER_TIMING,
    Capture,
    error_info,
    next_id,
)
from .._runtime import runtime
from . import args as _args
from . import autocast as _autocast
from . import backward as _backward
from . import batch as _batch
from . import compile as _compile
from . import decision as _decision
from . import device as _device
from . import grants as _grants
from . import graph_calls as _graph_calls
from . import graph_marks as _graph_marks
from . import hostread as _hostread
from . import inner_sdpa as _inner_sdpa
from . import profiler_session as _profiler
from . import retain as _retain
from . import sampling as _sampling
from .sampling import CallSite

__all__ = ["current", "enter", "leave", "make_site", "wrap"]

F = TypeVar("F", bound=Callable[..., Any])
Active = tuple[Capture, "contextvars.Token[int | None]", int]

_perf_ns = time.perf_counter_ns
_any_autocast = _autocast.ANY_ON
_graph_task = _backward.task
# Clock pairs read further apart than this (the thread was preempted) are read again, this often
_CLOCK_GAP_NS, _CLOCK_TRIES = 20_000, 3
# A context key, not process state: the innermost sampled call, so children know their parent.
current: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "attnscope_current_capture", default=None
)


def make_site(fn: Callable[..., Any], name: str | None, sample_rate: float | None,
              attributes: dict[str, Any] | None, kind: str | None = None,
              param_names: tuple[str, ...] | None = None, key: str | None = None) -> CallSite:
    """A registered call site for ``fn`` (kind "method" when its first parameter is ``self``)."""
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    names = _args.param_names(fn) if param_names is None else param_names
    if kind is None:
        kind = "method" if names[:1] == ("self",) else "function"
    if name is not None:
        name = name[:MAX_NAME]
    site = CallSite(
        key=key or f"{getattr(fn, '__module__', '')}.{qualname}:{name or ''}",
        name=name or str(qualname)[:MAX_NAME],
        forced_rate=sample_rate,
        attributes={},
        param_names=names,
        kind=kind,
    )
    if attributes is not None:
        _args.add_attributes(site.attributes, attributes)
    site.attributes.setdefault(schema.CODE_FUNCTION_NAME.name, qualname)
    runtime.sampler.register(site)
    if not runtime.graphs.hooks and "torch" in sys.modules:
        _install_graph_hooks()
    return site


def _install_graph_hooks() -> None:
    """CUDA graphs' capture and replay patched (capture.graphs), once torch is loaded: by name,
    as that module calls enter() and leave()."""
    try:
        importlib.import_module(__package__ + ".graphs").install()
    except Exception as exc:  # graphs stay invisible; calls are traced as before
        runtime.graphs.hooks[object] = {}  # tried: not again on every call
        _log.internal_error("graph-hooks", exc)


# ---- enter / leave: the sampled path ------------------------------------------------------------


def enter(site: CallSite, args: tuple[Any, ...], kwargs: dict[str, Any],
          forced: bool | None = None, extra: dict[str, Any] | None = None,
          replay: tuple[Any, int] | None = None, checked: bool = False) -> Active | None:
    """Decide and, when sampled, open a capture and make it current. None: call through.

    ``replay``: (record, generation) of a CUDA graph replay (capture.graphs), timed on the
    graph's device. ``checked``: the wrapper asked ``is_compiling()`` already (a call less on
    an instrumented layer's sampled path). Never raises but a Ctrl-C landing in it, which it
    lets through with nothing left open: an internal error is counted against the site and the
    call goes through.
    """
    t_enter = _perf_ns()
    cap = None
    try:
        if not checked and runtime.dynamo.loaded and _compile.is_compiling():
            site.countdown = 1  # decide again on the next eager call
            _compile.register_pending()
            return None
        capturing = runtime.graphs.capturing
        if capturing:  # a CUDA graph captures somewhere: the countdown did not bring us here
            cap = _graph_call(site, args, kwargs, extra, capturing)
            if cap is not None:
                return cap, current.set(cap.capture_id), t_enter
        # a slow-call grant comes back unsettled: _open settles it on the call's shapes
        tier, rate, grant = _decision.decide(runtime.sampler, runtime.grants, site, forced)
        if capturing:  # a draw above must not let the capture's next call of this site by
            site.countdown = 1
        if tier == TIER_NONE and grant is None:
            return None
        cap = Capture()
        if not _open(cap, site, tier, rate, args, kwargs, extra, grant, replay):
            return None
        return cap, current.set(cap.capture_id), t_enter
    except Exception as exc:
        if cap is not None:
            _abandon(cap)
        _site_error(site, "capture", exc)
        return None
    except BaseException:  # Ctrl-C in attnscope's own code: the call never ran
        if cap is not None:
            if current.get() == cap.capture_id:  # a signal right after set(), token unstored
                current.set(cap.parent_id)
            _abandon(cap)
        raise


def leave(site: CallSite, active: Active, error: BaseException | None, result: Any = None) -> None:
    """Close the capture right after the user's call and hand it to the worker.

    Never raises but a Ctrl-C landing in it, which it lets through once no session is open, the
    capture is no longer current and it is handed over. Runs once per capture: a second call
    returns at once, so callers call it again in a ``finally``, for a Ctrl-C that landed before
    its first line.
    """
    cap, token, t_enter = active
    if cap.end_perf_ns:  # left already
        return
    try:  # no try nested in this one: a nested try's first line is outside its handlers
        cap.end_perf_ns = _perf_ns()
        _reset_current(token)
        if cap.graph is not None:  # captured into a CUDA graph: its replays carry it
            _graph_calls.close_template(cap, error)
            return
        # the usual timed CPU call has nothing of _end's to do: no call for it
        if cap.timer is not None or cap.profile is not None or cap.memory is not None \
                or error is not None or site.on_result is not None:
            _end(site, cap, error, result)
        profiler = runtime.profiler
        if profiler.active is not None and cap.tier != TIER_PROFILE:  # an enclosing call's
            cap.in_profile = profiler.owner == threading.get_ident()  # session ran over it
        starting = runtime.worker.current is None
        t_submit = _perf_ns() if starting else 0
        block = cap.batch
        if block is not None:
            block.sampled += 1
        if not runtime.worker.submit(cap):
            _lost(cap)
        budget = runtime.sampler.budget
        if budget.budget < 1.0:  # 1.0: no budget (add() would return at once)
            t_done = _perf_ns()
            own = (cap.start_perf_ns - t_enter) + (t_done - cap.end_perf_ns)
            if starting:  # starting the worker (imports, a thread) is paid once, not per call
                own -= t_done - t_submit
            budget.add(own, cap.end_perf_ns - cap.start_perf_ns, cap.sample_rate or 1.0,
                       cap.tier == TIER_PROFILE)
    except Exception as exc:
        if not cap.counted:
            _retain.release(cap)
        _site_error(site, "capture-end", exc)
    except BaseException:  # Ctrl-C in attnscope's own code: close what is open, let it through
        _unwind(cap, token)
        raise


def _graph_call(site: CallSite, args: tuple[Any, ...], kwargs: dict[str, Any],
                extra: dict[str, Any] | None, capturing: dict[int, Any]) -> Capture | None:
    """A call made while a CUDA graph captures: on the capturing thread and a capturing stream,
    a template of the graph's calls (capture.graph_calls), never sampled; else None, and the
    call is decided as usual, by a draw of its own (as after a change of settings)."""
    site.gen = -1
    rec = capturing.get(threading.get_ident())
    if rec is None:
        return None
    site.countdown = 1  # every call of the capture comes here
    device = _args.tensor_device(args, kwargs)
    if device is None or device.type != "cuda" or not _device.stream_capturing(device):
        return None
    cap = Capture()
    _graph_calls.open_template(cap, rec, site, args, kwargs, extra, device, current.get())
    return cap


def _reset_current(token: contextvars.Token[int | None]) -> None:
    try:
        current.reset(token)
    except Exception as exc:  # token from another context (a generator resumed elsewhere)
        _log.internal_error("context", exc)


def _end(site: CallSite, cap: Capture, error: BaseException | None, result: Any) -> None:
    """The call's end: clocks, profiler session, memory, error, the site's result hook."""
    if cap.timer is not None:
        cap.timer.record_end()
    if cap.profile is not None:
        _profiler.stop(cap.profile)
    if cap.memory is not None:
        _device.memory_after(cap.memory)
    if error is not None:
        cap.error = error_info(error)
    if error is None and site.on_result is not None:
        try:
            site.on_result(cap, result)
        except Exception as exc:  # the span still goes out, without what the hook adds
            _log.internal_error("on-result", exc)
    if cap.timer is not None:
        _device_counts(cap)


def _lost(cap: Capture) -> None:
    """A capture the worker did not take: its tensors go back, its block counts it lost."""
    _retain.release(cap)
    if cap.batch is not None:
        cap.batch.lost += 1


def _unwind(cap: Capture, token: contextvars.Token[int | None]) -> None:
    """After a Ctrl-C inside :func:`leave`: the capture stops being current, its session ends,
    and it is handed over unless a worker counted it already (children handed over wait for
    it)."""
    if not cap.end_perf_ns:
        cap.end_perf_ns = _perf_ns()
    try:
        if current.get() == cap.capture_id:
            current.reset(token)
    except Exception:  # noqa: BLE001  (reset already, in this context or another)
        pass
    try:
        if cap.profile is not None:
            _profiler.stop(cap.profile)  # a no-op unless it runs
    finally:
        if not cap.counted:
            try:
                if not runtime.worker.submit(cap):
                    _lost(cap)
            except Exception as exc:
                _retain.release(cap)
                _log.internal_error("capture-end", exc)


def _open(cap: Capture, site: CallSite, tier: int, rate: float, args: tuple[Any, ...],
          kwargs: dict[str, Any], extra: dict[str, Any] | None, grant: Any = None,
          replay: tuple[Any, int] | None = None) -> bool:
    """Fill ``cap`` for a sampled call and start its clocks; False: call through uncaptured.
    Whatever it opened, :func:`_abandon` closes (the caller's, on any exception)."""
    cap.capture_id = next_id()
    cap.parent_id = current.get()
    if runtime.graphs.capturing:  # not under a call kept for a graph: that one is never a span
        cap.parent_id = _graph_calls.real_parent(cap.parent_id)
    cap.batch = _batch.rows_var.get()  # the one read of batch() rows, on the sampled path only
    cap.site, cap.name, cap.sample_rate, cap.extra = site, site.name, rate, extra
    sampler = runtime.sampler
    cap.step_no = sampler.step_no
    # usually kept from the decision's parent step
    cap.otel_parent = _sampling.parent_context(sampler)
    first = 1 if site.kind == "method" and args else 0  # a method's instance: no tensor
    if first:
        cap.instance = args[0]
    extractor = site.extractor
    if replay is not None or extractor is not None:
        # instrument(): the extractor's facts stand in for the generic summary; a replay has no
        # tensor arguments: its events go on the graph's device
        keeps = True  # facts may hold a mask for keep_summary to weigh
        device = _args.tensor_device(args, kwargs, first) if replay is None else replay[0].device
    else:  # the device from the summary's own reads: no second pass over the arguments
        cap.flat_summary, device, keeps = _args.summarize_flat(args, kwargs, site.param_names)
        if keeps:  # a mask, weighed against the budget (and copied on CUDA) here: pairs now
            cap.expand()  # else the worker makes them
    cap.replay = replay
    if _any_autocast():  # ~70 ns: the one check on a call with autocast off
        cap.autocast = _autocast.dtype_for(device)  # its matmuls' dtype: the roofline's peak
    cap.recompute = _graph_task() != -1  # in a backward pass: a forward checkpointing recomputes
    cuda = device is not None and device.type == "cuda"
    if cuda:
        # The tensor's device's stream, where the events go: during CUDA-graph capture events,
        # allocator queries and any device read would be recorded into the graph.
        if _device.stream_capturing(device):
            return False
        cap.memory = _device.memory_before(device, sampler.reset_peak)
    if extractor is not None:  # after the capture check: it may read a device tensor
        try:
            cap.facts = extractor(cap.instance, args, kwargs) or NO_FACTS
        except Exception as exc:  # the span goes out without the facts; the site counts the error
            _site_error(site, "extract", exc)
        if cap.facts is NO_FACTS:  # nothing it recognised: the arguments' shapes, as for @trace
            cap.summary.extend(_args.summarize(args, kwargs, site.param_names))
    if grant is not None:
        cap.expand()
        tier, cap.grant = _grants.settle(runtime.grants, sampler, site, grant, cap.summary,
                                         tier, cap.facts)
        if tier == TIER_NONE:  # an armed call outside the slow call's bucket: call through
            return False  # no CUDA event was taken for it
    if cuda:  # after the grant is settled: events only for a call that is captured
        cap.timer = _event_timer(device)
    if tier == TIER_PROFILE:
        tier = _start_profile(cap, site, device, args, kwargs)
    cap.tier = tier
    if cap.timer is not None:
        cap.timer.record_start()
    if keeps or cap.facts is not NO_FACTS:  # a traced call of shapes, scalars: nothing kept
        _retain.keep_summary(cap)  # last: a capture given up before this holds no budget
    # Both clocks back to back: the span ends at start_epoch + wall, and a gap between the
    # two reads would end it early (a profiled call's last operators fell outside its span).
    # A thread preempted between them (ms on a loaded machine: a layer's k, v and o
    # projections were left on its parent) reads both again.
    before = _perf_ns()
    cap.start_epoch_ns = time.time_ns()
    cap.start_perf_ns = _perf_ns()
    if cap.start_perf_ns - before > _CLOCK_GAP_NS:
        _clocks_again(cap)
    return True


def _start_profile(cap: Capture, site: CallSite, device: Any, args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> int:
    """The profiler session of a profile-tier call; the tier it gets (timing when the profiler
    refuses)."""
    if not _profiler.start(cap, device):
        return TIER_TIMING
    try:  # once the session is open: its release undoes it
        # default: the SDPA call inside, for its fallback verdict (capture.inner_sdpa)
        cap.sdpa = (site.on_profile or _inner_sdpa.arm)(args, kwargs)
    except Exception as exc:  # the profile goes on without those facts
        _site_error(site, "extract", exc)
    return TIER_PROFILE


def _clocks_again(cap: Capture) -> None:
    """:func:`_open`'s two clocks read again, after a thread preempted between them (up to
    ``_CLOCK_TRIES`` reads in all); the first read is inline, as nearly every call needs no more."""
    for _ in range(_CLOCK_TRIES - 1):
        before = _perf_ns()
        cap.start_epoch_ns = time.time_ns()
        cap.start_perf_ns = _perf_ns()
        if cap.start_perf_ns - before <= _CLOCK_GAP_NS:
            return


def _abandon(cap: Capture) -> None:
    """A capture given up between its start and the user's call (an exception, a Ctrl-C landing
    in attnscope's own code): a profiler session left open would hold the profiler lock and
    keep kineto on for good, and kept tensors their budget. Runs before the capture is current."""
    # ended: a session a second Ctrl-C keeps open below is an orphan the next profiled call ends
    cap.end_perf_ns = cap.end_perf_ns or 1
    try:
        if cap.profile is not None:
            _profiler.stop(cap.profile)  # a no-op unless it runs
    finally:
        _retain.release(cap)


def _event_timer(device: Any) -> Any:
    """An event pair from the process's pool (made on the first CUDA call)."""
    pool = runtime.device.event_pool
    if pool is None:
        pool = runtime.device.event_pool = _device.CudaEventPool()
    return pool.get(device)


def _device_counts(cap: Capture) -> None:
    """Masks, cache lengths and ids on the device: counted on the call's stream after its end
    event, into pinned memory the worker reads once a third event has passed (``hostread``)."""
    try:
        copied = _hostread.to_host(cap)
    except Exception as exc:  # the worker reads no device tensor: those counts are left out
        copied = True  # but copies enqueued before the error are read only behind the event
        _log.internal_error("device-counts", exc)
    if copied and cap.timer is not None:
        cap.timer.record_after()


def _site_error(site: CallSite, stage: str, exc: Exception) -> None:
    _log.internal_error(stage, exc)
    try:
        if runtime.sampler.site_error(site):
            _log.warn_once(
                "site-off:" + site.key,
                "attnscope: too many internal errors at this call site; it is no longer traced",
                site=site.name,
            )
    except Exception:
        pass


# ---- the wrappers: countdown in front, enter/leave behind ---------------------------------------


def _sampled(site: CallSite, fn: Callable[..., Any], args: tuple[Any, ...],
             kwargs: dict[str, Any], checked: bool = False) -> Any:
    active = None
    # One flat try (a nested try's first line is outside the outer one's handlers): from
    # enter() on, a Ctrl-C on any line still reaches leave(), in the finally at the latest.
    try:
        active = enter(site, args, kwargs, None, None, None, checked)
        if active is None:
            return fn(*args, **kwargs)
        result = fn(*args, **kwargs)
    except BaseException as exc:
        if active is not None:
            leave(site, active, exc)
        raise
    else:
        leave(site, active, None, result)
        return result
    finally:
        # a no-op, unless a Ctrl-C landed before leave's first line (end_perf_ns unset); asked
        # here, not in leave(), so that the usual end pays no second call and exc_info()
        if active is not None and not active[0].end_perf_ns:
            leave(site, active, sys.exc_info()[1])


async def _sampled_async(site: CallSite, fn: Callable[..., Any], args: tuple[Any, ...],
                         kwargs: dict[str, Any]) -> Any:
    # _sampled, awaiting: Python cannot share one body between a function and a coroutine.
    active = None
    # One flat try (a nested try's first line is outside the outer one's handlers): from
    # enter() on, a Ctrl-C on any line still reaches leave(), in the finally at the latest.
    try:
        active = enter(site, args, kwargs)
        if active is None:
            return await fn(*args, **kwargs)
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        if active is not None:
            leave(site, active, exc)
        raise
    else:
        leave(site, active, None, result)
        return result
    finally:
        # a no-op, unless a Ctrl-C landed before leave's first line (end_perf_ns unset); asked
        # here, not in leave(), so that the usual end pays no second call and exc_info()
        if active is not None and not active[0].end_perf_ns:
            leave(site, active, sys.exc_info()[1])


def wrap(fn: F, site: CallSite, compile_check: bool | None = None) -> F:
    """The traced version of ``fn``: same signature, name, docstring and results.

    ``compile_check`` (default: for methods, and for any wrapper made once Dynamo is loaded) adds
    a ``torch.compiler.is_compiling()`` test in front of the countdown, once the program has
    imported Dynamo; it is needed where Dynamo would trace the wrapper itself (methods looked up
    on a class). Elsewhere the wrapper is registered, when Dynamo loads, so that Dynamo inlines
    ``fn`` instead (:func:`capture.compile.hide_from_dynamo`).
    """
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            site.countdown -= 1
            if site.countdown > 0:
                return await fn(*args, **kwargs)
            return await _sampled_async(site, fn, args, kwargs)

        return async_wrapper  # type: ignore[return-value]

    if compile_check is None:
        # Once Dynamo is loaded a registration would be held by Dynamo for good: a trace(fn) made
        # per request would leak; the check costs those wrappers an is_compiling() call instead.
        compile_check = site.kind == "method" or runtime.dynamo.loaded
    if compile_check:
        is_compiling = _compile.is_compiling_fn()
        _compile.register_when_dynamo_loads()  # the import hook that sets runtime.dynamo.loaded
        mark_no, traced_call = _graph_marks.number(site), _graph_marks.traced_call

        @functools.wraps(fn)
        def checked_wrapper(*args: Any, **kwargs: Any) -> Any:
            if runtime.dynamo.loaded and is_compiling():  # marks for compiled CUDA graphs
                return traced_call(mark_no, site.param_names, fn, args, kwargs)
            site.countdown -= 1
            if site.countdown > 0:
                return fn(*args, **kwargs)
            return _sampled(site, fn, args, kwargs, True)

        return checked_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        site.countdown -= 1
        if site.countdown > 0:
            return fn(*args, **kwargs)
        return _sampled(site, fn, args, kwargs)

    _compile.hide_from_dynamo(wrapper, fn, site)
    return wrapper  # type: ignore[return-value]
