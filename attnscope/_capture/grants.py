"""Profile-tier grants the worker hands to call sites: after a slow call, and on demand.

The worker decides (it sees every timing capture, and polls the control file); the calling
thread only reads what it was given, and only on the sampled path:

- **slow call**: the worker *arms* a site (:meth:`Grants.arm`): it saves the site's countdown
  in the grant and sets the countdown to 1, so the site's next call leaves the fast path. Each
  armed call consumes one call of the saved countdown (the call that would have been sampled
  anyway is still decided by the sampler, so the random sample is exactly what it would have
  been: same calls, same generator draws). The first armed call whose shape bucket matches the
  slow call's gets the profile tier, if the profile token bucket has a token; then the saved
  countdown is put back. A grant lapses after ``ARMED_CALLS`` armed calls without a match.
- **on demand**: ``attnscope trigger`` asks for the profile tier on the next N sampled calls of
  the sites matching a glob (:meth:`Grants.set_trigger`). Only calls the sampler chose anyway
  are upgraded, without the profile rate or the token bucket (an operator asked for them).

Either way the one profiler session per process and the user's profiler are respected: the
profiler may still refuse, and the call is then timed (``profile_skipped_<reason>``). Where a
grant stands in the order of a call's decision: :func:`attnscope._capture.decision.decide`.
"""

from __future__ import annotations

import fnmatch
import threading
from collections.abc import Sequence
from typing import Any

from .._record.buckets import bucket as bucket_of
from .._record.capture import NO_FACTS, TIER_PROFILE, TIER_TIMING, Facts
from .._record.handles import SiteHandle
from .sampling import CallSite, Sampler

__all__ = ["Grant", "Grants", "settle", "on_demand", "SLOW", "ON_DEMAND", "ARMED_CALLS",
           "MAX_TRIGGER_CALLS"]

SLOW = "slow_call"
ON_DEMAND = "on_demand"
# Calls an armed site may make without matching the grant's bucket before the grant lapses.
ARMED_CALLS = 256
# The most calls one trigger can ask for.
MAX_TRIGGER_CALLS = 10_000


class Grant:
    """One profile-tier grant: why (``kind``), for which shape bucket, linked to which capture."""

    __slots__ = ("kind", "bucket", "link", "quantile", "left", "calls", "done")

    def __init__(self, kind: str, bucket: tuple[int, ...] | None = None, link: int | None = None,
                 quantile: float | None = None) -> None:
        self.kind = kind
        self.bucket = bucket
        self.link = link  # capture id of the slow call (its span is linked from the profiled one)
        self.quantile = quantile
        self.left = 0  # the site's countdown when it was armed, less the armed calls since
        self.calls = 0
        self.done = False


class Grants:
    """The process's grants and their counts (``attnscope.stats()``). On ``_state.state``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trigger_left = 0
        self.trigger_pattern = "*"
        self.trigger: bool = False  # read without the lock on the sampled path
        self._matches: dict[str, bool] = {}
        self.counts = {"on_demand_granted": 0, "slow_calls": 0, "slow_granted": 0,
                       "slow_lapsed": 0}

    def after_fork(self) -> None:
        self.lock = threading.Lock()

    def stats(self) -> dict[str, int]:
        with self.lock:
            return {"on_demand_remaining": self.trigger_left, **self.counts}

    # -- worker thread ----------------------------------------------------------------------
    def set_trigger(self, calls: int, pattern: str) -> None:
        """Profile the next ``calls`` sampled calls of sites whose name or key match ``pattern``
        (replacing any earlier trigger)."""
        with self.lock:
            self.trigger_left = max(0, min(int(calls), MAX_TRIGGER_CALLS))
            self.trigger_pattern = pattern or "*"
            self._matches = {}
            self.trigger = self.trigger_left > 0

    def arm(self, site: SiteHandle, bucket: tuple[int, ...], link: int, quantile: float) -> bool:
        """After a slow call at ``site``: its next call in ``bucket`` gets the profile tier.
        False when the site is already armed or not capturing. The worker's one way to change a
        call site: under the lock, and the countdown a plain int write."""
        with self.lock:
            self.counts["slow_calls"] += 1
            if not isinstance(site, CallSite) or site.grant is not None or site.disabled:
                return False
            grant = Grant(SLOW, bucket, link, quantile)
            grant.left = site.countdown
            site.grant = grant
        site.countdown = 1  # a plain int write: the next call leaves the fast path
        return True

    # -- calling thread (sampled path only) ---------------------------------------------------
    def take_trigger(self, site: CallSite) -> bool:
        with self.lock:
            if self.trigger_left <= 0:
                self.trigger = False
                return False
            match = self._matches.get(site.key)
            if match is None:
                pattern = self.trigger_pattern
                match = (fnmatch.fnmatchcase(site.name, pattern)
                         or fnmatch.fnmatchcase(site.key, pattern))
                if len(self._matches) < 4096:
                    self._matches[site.key] = match
            if not match:
                return False
            self.trigger_left -= 1
            self.trigger = self.trigger_left > 0
            self.counts["on_demand_granted"] += 1
            return True

    def end(self, site: CallSite, grant: Grant, outcome: str | None) -> None:
        """The grant is used (``outcome`` a count key) or lapsed: the saved countdown goes back."""
        with self.lock:
            if grant.done:
                return
            grant.done = True
            if outcome is not None:
                self.counts[outcome] += 1
            if site.grant is grant:
                site.grant = None
                site.countdown = max(1, grant.left) if not site.disabled else site.countdown


def settle(grants: Grants, sampler: Sampler, site: CallSite, grant: Grant,
           summary: Sequence[tuple[str, Any]], tier: int,
           facts: Facts = NO_FACTS) -> tuple[int, Grant | None]:
    """A slow-call grant meets a call's recorded shapes: the profile tier when they are in the
    grant's bucket (and the token bucket allows), else the tier the sampler chose."""
    if grant.kind != SLOW:
        return tier, grant
    if grant.done or bucket_of(summary, facts) != grant.bucket:
        return tier, None
    if tier == TIER_PROFILE or sampler.bucket.take():
        grants.end(site, grant, "slow_granted")
        return TIER_PROFILE, grant
    grants.end(site, grant, "slow_lapsed")  # no token: the per-minute limit still holds
    return tier, None


def on_demand(grants: Grants, site: CallSite, tier: int) -> Grant | None:
    """A sampled call (timing tier) upgraded by a trigger: an on-demand grant, or None."""
    if tier == TIER_TIMING and grants.take_trigger(site):
        return Grant(ON_DEMAND)
    return None
