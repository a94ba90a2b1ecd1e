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

from collections.abc import Sequence
from typing import Any

from .._record.buckets import bucket as bucket_of
from .._record.capture import NO_FACTS, TIER_NONE, TIER_PROFILE, TIER_TIMING, Facts
from .._runtime.grants import MAX_TRIGGER_CALLS, ON_DEMAND, SLOW, Grant, Grants
from .sampling import CallSite, Sampler

__all__ = ["Grant", "Grants", "settle", "on_demand", "SLOW", "ON_DEMAND", "ARMED_CALLS",
           "MAX_TRIGGER_CALLS"]

# Calls an armed site may make without matching the grant's bucket before the grant lapses.
ARMED_CALLS = 256


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
        sampler.bucket.paid()
        grant.extra = tier == TIER_NONE
        grants.end(site, grant, "slow_granted")
        return TIER_PROFILE, grant
    grants.end(site, grant, "slow_lapsed_no_token")  # the per-minute limit still holds
    return tier, None


def on_demand(grants: Grants, site: CallSite, tier: int) -> Grant | None:
    """A sampled call (timing tier) upgraded by a trigger: an on-demand grant, or None."""
    if tier == TIER_TIMING and grants.take_trigger(site):
        return Grant(ON_DEMAND)
    return None
