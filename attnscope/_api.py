"""The public entry points: ``configure``, ``trace``, ``flush``, ``shutdown``, ``stats``,
``sampling`` and ``step`` (``span`` lives in :mod:`attnscope._capture.block`).

This is the one module that knows both sides: it hands the capture side the function that starts
the worker, and the worker the profiler's warm-up. Of the worker side only its light front
(:mod:`attnscope._worker.loop`: a queue and a thread) is imported here; the rest (the OpenTelemetry
SDK, exporters, psutil) is imported by the worker's own thread when it starts, never by
``import attnscope`` nor by the calling thread of the first sampled call.
"""

from __future__ import annotations

import atexit
import dataclasses
import enum
import inspect
import threading
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, TypeVar, cast, overload

from . import _exit_status, _interrupt_safe, _log, _nothing_sampled
from ._capture import early_warmup, profiler_session, wrapper
from ._capture.args import check_attributes
from ._capture.sampling import force as _force
from ._config import Config, check_rate, from_env, shown, validate
from ._runtime import runtime
from ._worker import loop, spare, stopping

if TYPE_CHECKING:
    from opentelemetry.trace import TracerProvider
    from typing_extensions import Unpack  # typing's own from Python 3.11

    from ._config import ExporterSetting, OtherSettings
    from ._stats import Stats
    from ._worker.loop import Worker

__all__ = ["configure", "current", "restore", "reset_defaults", "trace", "flush", "shutdown",
           "stats", "sampling", "step"]

F = TypeVar("F", bound=Callable[..., Any])

# A change to any of these needs a new pipeline, so the running worker is stopped.
_PIPELINE_FIELDS = ("exporter", "tracer_provider", "service_name", "record_command_args",
                    "max_spans_per_trace",
                    "queue_size", "metrics", "meter_provider")


# ---- configuration ---------------------------------------------------------------------------


def _warn(key: str, message: str, fields: dict[str, Any]) -> None:
    _log.warn_once(key, message, **fields)


def current() -> Config:
    """The effective configuration; built from the environment on first use (never raises)."""
    cfg = runtime.config.current
    if cfg is None:
        with runtime.config.lock:
            if runtime.config.current is None:
                _set(from_env(strict=False, warn=_warn))
            cfg = runtime.config.current
    assert cfg is not None  # for mypy: _set always assigns
    return cfg


class _NotGiven(enum.Enum):
    """:func:`configure`'s "argument not given" (``None`` is a value there: the default)."""

    NOT_GIVEN = "not given"

    def __repr__(self) -> str:
        return "<not given>"


_NOT_GIVEN = _NotGiven.NOT_GIVEN


def configure(
    *,
    service_name: str | None | _NotGiven = _NOT_GIVEN,
    sample_rate: float | None | _NotGiven = _NOT_GIVEN,
    exporter: ExporterSetting | None | _NotGiven = _NOT_GIVEN,
    tracer_provider: TracerProvider | None | _NotGiven = _NOT_GIVEN,
    enabled: bool | None | _NotGiven = _NOT_GIVEN,
    **other: Unpack[OtherSettings],
) -> Config:
    """Set attnscope's configuration; settings not given keep their current value, and ``None``
    puts one back to its default: its environment variable's value if set (read now), else the
    built-in default.

    Raises ``ValueError`` naming the setting when a value is invalid. See docs/configuration.md
    for every setting and its environment variable.
    """
    settings: dict[str, Any] = dict(other)  # typed for the caller; checked below all the same
    named = {"service_name": service_name, "sample_rate": sample_rate, "exporter": exporter,
             "tracer_provider": tracer_provider, "enabled": enabled}
    settings.update({k: v for k, v in named.items() if v is not _NOT_GIVEN})
    unknown = set(settings) - {f.name for f in dataclasses.fields(Config)}
    if unknown:
        raise ValueError(f"attnscope: unknown setting(s): {', '.join(sorted(unknown))}")
    with runtime.config.lock:
        current = runtime.config.current
        base = current if current is not None else from_env(strict=True)
        if any(v is None for v in settings.values()):
            # the default as at import: an invalid environment value is warned about and skipped
            defaults = from_env(strict=False, warn=_warn)
            settings = {k: getattr(defaults, k) if v is None else v for k, v in settings.items()}
        cfg = validate(dataclasses.replace(base, **settings))
        _set(cfg)
    if cfg.enabled:
        spare.preload()  # set-up time: the worker side loads now, not on the first sampled call
    return cfg


def restore(cfg: Config) -> None:
    """Put back a configuration returned by :func:`current` (tests, ``capture_spans``)."""
    with runtime.config.lock:
        _set(cfg)


def reset_defaults() -> None:
    """Stop the worker and forget all state; the next use reads the environment again (tests)."""
    shutdown(timeout_s=5.0)
    runtime.reset()


