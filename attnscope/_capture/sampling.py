"""Which calls are captured, and in which tier.

Every traced call site keeps a countdown. The hot path only decrements it; when it reaches zero the
call enters :func:`attnscope._capture.decision.decide` (the whole order of a decision, grants and
triggers included), whose sampler part, :meth:`Sampler.decide`, applies forced → rate with warm-up
and overhead budget → parent → profile rate and token bucket, and draws the next countdown from a
geometric distribution, so each call is still sampled independently with the configured
probability. When a step is declared
(:func:`step`), draws come from a generator seeded by ``(seed, step, call site)``, so every process
of a job samples the same calls.
"""

from __future__ import annotations

import contextvars
import hashlib
import math
import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from .._config import Config, budgeted
from .._record.capture import TIER_NONE, TIER_PROFILE, TIER_TIMING
from .._record.facts import Facts, SdpaCall

__all__ = [
    "CallSite",
    "Sampler",
    "TokenBucket",
    "OverheadBudget",
    "geometric_draw",
    "force",
]

# "Never" for a countdown; large enough that no process reaches it.
NEVER = 1 << 62
# After this many internal errors a call site stops capturing (and says so once).
MAX_SITE_ERRORS = 5
# Cost of the unsampled path (a decrement and a compare), charged to the overhead budget per call.
FAST_PATH_NS = 40


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


class CallSite:
    """Per-site sampling state. ``countdown`` is the only field the hot path touches."""

    __slots__ = (
        "countdown", "key", "name", "forced_rate", "attributes", "param_names", "kind",
        "rng", "gen", "calls", "errors", "disabled", "step_no", "extractor", "on_result",
        "on_profile", "grant", "__weakref__",
    )

    def __init__(
        self,
        key: str,
        name: str,
        forced_rate: float | None = None,
        attributes: dict[str, Any] | None = None,
        param_names: tuple[str, ...] = (),
        kind: str = "function",
    ) -> None:
        self.countdown = 1  # the first call enters decide() to set the site up
        self.key = key
        self.name = name
        self.forced_rate = forced_rate
        self.attributes = attributes or {}
        self.param_names = param_names
        self.kind = kind
        self.rng: random.Random | None = None
        self.gen = -1
        self.calls = 0  # calls seen (counted in countdown-sized chunks)
        self.errors = 0
        self.disabled = False
        self.step_no: int | None = None
        # Optional (instance, args, kwargs) -> Facts | None run by sampled calls on the calling
        # thread to gather cheap facts (shapes, ints); see attnscope._instrument.
        self.extractor: Callable[[Any, tuple[Any, ...], dict[str, Any]], Facts | None] | None = None
        # Optional (capture, result) -> None run on the calling thread after a call that
        # returned, before the capture is handed over (generate(): the returned ids).
        self.on_result: Callable[[Any, Any], None] | None = None
        # Optional (args, kwargs) -> SdpaCall | None run on the calling thread for a call that
        # gets the profile tier only: facts a profiled call's verdicts need and a timed call
        # should not pay for (an SDPA call's strides and the sdpa_kernel context in force).
        # None: capture.inner_sdpa.arm, which records the first SDPA call inside the call.
        self.on_profile: Callable[[tuple[Any, ...], dict[str, Any]],
                                  SdpaCall | None] | None = None
        # A profile-tier grant the worker armed this site with (capture.grants); read only on
        # the sampled path.
        self.grant: Any = None


class TokenBucket:
    """At most ``per_minute`` grants per minute, bursting to ``max(1, per_minute)``."""

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self.set_rate(per_minute)

    def set_rate(self, per_minute: float) -> None:
        with self._lock:
            self.per_minute = per_minute
            self.capacity = max(1.0, per_minute) if per_minute > 0 else 0.0
            self.tokens = self.capacity
            self.stamp = self._clock()

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def take(self) -> bool:
        with self._lock:
            now = self._clock()
            self.tokens = min(self.capacity,
                              self.tokens + (now - self.stamp) * self.per_minute / 60.0)
            self.stamp = now
            if self.tokens >= 1.0:
                self.tokens -= 1.0
                return True
            return False


