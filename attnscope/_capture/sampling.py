"""Which calls are captured, and in which tier.

Every traced call site keeps a countdown. The hot path only decrements it; when it reaches zero the
call enters :func:`attnscope._capture.decision.decide` (the whole order of a decision, grants and
triggers included), whose sampler part, :func:`decide`, applies forced → rate with warm-up
and overhead budget → parent → profile rate and token bucket, and draws the next countdown from a
geometric distribution, so each call is still sampled independently with the configured
probability. When a step is declared
(:func:`step`), draws come from a generator seeded by ``(seed, step, call site)``, so every process
of a job samples the same calls.

The sampler's state (sites, rates, budget, bucket, counts) is the runtime's
(:mod:`attnscope._runtime.sampler`); this module is the decision that reads it.
"""

from __future__ import annotations

import contextvars
import hashlib
import math
import random
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from .._record.capture import TIER_NONE, TIER_PROFILE, TIER_TIMING
from .._runtime.sampler import (
    FAST_PATH_NS,
    MAX_SITE_ERRORS,
    NEVER,
    CallSite,
    OverheadBudget,
    Sampler,
    TokenBucket,
)

__all__ = [
    "CallSite",
    "Sampler",
    "TokenBucket",
    "OverheadBudget",
    "geometric_draw",
    "decide",
    "parent_context",
    "force",
    "NEVER",
    "MAX_SITE_ERRORS",
    "FAST_PATH_NS",
]


def geometric_draw(rate: float, rnd: Callable[[], float]) -> int:
    """Calls until the next success of a Bernoulli(``rate``) trial, at least 1."""
    if rate >= 1.0:
        return 1
    if rate <= 0.0:
        return NEVER
    u = rnd()
    # 1 - u is in (0, 1]: log is finite.
    return int(math.log(1.0 - u) / math.log1p(-rate)) + 1


def _site_seed(seed: int, step_no: int, key: str) -> int:
    digest = hashlib.blake2b(f"{seed}\x00{step_no}\x00{key}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


# A context key, not process state: (sample, profile) forced by attnscope.sampling() blocks.
force: contextvars.ContextVar[tuple[bool, bool] | None] = contextvars.ContextVar(
    "attnscope_force", default=None
)


def decide(sampler: Sampler, site: CallSite,
           forced_sample: bool | None = None) -> tuple[int, float]:
    """Tier and sampling probability for a call that found ``site.countdown`` exhausted: steps
    1 and 3-6 of :func:`attnscope._capture.decision.decide`. Tier none: not captured."""
    if not sampler.enabled or site.disabled:
        site.countdown = NEVER
        return TIER_NONE, 0.0
    force_blocks = sampler.force_blocks
    forced = force.get() if force_blocks else None
    if forced is not None or forced_sample is not None:
        if force_blocks:
            site.countdown = 1  # stay on the slow path while a forced block is open
        sample = forced_sample if forced_sample is not None else forced[0]  # type: ignore[index]
        if not sample:
            return TIER_NONE, 0.0
        if forced is not None and forced[1] and sampler.bucket.take():
            sampler.count(profile=True)
            return TIER_PROFILE, 1.0
        sampler.count(profile=False)
        return TIER_TIMING, 1.0
    forced_rate = site.forced_rate
    # the budget's scale read here, not through effective_rate: one call less per decision
    if forced_rate is not None:
        rate = forced_rate
    else:
        rate = sampler.rate * sampler.budget.scale if sampler.rate_budgeted else sampler.rate
    if force_blocks:
        # Another context forces capture, so every call here comes through: draw per call.
        site.countdown = 1
        site.calls += 1
        rng = site.rng or sampler.rng
        if forced_rate is None and site.calls <= sampler.warmup:
            return TIER_NONE, 0.0
        if rng.random() >= rate:
            return TIER_NONE, 0.0
    else:
        if site.gen != sampler.gen:
            refreshed = _refresh(sampler, site, rate)
            if refreshed is None:
                return TIER_NONE, 0.0
            rng = refreshed
        else:
            rng = site.rng or sampler.rng
        # This call won the lottery; draw the next one (rate 1, every call: no draw to make).
        draw = 1 if rate >= 1.0 else geometric_draw(rate, rng.random)
        site.countdown = draw
        site.calls += draw
    if forced_rate is None:
        parent = parent_context(sampler)
        if parent is not None and not parent.trace_flags.sampled:
            return TIER_NONE, 0.0
        profile_rate = sampler.profile_rate * sampler.budget.profile_scale \
            if sampler.profile_budgeted else sampler.profile_rate
    else:
        profile_rate = sampler.profile_rate
    if profile_rate > 0 and rng.random() < profile_rate and sampler.bucket.take_random():
        sampler.count(profile=True)
        return TIER_PROFILE, rate
    with sampler.lock:  # sampler.count(profile=False), inlined: the most common sampled call
        sampler.sampled += 1
    return TIER_TIMING, rate

def _current_context_reader() -> Callable[[], Any]:
    """``opentelemetry.context.get_current``, or the one ``ContextVar.get`` it comes down to when
    the runtime context is OpenTelemetry's default (two Python calls fewer on a sampled call)."""
    try:
        otel_context.get_current()  # up to 1.24 the runtime context is made on first use
        runtime_context = getattr(otel_context, "_RUNTIME_CONTEXT", None)
        var = getattr(runtime_context, "_current_context", None)
        if type(runtime_context).__name__ == "ContextVarsRuntimeContext" \
                and isinstance(var, contextvars.ContextVar):
            return var.get
    except Exception:  # noqa: BLE001  (an import must not fail on it: the public call then)
        pass
    return otel_context.get_current


_current_context = _current_context_reader()


def parent_context(sampler: Sampler) -> Any:
    """The application's current span context when it is valid (a parent to link to), else
    None. Asked twice per sampled call (the parent step here, the capture's parent in the
    wrapper); OpenTelemetry contexts are immutable, so the answer is kept for the last
    context object seen (weakly: a dead one cannot match a new one at its address) and the
    second time costs one ``get_current()``."""
    ctx = _current_context()
    seen, parent = sampler.parent
    if seen is not None and seen() is ctx:
        return parent
    span_ctx = otel_trace.get_current_span(ctx).get_span_context()
    parent = span_ctx if span_ctx.is_valid else None
    try:
        sampler.parent = (weakref.ref(ctx), parent)  # one tuple: readers on other threads
    except TypeError:  # a context type without weak references: asked every time
        pass
    return parent

def _refresh(sampler: Sampler, site: CallSite, rate: float) -> random.Random | None:
    """First decision after a config/step change: reseed, apply warm-up, redraw.

    Returns the generator to use when this call wins; None when it does not (warm-up, or the
    redraw lands on a later call).
    """
    site.gen = sampler.gen
    if sampler.step_no is not None:
        site.rng = random.Random(_site_seed(sampler.seed, sampler.step_no, site.key))
    else:
        site.rng = None
    rng = site.rng or sampler.rng
    skip = 0
    if site.forced_rate is None and site.calls < sampler.warmup:
        skip = sampler.warmup - site.calls
        site.calls = sampler.warmup
    # Calls until the next winner, counting this one.
    draw = skip + geometric_draw(rate, rng.random)
    if draw > 1:
        site.countdown = draw - 1
        site.calls += draw - 1 - skip
        return None
    site.calls += 1
    return rng
