"""What :func:`attnscope.stats` returns, key by key (docs/sampling.md, docs/live.md,
docs/profiling.md say what each counts). For the type checker: every key is there from the
start (zeros before the first sampled call); tests/test_public_api.py pins the keys to
``stats()``'s. Imports nothing.
"""

from __future__ import annotations

from typing import TypedDict

__all__ = ["Stats"]


class Stats(TypedDict):
    """The live numbers of :func:`attnscope.stats`."""

    # rates: as configured, and in force after the overhead budget
    sample_rate: float
    effective_sample_rate: float
    profile_rate: float
    effective_profile_rate: float
    overhead_budget: float
    overhead_ratio: float
    # the sampler's decisions
    sampled: int
    profile_granted: int
    internal_errors: int
    # sampled calls, from capture to export (every worker of the process)
    captured: int
    emitted: int
    dropped_queue_full: int
    dropped_trace_cap: int
    orphaned: int
    pending: int
    worker_errors: int
    spans_to_export: int
    exported: int
    export_failed: int
    export_dropped: int
    export_in_flight: int
    # the profile tier: calls that ran under the profiler, and those timed instead (by reason)
    profiled: int
    profile_skipped_warming: int
    profile_skipped_user_profiler: int
    profile_skipped_nested: int
    profile_skipped_busy: int
    profile_skipped_sync_debug: int
    profile_skipped_error: int
    # slow calls and on-demand triggers (docs/live.md)
    on_demand_remaining: int
    on_demand_granted: int
    slow_calls: int
    slow_granted: int
    slow_lapsed: int
    slow_lapsed_no_token: int  # of slow_lapsed: the token bucket had none (the rest: no match)
    # CUDA graph replays (docs/profiling.md#cuda-graphs)
    graph_replays_sampled: int
    graph_replays_lost: int
    graph_calls_over_cap: int
