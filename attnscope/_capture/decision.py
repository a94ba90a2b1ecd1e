"""The one sampling decision of a call that left the fast path: which tier, at which rate.

:func:`decide` is the only entry the wrapper calls; the order of everything that can change a
call's tier is written once, in its docstring.
"""

from __future__ import annotations

from .._record.capture import TIER_NONE, TIER_PROFILE
from . import sampling as _sampling
from .grants import ARMED_CALLS, Grant, Grants, on_demand
from .sampling import CallSite, Sampler

__all__ = ["Decision", "decide"]

# (tier, sample rate, grant still to settle or None); a plain tuple: this is the sampled path.
Decision = tuple[int, float, "Grant | None"]


def decide(sampler: Sampler, grants: Grants, site: CallSite, forced: bool | None) -> Decision:
    """The tier of a call whose site countdown ran out, in this order (the first that applies
    decides):

    1. **off**: attnscope disabled, or the site switched itself off after internal errors: not
       captured (an armed grant lapses).
    2. **escalation grant** (armed by the worker after a slow call, :mod:`.grants`): each armed
       call uses up one call of the site's saved countdown. The call the sampler would have seen
       anyway (the saved countdown ran out, settings or step changed, a forced block is open, or
       the call is forced) is decided by steps 3-6, so the random sample stays what it would
       have been; any other armed call is tier none at rate 1.0 (an extra, non-random capture).
       Either way the grant comes back pending: it is settled on the call's shapes by
       :func:`.grants.settle` before any device work (profile tier when they are in the slow
       call's bucket and the profile token bucket has a token, else the tier decided here; a
       tier none call then goes through). After ``ARMED_CALLS`` armed calls it lapses.
    3. **forced**: ``span(sample=...)`` or an open ``force()`` block: captured or not, at rate
       1.0; the profile tier when the block asks for it and a token is left.
    4. **rate and warm-up** (:func:`.sampling.decide`): the site's own rate, else the configured
       rate scaled down by the **overhead budget**; a site's first ``warmup_calls`` calls are never
       sampled unless it has its own rate. The next countdown is drawn here.
    5. **parent**: under an OpenTelemetry span that is not sampled, not captured (unless the site
       has its own rate).
    6. **profile**: the profile rate (also scaled by the budget) and the per-minute token bucket
       pick the profile tier among sampled calls; the rest are timed.
    7. **trigger** (``attnscope trigger``): a timed call that holds no grant is upgraded to the
       profile tier (an on-demand grant), without the profile rate or the token bucket.

    Past this, the profiler may still refuse a profile-tier call (one session per process, a
    user's profiler): it is then timed. Returns ``(tier, rate, grant)``; tier none with no grant
    means "call through".
    """
    grant = site.grant
    if grant is None or grant.done:
        tier, rate = _sampling.decide(sampler, site, forced)
        grant = None
    else:
        tier, rate, grant = _armed(sampler, grants, site, grant, forced)
    if grants.trigger and grant is None:
        grant = on_demand(grants, site, tier)
        if grant is not None:
            tier = TIER_PROFILE
    return tier, rate, grant


def _armed(sampler: Sampler, grants: Grants, site: CallSite, grant: Grant,
           forced: bool | None) -> Decision:
    """Step 2 of :func:`decide`: a call of a site armed with a slow-call grant."""
    if not sampler.enabled or site.disabled:
        grants.end(site, grant, "slow_lapsed")
        tier, rate = _sampling.decide(sampler, site, forced)
        return tier, rate, None
    grant.calls += 1
    grant.left -= 1
    if grant.left <= 0 or site.gen != sampler.gen or sampler.force_blocks or forced is not None:
        tier, rate = _sampling.decide(sampler, site, forced)  # the call the sampler would see
        grant.left = site.countdown
    else:
        tier, rate = TIER_NONE, 1.0
    site.countdown = 1  # stay armed
    if grant.calls > ARMED_CALLS:
        grants.end(site, grant, "slow_lapsed")
        return tier, rate, None
    return tier, rate, grant
