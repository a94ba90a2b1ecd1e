"""What a call's record says, derived after the fact: shapes, heads, tokens, exact FLOPs, the
SDPA backend its inputs allowed, and its place under the device's roofline.

``call`` derives a call's (or a model forward's, through ``model``) facts as a ``result.Derived``;
``beyond_mask`` adds the keys a layer attends to that its mask does not show; ``fallback`` judges
a profiled SDPA call's backend; ``roofline`` places a call under the device's peaks. Called by the
worker (``_worker.engine``) and by the span builder (``_spans.calls``); it imports neither of
them, nor the calling side, the exporters or OpenTelemetry: no thread and no span is made here.
"""

__all__: list[str] = []
