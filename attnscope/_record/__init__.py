"""The plain record both sides share: the Capture a sampled call fills, the mask reductions whose
counts it may carry, and a call's shape bucket.

The calling side (:mod:`attnscope._capture`, :mod:`attnscope.instrument`) and the worker
(:mod:`attnscope._worker`) both import this package; neither imports the other. Nothing here
imports the SDK or either side; only :mod:`.reduce` imports torch.
"""
