"""The wrapper every traced call runs through.

The unsampled path is a countdown decrement and a compare. Only a call whose countdown ran out
enters :func:`_sampled_call`, which decides a tier, captures cheap facts around the user's call and
hands a :class:`Capture` to the worker. The user's call always runs outside attnscope's guards.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import sys
import time
from collections.abc import Callable
from typing import Any, TypeVar

from opentelemetry import trace as otel_trace

from . import _config, _inspect, _memory, _profile, _safety, _sampling, _timing, _worker
from ._capture import TIER_NONE, TIER_PROFILE, TIER_TIMING, Capture, next_id
from ._sampling import CallSite

__all__ = ["wrap", "current_capture_id", "begin", "end", "open_capture", "make_site"]

F = TypeVar("F", bound=Callable[..., Any])

_perf_ns = time.perf_counter_ns
_current: contextvars.ContextVar[int | None] = contextvars.ContextVar(
    "attnscope_current_capture", default=None
)
_event_pool: _timing.CudaEventPool | None = None
# Until the program imports Dynamo nothing can be compiling, so method wrappers skip the
# is_compiling() call (~50 ns); _dynamo_watch flips this the moment torch._dynamo is imported.
_dynamo_loaded = "torch._dynamo" in sys.modules


def current_capture_id() -> int | None:
    """Id of the innermost sampled attnscope call in this context, if any."""
    return _current.get()


def _is_compiling() -> bool:
    try:
        import torch

        return bool(torch.compiler.is_compiling())
    except Exception:
        return False


def _first_device(summary: list[tuple[str, Any]]) -> Any:
    for _, value in summary:
        if isinstance(value, tuple) and len(value) == 3 and isinstance(value[0], tuple):
            return value[2]
    return None


def begin(
    site: CallSite,
    tier: int,
    rate: float,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    extra: dict[str, Any] | None = None,
) -> Capture | None:
    """Open a capture on the calling thread: clocks, shapes, parents. None: call through."""
    cap = Capture()
    cap.capture_id = next_id()
    cap.parent_id = _current.get()
    cap.site = site
    cap.name = site.name
    cap.sample_rate = rate
    cap.extra = extra
    span_ctx = otel_trace.get_current_span().get_span_context()
    if span_ctx.is_valid:
        cap.otel_parent = span_ctx
    summary = _inspect.summarize(args, kwargs, site.param_names)
    cap.summary = summary
    if site.kind == "method" and args:
        cap.instance = args[0]
    device = _first_device(summary)
    if device is not None and device.type == "cuda":
        import torch

        if torch.cuda.is_current_stream_capturing():
            return None  # CUDA graph capture: events and allocator queries would be recorded into it
        cap.memory = _memory.cuda_before(device, _config.current().reset_peak_memory_stats)
        global _event_pool
        if _event_pool is None:
            _event_pool = _timing.CudaEventPool()
        cap.timer = _event_pool.get(device)
    if site.extractor is not None:  # instrument(): shapes, cache length (after the capture check)
        try:
            summary.extend(site.extractor(cap.instance, args, kwargs))
        except Exception as exc:  # the span goes out without the facts; the site counts the error
            _on_internal_error(site, "extract", exc)
    if tier == TIER_PROFILE:
        cap.profile = _profile.start(device)
        if cap.profile is None:
            tier = TIER_TIMING
    cap.tier = tier
    cap.start_epoch_ns = time.time_ns()
    if cap.timer is not None:
        try:
            cap.timer.record_start()
        except BaseException:
            if cap.profile is not None:  # a session left open would hold the profiler lock forever
                _profile.stop(cap.profile)
            raise
    cap.start_perf_ns = _perf_ns()
    return cap


def end(cap: Capture, error: BaseException | None) -> None:
    """Close a capture right after the user's call and hand it to the worker."""
    cap.end_perf_ns = _perf_ns()
    if cap.timer is not None:
        cap.timer.record_end()
    if cap.profile is not None:
        _profile.stop(cap.profile)
    if cap.memory is not None:
        _memory.cuda_after(cap.memory)
    cap.error = error
    _worker.submit(cap)


def _on_internal_error(site: CallSite, stage: str, exc: Exception) -> None:
    _safety.internal_error(stage, exc)
    try:
        if _sampling.sampler.site_error(site):
            _safety.warn_once(
                "site-off:" + site.key,
                "attnscope: too many internal errors at this call site; it is no longer traced",
                site=site.name,
            )
    except Exception:
        pass


def _account(cap: Capture, t_enter: int, t_exit: int) -> None:
    own = (cap.start_perf_ns - t_enter) + (t_exit - cap.end_perf_ns)
    cap.overhead_ns = own
    _sampling.sampler.budget.add(own, cap.end_perf_ns - cap.start_perf_ns, cap.sample_rate or 1.0)


def open_capture(site: CallSite, args: tuple[Any, ...], kwargs: dict[str, Any],
                 forced: bool | None = None, extra: dict[str, Any] | None = None) -> Capture | None:
    """Decide and, when sampled, begin a capture. None: call through. Never raises."""
    try:
        if _is_compiling():
            site.countdown = 1  # decide again on the next eager call
            register_pending_with_dynamo()
            return None
        tier, rate = _sampling.decide(site, forced)
        if tier == TIER_NONE:
            return None
        return begin(site, tier, rate, args, kwargs, extra)
    except Exception as exc:
        _on_internal_error(site, "capture", exc)
        return None


