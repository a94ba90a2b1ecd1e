"""FLOPs of layers that attend to other keys than their mask shows: Doge's cap on the keys a
query keeps (how many: ``_attention.families.kept_keys``), DeepSeek-V4's compressed KV entries
after the window's keys (their count: ``_attention.families.deepseek_v4``);
:func:`.call.derive_attention` calls these once the mask's reading is done."""

from __future__ import annotations

from .._attention.families.deepseek_v4 import compressed_pairs
from .._attention.families.kept_keys import capped_pairs
from .._attention.masks import MaskReading
from .._record.capture import AttentionFacts
from .result import Derived

__all__ = ["cap_keys", "add_compressed", "narrows"]


def narrows(f: AttentionFacts, skv: int) -> bool:
    """Some query of the call may see more keys than the layer keeps (``f.key_cap`` set)."""
    return f.key_cap is not None and skv >= f.key_cap + f.key_block


def cap_keys(out: Derived, f: AttentionFacts, reading: MaskReading | None, real: int | None,
              causal: bool, window: int | None, skv: int, dv: int) -> None:
    """A layer that keeps at most ``f.key_cap`` keys per query (Doge, Qwen4-exp): exact over a
    plain causal or full mask with every query real; otherwise the FLOPs above are an upper
    bound."""
    plain = (window is None and (f.mask is None or (
        reading is not None and reading.window is None and real == f.batch * f.seq_q
        and (reading.causal is None or reading.causal == causal))))
    if not plain or not f.heads or not f.head_dim or f.key_cap is None:
        out.inexact("layer_narrows")
        return
    pairs = f.batch * f.heads * capped_pairs(f.seq_q, skv, f.key_cap, causal, f.key_block)
    out.flops = 2 * pairs * (f.head_dim + dv)


def add_compressed(out: Derived, f: AttentionFacts, compressed: tuple[int, int], seen: int | None,
                real: int | None) -> int:
    """Add a layer's compressed KV entries (DeepSeek V4) to what its window's mask gave; returns
    how many the key axis holds. They follow the window's keys on that axis, every one held in
    the cache (those this call's tokens close included): ``kv_cache_len`` counts them, so that
    ``seq_len_kv = kv_cache_len + seq_len_q`` still holds, and the layout is no causal one. The
    query at position ``p`` sees ``(p + 1) // rate`` of them: positions counted from the cache
    (transformers' default, and what ``generate`` passes an unpadded batch); a padded row may be
    given positions shifted by its padding (``generate`` does), seeing fewer: then an upper bound,
    marked ``layer_narrows``."""
    if seen is None:  # a cache that does not say how many tokens it took in: keys unknown
        out.seq_len_kv = out.kv_cache_len = out.phase = out.flops = None
        out.inexact("cache_unread")
        return 0
    rate, topk = compressed
    entries = (seen + f.seq_q) // rate
    if not entries or out.seq_len_kv is None:
        return 0
    out.seq_len_kv += entries
    if out.kv_cache_len is not None:
        out.kv_cache_len += entries
    out.causal = False
    if out.flops is not None and f.heads and f.head_dim:
        pairs = f.batch * f.heads * compressed_pairs(seen, f.seq_q, rate, topk)
        out.flops += 2 * pairs * (f.head_dim + (f.head_dim_v or f.head_dim))
    if real is not None and real < f.batch * f.seq_q:
        out.inexact("layer_narrows")
    elif f.batch > 1 and f.mask is not None and f.seq_q == 1:
        # A decode step of a batch: a row that was left-padded sees entries by its own shifted
        # positions (generate() passes them), which attnscope does not read, and its padding may
        # have left the window the mask shows: not established, so marked, never guessed.
        out.inexact("layer_narrows")
    return entries
