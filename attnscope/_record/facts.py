"""The typed facts a sampled call carries beside its argument summary.

An ``instrument()`` extractor returns :class:`Facts` (an attention layer's :class:`AttentionFacts`
and :class:`LayerTraits`, or a model forward's :class:`ModelFacts`); a profiled call's SDPA
details travel as :class:`SdpaCall`. All are filled on the calling thread (a device value is
replaced by a :class:`HostCopy` there, after the call) and only read by the worker.
"""

from __future__ import annotations

import enum
from typing import Any, NamedTuple

__all__ = ["AttentionFacts", "ModelFacts", "LayerTraits", "Facts", "NO_FACTS", "BLOCK_FACTS",
           "NOT_READ", "SdpaContext",
           "SdpaCall", "HostKind", "HostCopy"]


class HostKind(str, enum.Enum):
    """What a :class:`HostCopy`'s numbers are (each equal to its name as text)."""

    MASK = "mask"  # the ``reduce.FIELDS`` of a mask read for the copy's ``plan``
    POSITIONS = "positions"  # per key position, the batch rows that see it
    INT = "int"  # one count (a cache length, new tokens, a row sum pair)
    ROWS = "rows"  # inside attnscope.batch(): a mask's per-row counts (``plan``: their shape)
    UNREAD = "unread"  # an empty mask: nothing was copied


class HostCopy:
    """A CUDA value's host copy (pinned), in place of the device tensor (a mask's boolean view, a
    static cache's length, ``generate()``'s ids); ``values`` reads as its numbers (``tolist()``),
    computed by the worker when first read for a mask.

    The worker reads ``values`` only once the capture's device timer is ready (its last event,
    recorded after the copy, has passed); ``kind`` says what they are (:class:`HostKind`):
    for a call whose query length the host did not know, a mask is copied as ``POSITIONS``.
    """

    __slots__ = ("values", "kind", "plan")

    def __init__(self, values: Any, kind: HostKind, plan: Any = None) -> None:
        self.values = values
        self.kind = kind
        self.plan = plan

    def read(self) -> list[int]:
        """The numbers; only after the device timer is ready."""
        return [int(v) for v in self.values.tolist()]


# ``past`` of a cache whose length attnscope cannot read (a cache type it does not know,
# transformers' paged cache of continuous batching): the keys are unknown (``cache_unread``),
# never taken for an empty cache's
NOT_READ = "not read"


# ``packed_q``: the call's rows are ragged sequences packed along the query axis
# (transformers' continuous batching, ``_instrument.packed``), the longest with this many new
# tokens: a step only decodes when it is 1; ``past`` is then all the sequences' keys together,
# no one row's cache length


class AttentionFacts:
    """What an instrumented attention layer knew on the calling thread: ints, dtypes, handles.

    ``past`` is the KV-cache length before the call: an int, or a 0-d tensor copy the worker reads
    (static caches keep it on the device). ``seq_kv`` is set for cross-attention (the source
    length); otherwise the keys are the cache plus this call's tokens. ``mask`` is kept by reference
    and counted on the worker; ``mask_ignores`` flips its meaning (True/nonzero = padding, as in
    ``nn.MultiheadAttention``'s ``key_padding_mask``).
    """

    __slots__ = ("batch", "seq_q", "seq_kv", "past", "cached", "heads", "kv_heads", "head_dim",
                 "head_dim_v", "causal", "window", "dtype", "device", "mask", "mask_ignores",
                 "causal_apart", "key_cap", "key_block", "row_counts", "keys_masked", "packed_q")

    def __init__(self, batch: int, seq_q: int) -> None:
        self.batch = batch
        self.seq_q = seq_q
        self.seq_kv: int | None = None
        self.past: Any = None
        self.cached = False
        self.heads: int | None = None
        self.kv_heads: int | None = None
        self.head_dim: int | None = None
        self.head_dim_v: int | None = None
        self.causal = False
        self.window: int | None = None
        self.dtype: Any = None
        self.device: Any = None
        self.mask: Any = None
        self.mask_ignores = False
        # the layer adds its causal mask itself, apart from ``mask`` (padding only): the mask
        # gives the tokens, ``causal``/``window`` the structure (CLIP before transformers 5)
        self.causal_apart = False
        # the layer keeps at most this many keys per query of those its mask allows (Doge's
        # dynamic mask: top-k over the allowed keys once there are more than k)
        self.key_cap: int | None = None
        # ... in whole blocks of this many keys, the keys past its last whole block kept too
        # (Qwen4-exp's indexer: the top blocks of a token budget)
        self.key_block = 1
        # inside attnscope.batch(), a CUDA mask's per-row counts (reduce.row_numbers) as a
        # HostCopy of kind ROWS (plan: their shape)
        self.row_counts: Any = None
        # cross-attention handed a mask (not kept): the source keys it hides are not read, so
        # the call's least bytes are not known
        self.keys_masked = False
        self.packed_q: int | None = None  # see the note above the class