def _set(cfg: Config) -> None:
    """Apply ``cfg``: the sampler takes it; a running worker whose pipeline changed stops."""
    previous, runtime.config.current = runtime.config.current, cfg
    runtime.sampler.apply(cfg)
    # kineto's first session on torch's thread (no stderr); with CUDA up, CUPTI's on a helper
    profiler_session.warm_up_on_main_thread(cfg)
    early_warmup.warm_up_early(cfg)
    if previous is not None and any(
        getattr(previous, f) is not getattr(cfg, f) and getattr(previous, f) != getattr(cfg, f)
        for f in _PIPELINE_FIELDS
    ):
        exporter = cfg.exporter
        # the application's own exporter instance, still named: the next pipeline exports
        # through it, so the old one's shutdown must not shut it down (later spans all failed)
        kept = exporter is previous.exporter and exporter is not None \
            and not isinstance(exporter, str)
        runtime.worker.kept_exporter = (
            exporter if kept and not isinstance(exporter, str) else None)
        try:  # a Ctrl-C in it: the old worker is closed aside, never back under the new settings
            _shutdown(5.0, resume=False)
        finally:
            runtime.worker.kept_exporter = None


def _start_worker() -> Worker | None:
    # The calling thread of the first sampled call: the worker's thread imports and builds.
    return loop.start(current(), on_start=profiler_session.on_worker_start)


runtime.worker.set_starter(_start_worker)


# ---- trace -----------------------------------------------------------------------------------


def _checked_rate(sample_rate: Any, where: str) -> float | None:
    if sample_rate is None:
        return None
    try:
        return check_rate("sample_rate", sample_rate)
    except ValueError as exc:
        warnings.warn(f"{exc} (in {where}); using the configured rate", UserWarning, stacklevel=3)
        return None


@overload
def trace(fn: F, /) -> F: ...
@overload
def trace(
    *, name: str | None = None, sample_rate: float | None = None,
    attributes: dict[str, Any] | None = None,
) -> Callable[[F], F]: ...


def trace(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    sample_rate: float | None = None,
    attributes: dict[str, Any] | None = None,
) -> Any:
    """Trace a function, method or ``nn.Module.forward``: sampled calls become spans.

    Usable bare (``@trace``) or with options. ``sample_rate`` overrides the configured rate for this
    function and skips warm-up and the parent's sampling decision. The wrapper keeps the signature,
    name, docstring and return value. Async functions are supported; generators are refused.
    ``name`` (default: the function's qualified name) must be a non-empty ``str``: anything else
    raises ``TypeError`` here; spans carry at most its first 128 characters. ``attributes``: a
    dict (``TypeError`` otherwise), recorded on every span of the function.
    """
    if name is not None and (not isinstance(name, str) or not name):
        raise TypeError(f"attnscope.trace needs a non-empty str name, got {shown(name)}")
    check_attributes(attributes, "attnscope.trace")
    rate = _checked_rate(sample_rate, "attnscope.trace")

    def decorate(func: F) -> F:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            shown_fn = shown(getattr(func, "__qualname__", func))
            raise TypeError(
                f"attnscope.trace cannot time generator {shown_fn}: "
                "wrap the code that consumes it with attnscope.span() instead"
            )
        if not callable(func):
            raise TypeError(f"attnscope.trace expects a callable, got {shown(func)}")
        if getattr(func, "__attnscope_site__", None) is not None:
            return func  # already traced: one wrapper is enough
        site = wrapper.make_site(func, name, rate, attributes)
        wrapped = wrapper.wrap(func, site)
        wrapped.__attnscope_site__ = site  # type: ignore[attr-defined]
        return wrapped

    if fn is not None:
        return decorate(fn)
    return decorate


# ---- sampling control --------------------------------------------------------------------------


@contextmanager
def sampling(force: bool = True, profile: bool = False) -> Iterator[None]:
    """Force (``force=True``) or suppress (``force=False``) capture of every call in the block.

    ``profile=True`` also asks for the profile tier, still limited by ``profile_max_per_minute``.
    """
    value = (bool(force), bool(profile))
    sampler = runtime.sampler
    key = object()
    token: list[Any] = []  # filled from C: a Ctrl-C as set() returns cannot lose the token
    try:
        _interrupt_safe.call_into(token, _force.set, value)
        sampler.force_enter(key)
        yield
    finally:  # each undo is one C call, made first: a Ctrl-C as it returns leaves it done
        try:
            sampler.force_blocks.pop(key, None)
            sampler.force_exit(key)
        finally:
            if token:
                _force.reset(token[0])


