"""The worker thread: its queue and lifecycle, resolving device timers, the spare thread, exit.

Reads the Capture records of :mod:`attnscope._record`, never the calling thread's code. Spans
leave through :mod:`attnscope._spans`; profiles are parsed by :mod:`attnscope._profiles`. The
derivation (derive, derived, narrowed, shapecache, fallback, latency, roofline) is still here,
on its way to a package of its own below ``_spans``.
"""
