"""The plain record both sides share: the Capture a sampled call fills (``capture``), its typed
facts (``facts``), the Protocols of the calling-side objects it refers to (``handles``), the mask
reductions whose counts it may carry (``reduce``), a call's shape bucket (``buckets``), a batch
block's and a CUDA graph's records (``batches``, ``graphs``).

The calling side (:mod:`attnscope._capture`, :mod:`attnscope.instrument`) and the worker
(:mod:`attnscope._worker`) both import this package; neither imports the other. Nothing here
imports the SDK or either side; only :mod:`.reduce` imports torch.
"""
