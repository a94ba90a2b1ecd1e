"""Attention arithmetic, apart from threads and OpenTelemetry: what a call's shapes, masks and
layer structure say about its work.

``flops`` counts the (query, key) pairs a causal or windowed mask leaves and their FLOPs;
``masks`` reads a mask's counts (tokens, causality, window, pairs); ``traffic`` the least bytes
a call moves; ``families`` holds one module per model family whose attention differs from the
plain layer (how its layers are recognised, what they carry to the worker, and their rule).
Imported by the worker (``_derive.call``) and by ``_instrument`` (the detectors); it imports
``_record`` only, never either side, ``_runtime`` or OpenTelemetry.
"""
