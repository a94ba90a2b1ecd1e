"""The worker thread: its queue and lifecycle, resolving device timers, the spare thread, exit.

Reads the Capture records of :mod:`attnscope._record`, never the calling thread's code. Spans
leave through :mod:`attnscope._spans`; profiles are parsed by :mod:`attnscope._profiles`. What a
call's record says (shapes, tokens, FLOPs, fallback, roofline) is derived by
:mod:`attnscope._derive`, which the worker and the span builder both call.
"""
