"""The public entry points: ``trace``, ``span``, ``configure``, ``flush``, ``shutdown``, ``stats``."""

from __future__ import annotations

import inspect
import threading
import time
import warnings
from collections.abc import Callable
from types import TracebackType
from typing import Any, TypeVar, overload

from . import _config, _hotpath, _safety, _sampling, _worker
from ._capture import Capture
from ._sampling import CallSite

__all__ = ["trace", "span", "configure", "flush", "shutdown", "stats", "Span"]

F = TypeVar("F", bound=Callable[..., Any])

_PIPELINE_FIELDS = ("exporter", "tracer_provider", "service_name", "max_spans_per_trace",
                    "queue_size", "metrics", "meter_provider")
_applied: _config.Config | None = None


def _apply(cfg: _config.Config) -> None:
    """Push a new configuration to the sampler; restart the worker if its pipeline changed."""
    global _applied
    previous, _applied = _applied, cfg
    _sampling.sampler.apply(cfg)
    if previous is not None and any(
        getattr(previous, f) is not getattr(cfg, f) and getattr(previous, f) != getattr(cfg, f)
        for f in _PIPELINE_FIELDS
    ):
        _worker.shutdown(timeout_s=5.0)


_config.on_change(_apply)


def configure(
    *,
    service_name: str | None = None,
    sample_rate: float | None = None,
    exporter: Any = None,
    tracer_provider: Any = None,
    enabled: bool | None = None,
    **settings: Any,
) -> _config.Config:
    """Set attnscope's configuration; unset arguments keep their current (or environment) value.

    Raises ``ValueError`` naming the setting when a value is invalid. See docs/configuration.md
    for every setting and its environment variable.
    """
    return _config.configure(
        service_name=service_name, sample_rate=sample_rate, exporter=exporter,
        tracer_provider=tracer_provider, enabled=enabled, **settings,
    )


def _checked_rate(sample_rate: Any, where: str) -> float | None:
    if sample_rate is None:
        return None
    try:
        return _config._check_rate("sample_rate", sample_rate)
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
    """
    rate = _checked_rate(sample_rate, "attnscope.trace")

    def decorate(func: F) -> F:
        if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
            raise TypeError(
                f"attnscope.trace cannot time generator {getattr(func, '__qualname__', func)!r}: "
                "wrap the code that consumes it with attnscope.span() instead"
            )
        if not callable(func):
            raise TypeError(f"attnscope.trace expects a callable, got {func!r}")
        if getattr(func, "__attnscope_site__", None) is not None:
            return func  # already traced: one wrapper is enough
        site = _hotpath.make_site(func, name, rate, attributes)
        wrapped = _hotpath.wrap(func, site)
        wrapped.__attnscope_site__ = site  # type: ignore[attr-defined]
        return wrapped

    if fn is not None:
        return decorate(fn)
    return decorate


# ---- span() ------------------------------------------------------------------------------------

_SPAN_SITES_MAX = 10_000
_span_sites: dict[str, CallSite] = {}
_span_sites_lock = threading.Lock()


def _span_site(name: str) -> CallSite:
    site = _span_sites.get(name)
    if site is not None:
        return site
    with _span_sites_lock:
        site = _span_sites.get(name)
        if site is None:
            if len(_span_sites) >= _SPAN_SITES_MAX:
                _safety.warn_once("span-names", "attnscope: too many distinct span() names; "
                                  "later ones share one sampling state", limit=_SPAN_SITES_MAX)
                return _span_sites.setdefault("\x00overflow", CallSite("span:\x00overflow", name))
            site = CallSite(key="span:" + name, name=name, param_names=(), kind="block")
            _sampling.sampler.register(site)
            _span_sites[name] = site
        return site


class Span:
    """The block returned by :func:`span`; add attributes known only inside it with :meth:`set`."""

    __slots__ = ("_site", "_name", "_sample", "_extra", "_cap", "_token", "_t_enter")

    def __init__(self, name: str, sample: bool | None, extra: dict[str, Any]) -> None:
        self._name = name
        self._site = _span_site(name)
        self._sample = sample
        self._extra = extra
        self._cap: Capture | None = None
        self._token: Any = None
        self._t_enter = 0

    @property
    def recording(self) -> bool:
        """True when this block is being captured."""
        return self._cap is not None

    def set(self, **attributes: Any) -> None:
        """Add attributes (e.g. ``tokens=``) to the span if this block is captured."""
        if self._cap is not None:
            self._extra.update(attributes)

    def __enter__(self) -> Span:
        site = self._site
        if self._sample is None:
            site.countdown -= 1
            if site.countdown > 0:
                return self
        self._t_enter = time.perf_counter_ns()
        cap = _hotpath.open_capture(site, (), {}, self._sample, self._extra)
        if cap is not None:
            cap.name = self._name
            self._token = _hotpath._current.set(cap.capture_id)
            self._cap = cap
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        cap, self._cap = self._cap, None
        if cap is not None:
            _hotpath._close(self._site, cap, self._token, exc, self._t_enter)
        return None


def span(name: str, *, tokens: int | None = None, sample: bool | None = None,
         attributes: dict[str, Any] | None = None) -> Span:
    """A traced block: ``with attnscope.span("decode-step", tokens=128): ...``.

    ``sample=True`` always captures the block, ``False`` never; None follows the configured rate.
    ``tokens`` is recorded as ``attnscope.tokens`` (and drives ``attnscope.tokens_per_s``).
    """
    extra: dict[str, Any] = dict(attributes or {})
    if tokens is not None:
        extra["tokens"] = tokens
    if not isinstance(name, str) or not name:
        warnings.warn(f"attnscope.span needs a non-empty name, got {name!r}", UserWarning, stacklevel=2)
        name = str(name) or "attnscope.span"
    return Span(name, sample, extra)


# ---- lifecycle ------------------------------------------------------------------------------------


def flush(timeout_s: float = 5.0) -> bool:
    """Export everything captured so far; False if ``timeout_s`` ran out first. Never raises."""
    try:
        return _worker.flush(timeout_s)
    except Exception as exc:
        _safety.internal_error("flush", exc)
        return False


def shutdown(timeout_s: float = 5.0) -> bool:
    """Flush and stop the worker (also done at exit); a later traced call starts a new one."""
    try:
        return _worker.shutdown(timeout_s)
    except Exception as exc:
        _safety.internal_error("shutdown", exc)
        return False


def stats() -> dict[str, Any]:
    """Live numbers: configured and effective rates, measured overhead, span and drop counts."""
    s = _sampling.sampler
    out: dict[str, Any] = {
        "sample_rate": s.rate,
        "effective_sample_rate": s.effective_rate,
        "profile_rate": s.profile_rate,
        "effective_profile_rate": s.effective_profile_rate,
        "overhead_budget": s.budget.budget,
        "overhead_ratio": s.budget.last_ratio,
        "sampled": s.stats_sampled,
        "profile_granted": s.stats_profiled,
        "internal_errors": _safety.error_count(),
    }
    out.update(_worker.stats())
    try:
        from . import _profile

        # "profiled": calls that really ran under the profiler; "profile_skipped_<reason>": calls
        # granted the profile tier that were timed instead.
        out.update({k if k == "profiled" else "profile_" + k: v for k, v in _profile.stats().items()})
    except Exception as exc:
        _safety.internal_error("stats", exc)
    return out


# Read the environment now (never raising), so the sampler starts with it.
_config.current()