def _sampled_call(site: CallSite, fn: Callable[..., Any], args: tuple[Any, ...],
                  kwargs: dict[str, Any]) -> Any:
    t_enter = _perf_ns()
    cap = open_capture(site, args, kwargs)
    if cap is None:
        return fn(*args, **kwargs)
    token = _current.set(cap.capture_id)
    try:
        result = fn(*args, **kwargs)
    except BaseException as exc:
        _close(site, cap, token, exc, t_enter)
        raise
    _close(site, cap, token, None, t_enter)
    return result


async def _sampled_call_async(site: CallSite, fn: Callable[..., Any], args: tuple[Any, ...],
                              kwargs: dict[str, Any]) -> Any:
    t_enter = _perf_ns()
    cap = open_capture(site, args, kwargs)
    if cap is None:
        return await fn(*args, **kwargs)
    token = _current.set(cap.capture_id)
    try:
        result = await fn(*args, **kwargs)
    except BaseException as exc:
        _close(site, cap, token, exc, t_enter)
        raise
    _close(site, cap, token, None, t_enter)
    return result


def _close(site: CallSite, cap: Capture, token: contextvars.Token[int | None],
           error: BaseException | None, t_enter: int) -> None:
    try:
        _current.reset(token)
    except Exception as exc:  # token from another context (e.g. a generator resumed elsewhere)
        _safety.internal_error("context", exc)
    try:
        end(cap, error)
        _account(cap, t_enter, _perf_ns())
    except Exception as exc:
        _on_internal_error(site, "capture-end", exc)


def _param_names(fn: Callable[..., Any]) -> tuple[str, ...]:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return ()
    return tuple(
        p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    )


def make_site(fn: Callable[..., Any], name: str | None, sample_rate: float | None,
              attributes: dict[str, Any] | None, kind: str | None = None,
              param_names: tuple[str, ...] | None = None, key: str | None = None) -> CallSite:
    """A registered call site for ``fn`` (kind "method" when its first parameter is ``self``)."""
    qualname = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or repr(fn)
    names = _param_names(fn) if param_names is None else param_names
    if kind is None:
        kind = "method" if names[:1] == ("self",) else "function"
    site = CallSite(
        key=key or f"{getattr(fn, '__module__', '')}.{qualname}:{name or ''}",
        name=name or qualname,
        forced_rate=sample_rate,
        attributes=dict(attributes or {}),
        param_names=names,
        kind=kind,
    )
    site.attributes.setdefault("code.function.name", qualname)
    _sampling.sampler.register(site)
    return site


def wrap(fn: F, site: CallSite, compile_check: bool | None = None) -> F:
    """The traced version of ``fn``: same signature, name, docstring and results.

    ``compile_check`` adds a ``torch.compiler.is_compiling()`` test in front of the countdown.
    It is needed where Dynamo would trace the wrapper itself (methods looked up on a class);
    elsewhere the wrapper is registered so Dynamo inlines ``fn`` instead (see :func:`_hide_from_dynamo`).
    """
    if inspect.iscoroutinefunction(fn):
        @functools.wraps(fn)
        async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
            site.countdown -= 1
            if site.countdown > 0:
                return await fn(*args, **kwargs)
            return await _sampled_call_async(site, fn, args, kwargs)

        return async_wrapper  # type: ignore[return-value]

    if compile_check is None:
        compile_check = site.kind == "method"
    if compile_check:
        from ._dynamo_watch import register_when_dynamo_loads

        is_compiling = _compiling_fn()
        register_when_dynamo_loads()  # installs the import hook that sets _dynamo_loaded

        @functools.wraps(fn)
        def checked_wrapper(*args: Any, **kwargs: Any) -> Any:
            if _dynamo_loaded and is_compiling():
                return fn(*args, **kwargs)
            site.countdown -= 1
            if site.countdown > 0:
                return fn(*args, **kwargs)
            return _sampled_call(site, fn, args, kwargs)

        return checked_wrapper  # type: ignore[return-value]

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        site.countdown -= 1
        if site.countdown > 0:
            return fn(*args, **kwargs)
        return _sampled_call(site, fn, args, kwargs)

    _hide_from_dynamo(wrapper, fn)
    return wrapper  # type: ignore[return-value]


def _compiling_fn() -> Callable[[], bool]:
    try:
        import torch

        return torch.compiler.is_compiling
    except Exception:
        return lambda: False


_pending_dynamo: list[tuple[Callable[..., Any], Callable[..., Any]]] = []


def _hide_from_dynamo(wrapper: Callable[..., Any], fn: Callable[..., Any]) -> None:
    """Make torch.compile inline ``fn`` where it meets ``wrapper``.

    Dynamo would otherwise trace the countdown and recompile whenever it changes. Importing
    Dynamo costs about a second, so registration waits until the program has imported it:
    :func:`register_pending_with_dynamo` runs at decoration if Dynamo is loaded, else from the
    import hook in :mod:`._dynamo_watch`, and when a slow path finds itself being compiled.
    """
    from ._dynamo_watch import register_when_dynamo_loads

    _pending_dynamo.append((wrapper, fn))
    register_when_dynamo_loads()


def _call_through(fn: Callable[..., Any]) -> Callable[..., Any]:
    def through(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    return through


def register_pending_with_dynamo() -> None:
    """Register waiting wrappers once ``torch._dynamo`` is imported. Never raises."""
    import sys

    if not _pending_dynamo or "torch._dynamo" not in sys.modules:
        return
    try:
        import torch

        substitute = getattr(torch.compiler, "substitute_in_graph", None)
    except Exception:
        substitute = None
    while _pending_dynamo:
        try:
            wrapper, fn = _pending_dynamo.pop()
        except IndexError:
            return
        if substitute is None:
            continue
        try:
            substitute(wrapper, skip_signature_check=True)(_call_through(fn))
        except Exception as exc:
            _safety.internal_error("dynamo-register", exc)
