"""The worker thread's side: resolve device timers, derive attributes, parse profiles, build spans.

Reads the Capture records of :mod:`attnscope._record`, never the calling thread's code.
"""