class OverheadBudget:
    """Keeps attnscope's own calling-thread cost at or below ``budget`` of the wrapped wall time.

    Costs and wall times are added per sampled call; unsampled calls are accounted for by
    re-weighting (wall / rate) and a fixed per-call cost. Once per ``window_s`` the scale applied to
    the rates it governs (:func:`attnscope._config.budgeted`) moves down (over budget) or back up
    toward 1 (well under). The first time it moves down, one WARNING says so and names the setting
    that lifts it: sampling fewer calls than configured is never silent.
    """

    MIN_SCALE = 1e-4
    # (key, message, fields) -> None: attnscope._log's WARNING, set by that module (this one is
    # below it: _log's state imports it)
    say: Callable[[str, str, dict[str, Any]], None] | None = None

    def __init__(self, budget: float, window_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.budget = budget
        self.window_s = window_s
        self._clock = clock
        self.scale = 1.0
        self.last_ratio = 0.0
        self._own_ns = 0.0
        self._wall_ns = 0.0
        self._window_start = clock()
        self._lock = threading.Lock()
        self.told = False  # the throttling line was logged (once per configuration)

    def add(self, own_ns: int, wall_ns: int, rate: float) -> None:
        """One sampled call: our cost, its wall time, the rate that sampled it."""
        if self.budget >= 1.0:  # 1.0 means "no budget": nothing to adapt
            return
        weight = 1.0 / rate if rate > 0 else 1.0
        now = self._clock()
        with self._lock:  # sampled calls on several threads: no lost additions
            # Unsampled siblings cost only the fast path; the sampled call costs what we measured.
            self._own_ns += own_ns + FAST_PATH_NS * max(0.0, weight - 1.0)
            self._wall_ns += wall_ns * weight
            if now - self._window_start >= self.window_s:
                self._adjust(now)
            tell = self.scale < 1.0 and not self.told
            if tell:
                self.told = True
        if tell:  # logged outside the lock: a handler may be slow
            self._tell()

    def _tell(self) -> None:
        say = self.say
        if say is None:
            return
        ratio, scale = round(self.last_ratio, 4), round(self.scale, 4)
        say("overhead-budget",
            f"attnscope: sampling fewer calls than configured: its own cost, {ratio} of the "
            f"traced calls' time, is over overhead_budget={self.budget}, so the rates it governs "
            f"are scaled by {scale} (each span's attnscope.sample_rate says by how much). "
            "overhead_budget=1.0 (ATTNSCOPE_OVERHEAD_BUDGET=1) samples at the configured rates",
            {"overhead_budget": self.budget, "overhead_ratio": ratio, "scale": scale})

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def _adjust(self, now: float) -> None:
        """Close the window and move the scale (lock held)."""
        own, wall = self._own_ns, self._wall_ns
        self._own_ns = self._wall_ns = 0.0
        self._window_start = now
        if wall <= 0:
            return
        ratio = own / wall
        self.last_ratio = ratio
        if ratio > self.budget:
            self.scale = max(self.MIN_SCALE, self.scale * max(0.1, 0.8 * self.budget / ratio))
        elif ratio < 0.5 * self.budget and self.scale < 1.0:
            self.scale = min(1.0, self.scale * 1.5)


# A context key, not process state: (sample, profile) forced by attnscope.sampling() blocks.
force: contextvars.ContextVar[tuple[bool, bool] | None] = contextvars.ContextVar(
    "attnscope_force", default=None
)


class Sampler:
    """Process-wide sampling state: rates, budget, profile bucket, step, forced blocks.

    ``sampled`` and ``profile_granted`` are exact under threads (counted under the lock, which
    only sampled calls take).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sites: weakref.WeakSet[CallSite] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._rng = random.Random()
        # (the last OpenTelemetry context seen, weakly; its valid span context or None)
        self._parent: tuple[weakref.ref[Any] | None, Any] = (None, None)
        self.gen = 0
        self.step_no: int | None = None
        self.reset()

    def reset(self) -> None:
        """Defaults and zero counts; registered call sites are kept (they live in user code)."""
        with self._lock:
            self.force_blocks = 0
            self.step_no = None
            self.sampled = 0
            self.profile_granted = 0
        self.apply(Config())

    def after_fork(self) -> None:
        """New locks: a forked child may have inherited them held."""
        self._lock = threading.Lock()
        self.bucket.after_fork()
        self.budget.after_fork()

    def _count(self, profile: bool) -> None:
        with self._lock:
            self.sampled += 1
            if profile:
                self.profile_granted += 1

    # -- configuration -----------------------------------------------------------------------
    def apply(self, cfg: Config) -> None:
        """Take new settings; every site re-reads them on its next decision."""
        self.enabled = cfg.enabled
        self.rate = cfg.sample_rate
        self.profile_rate = cfg.profile_rate
        self.warmup = cfg.warmup_calls
        self.seed = cfg.seed
        self.reset_peak = cfg.reset_peak_memory_stats
        self.graph_marks = cfg.compiled_graph_marks  # read by compiled code's tracing only
        self.bucket = TokenBucket(cfg.profile_max_per_minute, self._clock)
        budget, self.rate_budgeted, self.profile_budgeted = budgeted(cfg)
        self.budget = OverheadBudget(budget, clock=self._clock)  # 1.0: the wrapper skips it
        for site in list(self._sites):
            site.grant = None  # slow-call grants the worker armed (capture.grants): dropped
        self._invalidate()

    def _invalidate(self) -> None:
        """Make every site's next call enter decide()."""
        with self._lock:
            self.gen += 1
            for site in list(self._sites):
                site.countdown = 0

    def register(self, site: CallSite) -> None:
        with self._lock:
            self._sites.add(site)

    def set_step(self, step_no: int | None) -> None:
        self.step_no = step_no
        self._invalidate()

    def force_enter(self) -> None:
        with self._lock:
            self.force_blocks += 1
        self._invalidate()

    def force_exit(self) -> None:
        with self._lock:
            self.force_blocks = max(0, self.force_blocks - 1)
            last = self.force_blocks == 0
        if last:
            self._invalidate()  # sites left on the slow path go back to countdowns

    @property
    def effective_rate(self) -> float:
        return self.rate * self.budget.scale if self.rate_budgeted else self.rate

    @property
    def effective_profile_rate(self) -> float:
        return self.profile_rate * self.budget.scale if self.profile_budgeted \
            else self.profile_rate

    # -- the decision ---------------------------------------------------------------------------
    def decide(self, site: CallSite, forced_sample: bool | None = None) -> tuple[int, float]:
        """Tier and sampling probability for a call that found ``site.countdown`` exhausted: steps
        1 and 3-6 of :func:`attnscope._capture.decision.decide`. Tier none: not captured."""
        if not self.enabled or site.disabled:
            site.countdown = NEVER
            return TIER_NONE, 0.0
        force_blocks = self.force_blocks
        forced = force.get() if force_blocks else None
        if forced is not None or forced_sample is not None:
            if force_blocks:
                site.countdown = 1  # stay on the slow path while a forced block is open
            sample = forced_sample if forced_sample is not None else forced[0]  # type: ignore[index]
            if not sample:
                return TIER_NONE, 0.0
            if forced is not None and forced[1] and self.bucket.take():
                self._count(profile=True)
                return TIER_PROFILE, 1.0
            self._count(profile=False)
            return TIER_TIMING, 1.0
        forced_rate = site.forced_rate
        # the budget's scale read here, not through effective_rate: one call less per decision
        if forced_rate is not None:
            rate = forced_rate
        else:
            rate = self.rate * self.budget.scale if self.rate_budgeted else self.rate
        if force_blocks:
            # Another context forces capture, so every call here comes through: draw per call.
            site.countdown = 1
            site.calls += 1
            rng = site.rng or self._rng
            if forced_rate is None and site.calls <= self.warmup:
                return TIER_NONE, 0.0
            if rng.random() >= rate:
                return TIER_NONE, 0.0
        else:
            if site.gen != self.gen:
                refreshed = self._refresh(site, rate)
                if refreshed is None:
                    return TIER_NONE, 0.0
                rng = refreshed
            else:
                rng = site.rng or self._rng
            # This call won the lottery; draw the next one (rate 1, every call: no draw to make).
            draw = 1 if rate >= 1.0 else geometric_draw(rate, rng.random)
            site.countdown = draw
            site.calls += draw
        if forced_rate is None:
            parent = self.parent_context()
            if parent is not None and not parent.trace_flags.sampled:
                return TIER_NONE, 0.0
            profile_rate = self.profile_rate * self.budget.scale if self.profile_budgeted \
                else self.profile_rate
        else:
            profile_rate = self.profile_rate
        if profile_rate > 0 and rng.random() < profile_rate and self.bucket.take():
            self._count(profile=True)
            return TIER_PROFILE, rate
        with self._lock:  # _count(profile=False), inlined: the most common sampled call
            self.sampled += 1
        return TIER_TIMING, rate

    def parent_context(self) -> Any:
        """The application's current span context when it is valid (a parent to link to), else
        None. Asked twice per sampled call (the parent step here, the capture's parent in the
        wrapper); OpenTelemetry contexts are immutable, so the answer is kept for the last
        context object seen (weakly: a dead one cannot match a new one at its address) and the
        second time costs one ``get_current()``."""
        ctx = otel_context.get_current()
        seen, parent = self._parent
        if seen is not None and seen() is ctx:
            return parent
        span_ctx = otel_trace.get_current_span(ctx).get_span_context()
        parent = span_ctx if span_ctx.is_valid else None
        try:
            self._parent = (weakref.ref(ctx), parent)  # one tuple: readers on other threads
        except TypeError:  # a context type without weak references: asked every time
            pass
        return parent

    def _refresh(self, site: CallSite, rate: float) -> random.Random | None:
        """First decision after a config/step change: reseed, apply warm-up, redraw.

        Returns the generator to use when this call wins; None when it does not (warm-up, or the
        redraw lands on a later call).
        """
        site.gen = self.gen
        if self.step_no is not None:
            site.rng = random.Random(_site_seed(self.seed, self.step_no, site.key))
        else:
            site.rng = None
        rng = site.rng or self._rng
        skip = 0
        if site.forced_rate is None and site.calls < self.warmup:
            skip = self.warmup - site.calls
            site.calls = self.warmup
        # Calls until the next winner, counting this one.
        draw = skip + geometric_draw(rate, rng.random)
        if draw > 1:
            site.countdown = draw - 1
            site.calls += draw - 1 - skip
            return None
        site.calls += 1
        return rng

    def site_error(self, site: CallSite) -> bool:
        """Count an internal error at ``site``; True when the site has just switched itself off."""
        site.errors += 1
        if site.errors >= MAX_SITE_ERRORS and not site.disabled:
            site.disabled = True
            site.countdown = NEVER
            return True
        return False
