"""The calling thread's side: the one fast path, sampling, and what a sampled call records.

Nothing here imports the worker, the exporters or the OpenTelemetry SDK: a finished Capture
leaves through ``runtime.worker.submit`` (:mod:`attnscope._runtime`).
"""
