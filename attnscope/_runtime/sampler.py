"""The sampler's state: call sites, rates, the overhead budget, the profile token bucket.

State only, below both sides: the calling side decides with it
(:mod:`attnscope._capture.sampling`, :mod:`attnscope._capture.decision`), the worker side arms
grants on its sites and reads its counts. Nothing here imports OpenTelemetry or the calling side.
"""

from __future__ import annotations

import random
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import _log
from .._config import Config, budgeted

if TYPE_CHECKING:
    from .._record.facts import Facts, SdpaCall
    from .grant import Grant

__all__ = ["CallSite", "Sampler", "SpanSites", "TokenBucket", "OverheadBudget", "NEVER",
           "MAX_SITE_ERRORS", "FAST_PATH_NS"]

# "Never" for a countdown; large enough that no process reaches it.
NEVER = 1 << 62
# After this many internal errors a call site stops capturing (and says so once).
MAX_SITE_ERRORS = 5
# Cost of the unsampled path (a decrement and a compare), charged to the overhead budget per call.
FAST_PATH_NS = 40


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
        self.grant: Grant | None = None


class TokenBucket:
    """At most ``per_minute`` grants per minute, bursting to ``max(1, per_minute)``.

    Random profile draws (:meth:`take_random`) share it with slow-call grants and forced
    profiles (:meth:`take`). Once a slow call has wanted a token (:meth:`owe`) and until one
    goes to a slow-call grant (:meth:`paid`), a random draw right after another random one
    leaves the bucket's last token. Without that, in a busy service the random draws, far more
    frequent, take each token as it comes back and no slow call is ever followed by a profile;
    with it the two alternate, under the same limit. A bucket of one token keeps nothing back.
    """

    def __init__(self, per_minute: float, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._owed = False  # a slow call wanted a token since the last one a slow call got
        self._last_random = True  # the last token went to a random draw
        self.set_rate(per_minute)

    def set_rate(self, per_minute: float) -> None:
        with self._lock:
            self.per_minute = per_minute
            self.capacity = max(1.0, per_minute) if per_minute > 0 else 0.0
            self.tokens = self.capacity
            self.stamp = self._clock()

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def owe(self) -> None:
        """A slow call wants a token (its grant was armed): random draws leave one for it."""
        self._owed = True  # a plain write: read under the lock by take_random

    def paid(self) -> None:
        """A slow-call grant got its profile (a token it took, or a random draw's): the next
        token is a random draw's as much as a slow call's."""
        with self._lock:
            self._owed = self._last_random = False

    def take(self) -> bool:
        """A token for a slow-call grant or a forced profile, if there is one (a forced profile
        leaves the turn as it was)."""
        with self._lock:
            return self._take(1.0)

    def take_random(self) -> bool:
        """A token for a random profile draw, if there is one it may take."""
        with self._lock:
            keep = self._owed and self._last_random and self.capacity >= 2.0
            taken = self._take(2.0 if keep else 1.0)
            if taken:
                self._last_random = True
            return taken

    def _take(self, need: float) -> bool:
        now = self._clock()
        self.tokens = min(self.capacity,
                          self.tokens + (now - self.stamp) * self.per_minute / 60.0)
        self.stamp = now
        if self.tokens >= need:
            self.tokens -= 1.0
            return True
        return False


class OverheadBudget:
    """Keeps attnscope's own calling-thread cost at or below ``budget`` of the wrapped wall time.

    Costs and wall times are added per sampled call; unsampled calls are accounted for by
    re-weighting (wall / rate) and a fixed per-call cost. Once per ``window_s`` two scales move
    down (over budget) or back up toward 1 (well under): ``scale``, of the sample rate, against
    the timed calls' cost, and ``profile_scale``, of the profile rate, against what the profiled
    calls cost in the room the timed ones leave (a profile rate the application chose, which
    the budget keeps, has its calls' cost count against the sample rate instead, as one
    budget). A profiled call costs the calling thread hundreds of times a timed one (the
    profiler's start and stop): with one scale, a profile or two in a window cut the sample
    rate, so the calls that are sampled stopped being the configured share of all calls. The
    first time either moves down, one WARNING says so and names the setting that lifts it:
    sampling fewer calls than configured is never silent.
    """

    MIN_SCALE = 1e-4

    def __init__(self, budget: float, window_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, profiles_governed: bool = True
                 ) -> None:
        self.budget = budget
        # False: a profile rate the application chose, which the budget keeps; the profiled
        # calls' cost then comes out of the sample rate, as one budget
        self.profiles_governed = profiles_governed
        self.window_s = window_s
        self._clock = clock
        self.scale = 1.0
        self.profile_scale = 1.0
        self.last_ratio = 0.0
        self._own_ns = 0.0
        self._profile_ns = 0.0  # the profiled calls' own cost (in the profile tier)
        self._wall_ns = 0.0
        self._window_start = clock()
        self._lock = threading.Lock()
        self.told = False  # the throttling line was logged (once per configuration)

    def add(self, own_ns: int, wall_ns: int, rate: float, profiled: bool = False) -> None:
        """One sampled call: our cost, its wall time, the rate that sampled it; ``profiled``: it
        was in the profile tier."""
        if self.budget >= 1.0:  # 1.0 means "no budget": nothing to adapt
            return
        weight = 1.0 / rate if rate > 0 else 1.0
        now = self._clock()
        with self._lock:  # sampled calls on several threads: no lost additions
            # Unsampled siblings cost only the fast path; the sampled call costs what we measured.
            fast = FAST_PATH_NS * max(0.0, weight - 1.0)
            if profiled:
                self._profile_ns += own_ns
                self._own_ns += fast
            else:
                self._own_ns += own_ns + fast
            self._wall_ns += wall_ns * weight
            if now - self._window_start >= self.window_s:
                self._adjust(now)
            tell = (self.scale < 1.0 or self.profile_scale < 1.0) and not self.told
            if tell:
                self.told = True
        if tell:  # logged outside the lock: a handler may be slow
            self._tell()

    def _tell(self) -> None:
        ratio, scale = round(self.last_ratio, 4), round(self.scale, 4)
        profile_scale = round(self.profile_scale, 4)
        if scale < 1.0:
            what = (f"calls than configured: its own cost, {ratio} of the traced calls' time, is "
                    f"over overhead_budget={self.budget}, so the rates it governs are scaled by "
                    f"{scale} (each span's attnscope.sample_rate says by how much)")
        else:
            what = (f"calls for the profile tier than configured: its own cost, {ratio} of the "
                    f"traced calls' time, is over overhead_budget={self.budget} with the "
                    f"profiled calls, so the profile rate is scaled by {profile_scale} (the "
                    "sample rate is not)")
        _log.warn_once("overhead-budget",
            f"attnscope: sampling fewer {what}. overhead_budget=1.0 (ATTNSCOPE_OVERHEAD_BUDGET=1) "
            "samples at the configured rates",
            overhead_budget=self.budget, overhead_ratio=ratio, scale=scale,
            profile_scale=profile_scale)

    def after_fork(self) -> None:
        self._lock = threading.Lock()

    def _adjust(self, now: float) -> None:
        """Close the window and move the scales (lock held): the sample rate's against the
        timed calls' cost and the budget, the profile rate's against the profiled calls' cost
        and what the timed ones leave of the budget."""
        own, profiled, wall = self._own_ns, self._profile_ns, self._wall_ns
        self._own_ns = self._profile_ns = self._wall_ns = 0.0
        self._window_start = now
        if wall <= 0:
            return
        timed, profiles = own / wall, profiled / wall
        self.last_ratio = timed + profiles
        if not self.profiles_governed:
            timed, profiles = timed + profiles, 0.0
        self.scale = self._moved(self.scale, timed, self.budget)
        self.profile_scale = self._moved(self.profile_scale, profiles,
                                         max(0.0, self.budget - timed))

    def _moved(self, scale: float, ratio: float, room: float) -> float:
        """``scale`` after a window that cost ``ratio`` where ``room`` was allowed: down over it
        (by ``0.8·room/ratio``, at most 10×), back up ×1.5 under half of it."""
        if ratio > room:
            return max(self.MIN_SCALE, scale * max(0.1, 0.8 * room / ratio))
        if ratio < 0.5 * room and scale < 1.0:
            return min(1.0, scale * 1.5)
        return scale


class Sampler:
    """Process-wide sampling state: rates, budget, profile bucket, step, forced blocks, the
    registered call sites. The decision that reads it is the calling side's
    (:func:`attnscope._capture.sampling.decide`).

    ``sampled`` and ``profile_granted`` are exact under threads (counted under the lock, which
    only sampled calls take).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._sites: weakref.WeakSet[CallSite] = weakref.WeakSet()
        self.lock = threading.Lock()
        self.rng = random.Random()  # draws of sites without a step's own generator
        # (the last OpenTelemetry context seen, weakly; its valid span context or None), kept by
        # attnscope._capture.sampling.parent_context
        self.parent: tuple[weakref.ref[Any] | None, Any] = (None, None)
        self.gen = 0
        self.step_no: int | None = None
        self.reset()

    def reset(self) -> None:
        """Defaults and zero counts; registered call sites are kept (they live in user code)."""
        with self.lock:
            # the forced blocks open (sampling()), by key: truthy while any is
            self.force_blocks: dict[object, None] = {}
            self.step_no = None
            self.sampled = 0
            self.profile_granted = 0
        self.apply(Config())

    def after_fork(self) -> None:
        """New locks: a forked child may have inherited them held. A new seed: else a child
        drew the same countdowns as its parent and its siblings (preforked server workers
        sampled the same calls); a step's generators stay seeded by ``seed`` as configured."""
        self.lock = threading.Lock()
        self.rng = random.Random()
        self.bucket.after_fork()
        self.budget.after_fork()

    def count(self, profile: bool) -> None:
        """One sampled call (``profile``: in the profile tier)."""
        with self.lock:
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
        # 1.0: the wrapper skips it
        self.budget = OverheadBudget(budget, clock=self._clock,
                                     profiles_governed=self.profile_budgeted)
        for site in list(self._sites):
            site.grant = None  # slow-call grants the worker armed (capture.grants): dropped
        self._invalidate()

    def _invalidate(self) -> None:
        """Make every site's next call enter decide()."""
        with self.lock:
            self.gen += 1
            for site in list(self._sites):
                site.countdown = 0

    def register(self, site: CallSite) -> None:
        with self.lock:
            self._sites.add(site)

    def set_step(self, step_no: int | None) -> None:
        self.step_no = step_no
        self._invalidate()

    def force_enter(self, key: object) -> None:
        """Open a forced block under ``key``. One dict store, no call before it: a Ctrl-C in
        here leaves the block open or not, and the caller's ``finally`` closes it either way
        (``force_blocks.pop(key, None)``, inline: the first line of a function of its own would
        be one more place for the Ctrl-C to land first)."""
        self.force_blocks[key] = None
        self._invalidate()

    def force_exit(self, key: object) -> None:
        """Close the forced block ``key`` (closed already: only what follows); after the last,
        the sites left on the slow path go back to their countdowns."""
        self.force_blocks.pop(key, None)
        if not self.force_blocks:
            self._invalidate()

    @property
    def effective_rate(self) -> float:
        return self.rate * self.budget.scale if self.rate_budgeted else self.rate

    @property
    def effective_profile_rate(self) -> float:
        return self.profile_rate * self.budget.profile_scale if self.profile_budgeted \
            else self.profile_rate

    def site_error(self, site: CallSite) -> bool:
        """Count an internal error at ``site``; True when the site has just switched itself off."""
        site.errors += 1
        if site.errors >= MAX_SITE_ERRORS and not site.disabled:
            site.disabled = True
            site.countdown = NEVER
            return True
        return False


class SpanSites:
    """``span(name)`` call sites by name (attnscope._capture.block), bounded there."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.by_name: dict[str, CallSite] = {}

    def after_fork(self) -> None:
        self.lock = threading.Lock()
