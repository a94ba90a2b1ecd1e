"""One profile-tier grant, the record a call site holds while it is armed (a leaf: both the
sampler's call sites and the grants' state refer to it)."""

from __future__ import annotations

__all__ = ["Grant"]


class Grant:
    """One profile-tier grant: why (``kind``), for which shape bucket, linked to which capture."""

    __slots__ = ("kind", "bucket", "link", "quantile", "left", "calls", "done", "extra")

    def __init__(self, kind: str, bucket: tuple[int, ...] | None = None, link: int | None = None,
                 quantile: float | None = None) -> None:
        self.kind = kind
        self.bucket = bucket
        self.link = link  # capture id of the slow call (its span is linked from the profiled one)
        self.quantile = quantile
        self.left = 0  # the site's countdown when it was armed, less the armed calls since
        self.calls = 0
        self.done = False
        # granted to a call the sampler had not chosen: outside the random sample, so no
        # weight in an estimate of all calls (``attnscope.extra``)
        self.extra = False
