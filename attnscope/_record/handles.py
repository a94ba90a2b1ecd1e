"""What a :class:`~.capture.Capture` refers to on the calling side, as the worker sees it.

A capture holds a few live objects of the calling side (its call site, device timer, profile
grant); ``_record`` and ``_worker`` type them by these Protocols, without importing ``_capture``.
Each lists all the worker may use: it reads, and calls only the methods named here as the
worker's. Nothing the worker does writes into them but ``DeviceTimerHandle.release`` (its events
go back to the calling side's pool, under the pool's lock).
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["SiteHandle", "DeviceTimerHandle", "GrantHandle"]


class SiteHandle(Protocol):
    """A capture's call site (``_capture.sampling.CallSite``): read by the worker. A slow call
    arms it through the calling side's grants (``_capture.grants.Grants.arm``), never by a write
    of the worker's own."""

    @property
    def key(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def attributes(self) -> dict[str, Any]: ...


class DeviceTimerHandle(Protocol):
    """A capture's device timer (``_capture.device.DeviceTimer``): the calling thread records its
    events (``record_*``); the worker asks ``ready()``, ``elapsed_ns()``, reads ``start`` (a
    graph replay's offsets) and hands it back with ``release()``."""

    @property
    def device(self) -> Any: ...

    @property
    def start(self) -> Any: ...

    def record_start(self) -> None: ...

    def record_end(self) -> None: ...

    def record_after(self) -> None: ...

    def ready(self) -> bool: ...

    def elapsed_ns(self) -> int: ...

    def release(self) -> None: ...


class GrantHandle(Protocol):
    """Why a call got the profile tier (``_capture.grants.Grant``): read by the worker."""

    @property
    def kind(self) -> str: ...

    @property
    def link(self) -> int | None: ...

    @property
    def extra(self) -> bool: ...
