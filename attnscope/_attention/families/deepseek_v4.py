"""DeepSeek V4's compressed keys: compressed KV entries appended to the keys of the window.

Detector: a ``compressor`` child with ``compress_rate`` (and an ``indexer`` with ``index_topk``).
Extractor tweak: the tokens the layer's cache has taken in before the call (:func:`tokens_seen`),
which say how many entries are closed. Rule: the entries each query sees
(:func:`compressed_pairs`), added on the worker (``_derive.beyond_mask.add_compressed``).
"""

from __future__ import annotations

from typing import Any

from .base import Family, pos_int

__all__ = ["FAMILY", "compressed_keys", "tokens_seen", "compressed_pairs"]


def compressed_keys(module: Any) -> tuple[int, int] | None:
    """(rate, top-k) of a layer whose ``compressor`` child appends one compressed KV entry per
    ``compress_rate`` tokens to the keys of its window (DeepSeek V4's compressed-sparse and
    heavily-compressed layers). The query at position ``p`` sees the entries of the windows
    closed by then, ``(p + 1) // rate``; a compressor with an ``indexer`` keeps at most its
    ``index_topk`` of them per query (which ones depends on values, how many does not); top-k
    0: every entry. Read once, when instrumenting."""
    compressor = getattr(module, "_modules", {}).get("compressor")
    rate = pos_int(getattr(compressor, "compress_rate", None))
    if rate is None:
        return None
    indexer = getattr(compressor, "_modules", {}).get("indexer")
    return rate, pos_int(getattr(indexer, "index_topk", None)) or 0


def tokens_seen(cache: Any, layer_idx: int | None) -> int | None:
    """Tokens a layer's cache entry has taken in before the call (a sliding-window entry's
    ``cumulative_length``, not the keys it still holds), or None where it does not say. Read by
    the extractor, on the calling thread."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or layer_idx is None or layer_idx >= len(layers):
        return None
    layer = layers[layer_idx]
    if not getattr(layer, "is_initialized", True):
        return 0
    seen = getattr(layer, "cumulative_length_int", None)  # static: the int mirror of its tensor
    if seen is None:
        seen = getattr(layer, "cumulative_length", None)
    return seen if isinstance(seen, int) and not isinstance(seen, bool) else None


def compressed_pairs(seen: int, sq: int, rate: int, topk: int = 0) -> int:
    """Compressed entries the queries at positions ``seen .. seen + sq - 1`` see, summed: the
    query at ``p`` sees the ``(p + 1) // rate`` windows closed by then, at most ``topk``
    (0: no cap)."""
    def upto(n: int) -> int:  # sum of min(p // rate, topk) for p = 1 .. n, in closed form
        capped = n if not topk else min(n, topk * rate - 1)
        q, rem = divmod(capped, rate)
        return rate * q * (q - 1) // 2 + q * (rem + 1) + topk * (n - capped)
    return upto(seen + sq) - upto(seen)


FAMILY = Family("DeepSeek V4 compressed keys", ("deepseek_v4",), compressed_keys, "compressed")