class ModelFacts:
    """What a traced model forward or generate() call knew on the calling thread."""

    __slots__ = ("batch", "seq_q", "past", "cached", "mask", "generate", "output", "eos",
                 "prompt_len", "row_sums", "packed_q")

    def __init__(self, batch: int, seq_q: int) -> None:
        self.batch = batch
        self.seq_q = seq_q
        self.past: Any = None
        self.cached = False
        self.mask: Any = None  # (batch, keys) padding mask (1 = real) or a 4-D attention mask
        self.generate = False
        self.output: Any = None  # generate(): the returned ids, set after the call
        self.eos: tuple[int, ...] = ()
        self.prompt_len: int | None = None  # leading ids of the output that are not new tokens
        # a CUDA padding mask's (Σ N_Q², Σ N_Q·N_KV), a HostCopy of two (reduce.row_sums)
        self.row_sums: Any = None
        self.packed_q: int | None = None  # as AttentionFacts's


class LayerTraits(NamedTuple):
    """What a layer's own structure says beyond its facts, for derive on the worker (read once,
    when instrumenting: ``_instrument.facts.layer_traits``; a layer with none has none)."""

    chunk: int | None = None  # chunked attention (Llama 4): ``facts.chunk_size``
    band: tuple[int, int] | None = None  # blocked local attention (LongT5): ``facts.blocked_band``
    # an encoder layer (``is_decoder=False``) given a cache (BERT-style models run as causal LMs
    # without ``is_decoder=True``): bidirectional, so a one-query step is not called causal
    bidirectional: bool = False
    # the layer's window is its config's only (no attribute of its own): a model applies such a
    # window in the mask it builds, so a mask that could show it and does not says it is not
    # applied (Moshi sets config.sliding_window and never uses it)
    config_window: bool = False
    # attention cores one call of the layer runs over the same queries and keys: differential
    # attention (DiffLlama) runs two, one per half of V (``facts.attention_cores``)
    cores: int = 1
    # compressed KV entries appended to the window's keys (DeepSeek V4): (rate, top-k) of
    # ``facts.compressed_keys``, and the tokens its cache had seen before the call (set per call)
    compressed: tuple[int, int] | None = None
    seen: int | None = 0  # None: the cache does not say


class Facts(NamedTuple):
    """What an ``instrument()`` extractor found for one call; :data:`NO_FACTS`: nothing (a plain
    traced call: its argument summary says everything)."""

    attention: AttentionFacts | None = None  # an attention layer's call
    traits: LayerTraits | None = None  # ... and what its structure adds (None: nothing)
    model: ModelFacts | None = None  # a model's forward or generate() call


# The sentinel of "nothing found": the call's arguments are summarised instead (an extractor
# returns None for it).
NO_FACTS = Facts()
# A call with no facts of its own whose arguments are not summarised either: an instrumented
# block (a decoder layer), whose span is its time and operators. Not NO_FACTS (identity).
BLOCK_FACTS = Facts()


class SdpaContext(NamedTuple):
    """A profiled SDPA call's query, key and value last-dimension strides and the backends the
    program allows (``sdpa_kernel`` sets torch's global flags for its block): what its fallback
    verdict needs and its argument summary lacks."""

    strides: tuple[int, ...]
    allowed: tuple[str, ...]


class SdpaCall:
    """The SDPA call a profiled call's fallback verdict reads (``_capture.inner_sdpa``).

    For a call of ``instrument_sdpa()``: its own :class:`SdpaContext` (``inner`` None: the call's
    own summary holds the arguments). For any other profiled call: the first SDPA call made
    inside it, filled while it runs, on the calling thread: its argument summary (no tensor kept)
    in ``inner`` and its context; empty when none ran.
    """

    __slots__ = ("context", "inner")

    def __init__(self, context: SdpaContext | None = None,
                 inner: list[tuple[str, Any]] | None = None) -> None:
        self.context = context
        self.inner = inner