class _Step:
    """Declares the current step; usable as a plain call or a context manager."""

    _open = False  # inside a with block (a class default: __del__ reads it without a call)

    def __init__(self, step_no: int | None) -> None:
        sampler = runtime.sampler
        self._previous = sampler.step_no
        try:
            sampler.set_step(step_no)
        except BaseException:  # a Ctrl-C in here: the step stays what it was
            sampler.set_step(self._previous)
            raise

    def __enter__(self) -> _Step:
        self._open = True
        return self

    def __exit__(self, *exc: object) -> None:
        runtime.sampler.set_step(self._previous)
        self._open = False

    def __del__(self) -> None:
        # A Ctrl-C handled as __exit__ starts leaves it at once, and the with statement does not
        # call it again: the step is put back as the _Step is freed (as for span() blocks)
        if self._open:
            try:
                runtime.sampler.set_step(self._previous)
            except BaseException:  # noqa: BLE001  (nothing may escape a __del__)
                pass


def step(n: int | None) -> _Step:
    """Declare the current step so sampling is consistent across processes (None: no step)."""
    if n is not None and (isinstance(n, bool) or not isinstance(n, int)):
        _log.warn_once("step-type", "attnscope.step() expects an int; ignored", value=n)
        n = None
    return _Step(n)


# ---- lifecycle ---------------------------------------------------------------------------------


# The longest wait handed on: "wait" for any purpose, and well inside the limit of every timer it
# reaches (a thread join, a lock, the SDK's events: threading.TIMEOUT_MAX, 49 days on Windows),
# so that math.inf or 1e12 means "wait" instead of an OverflowError that loses the trace file.
_LONGEST_WAIT_S = min(1e9, threading.TIMEOUT_MAX / 2)


def _bounded(timeout_s: Any) -> Any:
    """``timeout_s`` capped at :data:`_LONGEST_WAIT_S` (infinity included), else as given."""
    try:
        if timeout_s > _LONGEST_WAIT_S:  # an int too large for a float compares exactly too
            return _LONGEST_WAIT_S
    except Exception:  # not a number: the worker's own handling (logged, False)
        pass
    return timeout_s


def flush(timeout_s: float = 5.0) -> bool:
    """Export everything captured so far; False if ``timeout_s`` ran out first (``math.inf``:
    wait as long as it takes). Never raises."""
    # nothing captured, or all exported
    if runtime.worker.current is None and not runtime.worker.retiring \
            and not runtime.worker.closing:
        if _nothing_sampled.nothing_sampled():
            # a file exporter's file exists after flush()
            _nothing_sampled.write_empty_file(current())
        return True
    try:
        return stopping.flush(_bounded(timeout_s))
    except Exception as exc:
        _log.internal_error("flush", exc)
        return False


def shutdown(timeout_s: float = 5.0) -> bool:
    """Flush and stop the worker (also done at exit); a later traced call starts a new one.
    ``timeout_s`` as for :func:`flush`. A Ctrl-C while it waits leaves the worker running, or,
    once it was told to stop, lets it finish on a thread of its own."""
    return _shutdown(timeout_s, resume=True)


def _shutdown(timeout_s: float, resume: bool) -> bool:
    if runtime.worker.current is None and not runtime.worker.closing:
        return True
    try:
        return stopping.shutdown(_bounded(timeout_s), resume=resume)
    except Exception as exc:
        _log.internal_error("shutdown", exc)
        return False


def stats() -> Stats:
    """Live numbers: configured and effective rates, measured overhead, span and drop counts."""
    s = runtime.sampler
    out: dict[str, Any] = {
        "sample_rate": s.rate,
        "effective_sample_rate": s.effective_rate,
        "profile_rate": s.profile_rate,
        "effective_profile_rate": s.effective_profile_rate,
        "overhead_budget": s.budget.budget,
        "overhead_ratio": s.budget.last_ratio,
        "sampled": s.sampled,
        "profile_granted": s.profile_granted,
        "internal_errors": _log.error_count(),
    }
    out.update(runtime.span_counts())  # every key, also before the first sampled call
    # "profiled": calls that really ran under the profiler; "profile_skipped_<reason>": calls
    # granted the profile tier that were timed instead.
    profiled = profiler_session.stats()
    out.update({k if k == "profiled" else "profile_" + k: v for k, v in profiled.items()})
    out.update(runtime.grants.stats())  # slow calls and on-demand triggers (docs/live.md)
    out.update(runtime.graphs.counts)  # CUDA graph replays (docs/profiling.md#cuda-graphs)
    return cast("Stats", out)  # its keys: tests/test_public_api.py pins them to Stats's


# Read the environment now (never raising), so the sampler starts with it.
current()
atexit.register(_exit_status.at_exit)  # first, so it runs last: after an exit hook's exec
atexit.register(_nothing_sampled.at_exit)  # before any worker's hook, so it runs after them
