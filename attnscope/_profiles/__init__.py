"""A profiled call's profiler session, parsed on the worker: kernels, the operator tree, op stats.

:mod:`.session` turns a finished session into span attributes and child spans (and saves its
Chrome trace); :mod:`.kernels` reads the profiler's events, :mod:`.optree` nests the ops as they
ran, :mod:`.opstats` says what they did (attention core, projections, host syncs, copies).
"""
