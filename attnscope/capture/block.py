"""``attnscope.span()``: a traced block, through the same enter/leave as every traced call."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from .. import _log
from .. import _schema as schema
from .._config import shown
from .._state import state
from .args import add_attributes, check_attributes
from ..record.capture import MAX_NAME
from .sampling import CallSite
from .wrapper import Active, enter, leave

__all__ = ["Span", "span"]

_SPAN_SITES_MAX = 10_000  # distinct names, each at most MAX_NAME characters: about 2 MB in all


def _span_site(name: str) -> CallSite:
    site = state.span_sites.get(name)
    if site is not None:
        return site
    with state.span_sites_lock:
        site = state.span_sites.get(name)
        if site is None:
            if len(state.span_sites) >= _SPAN_SITES_MAX:
                _log.warn_once("span-names", "attnscope: too many distinct span() names; "
                               "later ones share one sampling state", limit=_SPAN_SITES_MAX)
                return state.span_sites.setdefault(
                    "\x00overflow", CallSite("span:\x00overflow", name))
            site = CallSite(key="span:" + name, name=name, param_names=(), kind="block")
            state.sampler.register(site)
            state.span_sites[name] = site
        return site


class Span:
    """The block returned by :func:`span`; add attributes known only inside it with :meth:`set`."""

    __slots__ = ("_site", "_name", "_sample", "_extra", "_active")

    def __init__(self, name: str, sample: bool | None, extra: dict[str, Any]) -> None:
        self._name = name
        self._site = _span_site(name)
        self._sample = sample
        self._extra = extra
        self._active: Active | None = None

    @property
    def recording(self) -> bool:
        """True when this block is being captured."""
        return self._active is not None

    def set(self, **attributes: Any) -> None:
        """Add attributes to the span if this block is captured, as ``attnscope.<keyword>``
        (``tokens=`` is ``attnscope.tokens``)."""
        if self._active is not None:
            add_attributes(self._extra, attributes, schema.PREFIX)

    def __enter__(self) -> Span:
        site = self._site
        if self._sample is None:
            site.countdown -= 1
            if site.countdown > 0:
                return self
        active = enter(site, (), {}, self._sample, self._extra)
        if active is not None:
            active[0].name = self._name  # the overflow site is shared by many names
            self._active = active
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        active, self._active = self._active, None
        if active is not None:
            leave(self._site, active, exc)
        return None


def span(name: str, *, tokens: int | None = None, sample: bool | None = None,
         attributes: dict[str, Any] | None = None) -> Span:
    """A traced block: ``with attnscope.span("decode-step", tokens=128): ...``.

    ``name`` must be a non-empty ``str`` (``TypeError`` otherwise); spans carry at most its first
    128 characters. ``sample=True`` always captures the block, ``False`` never; None follows the
    configured rate. ``tokens`` is recorded as ``attnscope.tokens`` (and drives
    ``attnscope.tokens_per_s``); ``attributes`` (a dict: ``TypeError`` otherwise) under the names
    given (at most 64).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"attnscope.span needs a non-empty str name, got {shown(name)}")
    extra: dict[str, Any] = {}
    if attributes is not None:
        check_attributes(attributes, "attnscope.span")
        add_attributes(extra, attributes)
    if tokens is not None:
        extra[schema.TOKENS.name] = tokens
    return Span(name[:MAX_NAME], sample, extra)
