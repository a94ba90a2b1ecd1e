"""``attnscope.span()``: a traced block, through the same enter/leave as every traced call."""

from __future__ import annotations

from types import TracebackType
from typing import Any

from .. import _log
from .. import _schema as schema
from .._config import shown
from .._record.capture import MAX_NAME
from .._runtime import runtime
from .args import add_attributes, attribute_value, check_attributes
from .sampling import CallSite
from .wrapper import Active, enter, leave

__all__ = ["Span", "span"]

_SPAN_SITES_MAX = 10_000  # distinct names, each at most MAX_NAME characters: about 2 MB in all


def _span_site(name: str) -> CallSite:
    site = runtime.span_sites.by_name.get(name)
    if site is not None:
        return site
    with runtime.span_sites.lock:
        site = runtime.span_sites.by_name.get(name)
        if site is None:
            if len(runtime.span_sites.by_name) >= _SPAN_SITES_MAX:
                _log.warn_once("span-names", "attnscope: too many distinct span() names; "
                               "later ones share one sampling state", limit=_SPAN_SITES_MAX)
                return runtime.span_sites.by_name.setdefault(
                    "\x00overflow", CallSite("span:\x00overflow", name))
            site = CallSite(key="span:" + name, name=name, param_names=(), kind="block")
            runtime.sampler.register(site)
            runtime.span_sites.by_name[name] = site
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
        try:  # a Ctrl-C on any line here: the with statement will not call __exit__
            self._active = enter(site, (), {}, self._sample, self._extra)
            if self._active is not None:
                self._active[0].name = self._name  # the overflow site is shared by many names
            return self
        except BaseException as exc:
            self.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:  # a Ctrl-C on any line below still leaves the block (with calls this once)
            if self._active is not None:
                leave(self._site, self._active, exc)
        finally:
            if self._active is not None:  # a no-op, unless a Ctrl-C landed before leave's start
                leave(self._site, self._active, exc)
                self._active = None
        return None

    def __del__(self) -> None:
        # A Ctrl-C handled as __exit__ starts, before its first line, leaves __exit__ at once and
        # the with statement does not call it again: the block is left when the Span is freed
        # (as the exception leaves the block's frame), its span marked as not exited
        try:
            active = self._active
        except AttributeError:  # a Ctrl-C inside __init__: no block was entered
            return
        if active is None:
            return
        try:
            self._active = None
            leave(self._site, active, BlockNotExited())
        except BaseException:  # noqa: BLE001  (nothing may escape a __del__)
            pass


class BlockNotExited(BaseException):
    """A ``span()`` block left without its ``__exit__`` (an interrupt on its first line)."""


def span(name: str, *, tokens: Any = None, sample: bool | None = None,
         attributes: dict[str, Any] | None = None) -> Span:
    """A traced block: ``with attnscope.span("decode-step", tokens=128): ...``.

    ``name`` must be a non-empty ``str`` (``TypeError`` otherwise); spans carry at most its first
    128 characters. ``sample=True`` always captures the block, ``False`` never; None follows the
    configured rate. ``tokens`` is recorded as ``attnscope.tokens`` (an int drives
    ``attnscope.tokens_per_s``; another value is described as ``attributes`` values are);
    ``attributes`` (a dict: ``TypeError`` otherwise) under the names
    given (at most 64).
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"attnscope.span needs a non-empty str name, got {shown(name)}")
    extra: dict[str, Any] = {}
    if attributes is not None:
        check_attributes(attributes, "attnscope.span")
        add_attributes(extra, attributes)
    if tokens is not None:  # any value attributes= takes: described now, never kept
        try:
            extra[schema.TOKENS.name] = attribute_value(tokens)
        except Exception as exc:  # its own code raised while read: left out
            _log.internal_error("attributes", exc)
    return Span(name[:MAX_NAME], sample, extra)
