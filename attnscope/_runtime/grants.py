"""Profile-tier grants: the state the worker arms and the calling thread reads.

What a grant is and where it stands in a call's decision: :mod:`attnscope._capture.grants`.
Below both sides: the worker arms sites (:meth:`Grants.arm`, :meth:`Grants.set_trigger`), the
calling thread takes and ends grants on the sampled path.
"""

from __future__ import annotations

import fnmatch
import threading

from .._record.handles import SiteHandle
from .grant import Grant
from .sampler import CallSite, TokenBucket

__all__ = ["Grant", "Grants", "SLOW", "ON_DEMAND", "MAX_TRIGGER_CALLS"]

SLOW = "slow_call"
ON_DEMAND = "on_demand"
# The most calls one trigger can ask for.
MAX_TRIGGER_CALLS = 10_000


class Grants:
    """The process's grants and their counts (``attnscope.stats()``): ``runtime.grants``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.trigger_left = 0
        self.trigger_pattern = "*"
        self.trigger: bool = False  # read without the lock on the sampled path
        self._matches: dict[str, bool] = {}
        self.counts = {"on_demand_granted": 0, "slow_calls": 0, "slow_granted": 0,
                       "slow_lapsed": 0, "slow_lapsed_no_token": 0}

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

    def slow_found(self) -> None:
        """One call found slow (``stats()["slow_calls"]``), whether or not a grant follows."""
        with self.lock:
            self.counts["slow_calls"] += 1

    def arm(self, site: SiteHandle, bucket: tuple[int, ...], link: int, quantile: float,
            tokens: TokenBucket | None = None) -> bool:
        """After a slow call at ``site``: its next call in ``bucket`` gets the profile tier (a
        token of ``tokens`` permitting, which random draws then keep for a slow call). False
        when the site is already armed or not capturing. The worker's one way to change a call
        site: under the lock, and the countdown a plain int write."""
        with self.lock:
            if not isinstance(site, CallSite) or site.grant is not None or site.disabled:
                return False
            grant = Grant(SLOW, bucket, link, quantile)
            grant.left = site.countdown
            site.grant = grant
        if tokens is not None:
            tokens.owe()
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
                if outcome == "slow_lapsed_no_token":  # one of the lapsed, by its reason
                    self.counts["slow_lapsed"] += 1
            if site.grant is grant:
                site.grant = None
                site.countdown = max(1, grant.left) if not site.disabled else site.countdown
