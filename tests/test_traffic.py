"""attnscope._attention.traffic: the minimum bytes of an attention call against a brute-force count.

The brute force builds the set of every tensor element the core must touch (loops over batch,
heads, positions and head dims with the causal / window / chunk / padding rules written out
pair by pair) and counts each element once; it shares no code with the module under test.
"""

from __future__ import annotations

import random
import timeit
from typing import Any

import pytest

from attnscope._attention.traffic import UNKNOWN, Traffic, attention_traffic, element_size

SIZE = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "bool": 1, "float8_e4m3fn": 1}


def _sees(pos: int, j: int, pad: int, causal: bool, window: int | None,
          chunk: int | None) -> bool:
    """Whether the query at key position ``pos`` may see key ``j`` (written pair by pair)."""
    if j < pad:  # a padded key: no query sees it
        return False
    if not causal:
        return True
    if j > pos:
        return False
    if window is not None and pos - j >= window:
        return False
    if chunk is not None:
        # chunks of `chunk` positions, the first starting at the row's first real position
        return (pos - pad) // chunk == (j - pad) // chunk
    return True


def brute(b: int, hq: int, hkv: int, sq: int, skv: int, d: int, dv: int, dtype: str,
          causal: bool = False, window: int | None = None, chunk: int | None = None,
          pads: list[int] | None = None, mask_shape: tuple[int, ...] | None = None,
          mask_dtype: str | None = None, kv_dtype: str | None = None,
          hidden: frozenset[tuple[int, int]] = frozenset()) -> tuple[int, int]:
    """(total bytes, K+V bytes) from explicit index sets. ``hidden``: (batch row, key) pairs a
    mask that is no band hides from every query (a document mask)."""
    pads = pads if pads is not None else [0] * b
    group = hq // hkv
    q_read: set[tuple[int, ...]] = set()
    k_read: set[tuple[int, ...]] = set()
    v_read: set[tuple[int, ...]] = set()
    o_written: set[tuple[int, ...]] = set()
    m_read: set[tuple[int, ...]] = set()
    for bi in range(b):
        pad = pads[bi]
        for h in range(hq):
            for i in range(sq):
                pos = skv - sq + i
                for e in range(dv):
                    o_written.add((bi, h, i, e))
                real = not (0 <= pos < pad)  # a query at a padded position is padding
                for j in range(skv):
                    if mask_shape is not None:
                        coords = (bi, h, i, j)[-len(mask_shape):] if len(mask_shape) > 2 \
                            else (bi, j)
                        stored = zip(mask_shape, coords, strict=True)  # broadcast dims: 0
                        m_read.add(tuple(0 if n == 1 else c for n, c in stored))
                    if not real or not _sees(pos, j, pad, causal, window, chunk) \
                            or (bi, j) in hidden:
                        continue
                    for e in range(d):
                        q_read.add((bi, h, i, e))
                        k_read.add((bi, h // group, j, e))
                    for e in range(dv):
                        v_read.add((bi, h // group, j, e))
    eq = SIZE[dtype]
    ekv = SIZE[kv_dtype or dtype]
    kv = (len(k_read) + len(v_read)) * ekv
    total = len(q_read) * eq + kv + len(o_written) * eq
    if mask_shape is not None:
        assert mask_dtype is not None
        total += len(m_read) * SIZE[mask_dtype]
    return total, kv


def flops_brute(b: int, hq: int, sq: int, skv: int, d: int, dv: int, causal: bool,
                window: int | None) -> int:
    pairs = sum(1 for _ in range(b) for _ in range(hq) for i in range(sq) for j in range(skv)
                if _sees(skv - sq + i, j, 0, causal, window, None))
    return 2 * pairs * (d + dv)


def shown(b: int, hq: int, sq: int, skv: int, pads: list[int], causal: bool,
          window: int | None, chunk: int | None,
          hidden: frozenset[tuple[int, int]] = frozenset()) -> tuple[int, int]:
    """(real query tokens, visible pairs over batch and query heads) as a mask shows them:
    what derive reads from a mask's counts (``tokens``, ``MaskReading.pairs``)."""
    tokens = sum(1 for bi in range(b) for i in range(sq) if skv - sq + i >= pads[bi])
    pairs = sum(1 for bi in range(b) for _ in range(hq) for i in range(sq) for j in range(skv)
                if skv - sq + i >= pads[bi] and (bi, j) not in hidden
                and _sees(skv - sq + i, j, pads[bi], causal, window, chunk))
    return tokens, pairs


def traffic(b: int, hq: int, hkv: int, sq: int, skv: int, d: int, dv: int, dtype: str,
            **kw: Any) -> Traffic:
    return attention_traffic(b, hq, hkv, sq, skv, d, dv, dtype, **kw)


# ---- hand-computed cases -----------------------------------------------------------------------


def test_mha_full_by_hand() -> None:
    # B=2, H=4, S=8, D=16, fp16: Q, K, V and O are each 2*4*8*16 elements of 2 bytes
    t = traffic(2, 4, 4, 8, 8, 16, 16, "float16", flops=4 * 2 * 4 * 8 * 8 * 16)
    assert t.bytes == 4 * 2 * 4 * 8 * 16 * 2 == 8192
    assert t.kv_bytes_read is None
    assert t.arithmetic_intensity == 4 * 2 * 4 * 8 * 8 * 16 / 8192 == 4.0
    assert brute(2, 4, 4, 8, 8, 16, 16, "float16")[0] == 8192


def test_gqa_reads_kv_once_per_kv_head() -> None:
    # 8 query heads over 2 KV heads: K and V are 1/4 of Q's size
    q = o = 1 * 8 * 6 * 4 * 4
    kv = 2 * (1 * 2 * 6 * 4 * 4)
    assert traffic(1, 8, 2, 6, 6, 4, 4, "float32").bytes == q + o + kv == 1920
    assert brute(1, 8, 2, 6, 6, 4, 4, "float32")[0] == 1920


def test_mqa_one_kv_head() -> None:
    q = o = 2 * 4 * 3 * 8 * 2
    kv = 2 * (2 * 1 * 3 * 8 * 2)
    assert traffic(2, 4, 1, 3, 3, 8, 8, "bfloat16").bytes == q + o + kv == 960
    assert brute(2, 4, 1, 3, 3, 8, 8, "bfloat16")[0] == 960


def test_decode_reads_the_whole_cache() -> None:
    # one new token over 9 cached: 10 keys x 2 KV heads x (Dk 8 + Dv 4) x 2 bytes x batch 3
    t = traffic(3, 4, 2, 1, 10, 8, 4, "float16", causal=True, decode=True)
    assert t.kv_bytes_read == 10 * 2 * (8 + 4) * 2 * 3 == 1440
    assert t.bytes == 1440 + 3 * 4 * 1 * 8 * 2 + 3 * 4 * 1 * 4 * 2 == 1728
    assert (t.bytes, t.kv_bytes_read) == brute(3, 4, 2, 1, 10, 8, 4, "float16", causal=True)


def test_decode_with_left_padding_excludes_padded_keys() -> None:
    # rows padded by 0, 3 and 7 of 10 keys: 10 + 7 + 3 real keys are read
    t = traffic(3, 2, 2, 1, 10, 4, 4, "float32", causal=True, decode=True,
                left_padding=[0, 3, 7], mask_shape=(3, 1, 1, 10), mask_dtype="bool")
    assert t.kv_bytes_read == (10 + 7 + 3) * 2 * (4 + 4) * 4 == 1280
    assert t.bytes == 1280 + 2 * (3 * 2 * 4 * 4) + 3 * 10 * 1 == 1502
    assert (t.bytes, t.kv_bytes_read) == brute(
        3, 2, 2, 1, 10, 4, 4, "float32", causal=True, pads=[0, 3, 7], mask_shape=(3, 1, 1, 10),
        mask_dtype="bool")


def test_left_padded_prefill_skips_padded_queries() -> None:
    # causal prefill, 5 positions, row 1 padded by 2: its first two queries see no real key
    t = traffic(2, 1, 1, 5, 5, 2, 2, "float32", causal=True, left_padding=[0, 2],
                mask_shape=(2, 5), mask_dtype="float32")
    q = (5 + 3) * 2 * 4
    kv = (5 + 3) * (2 + 2) * 4
    o = 2 * 5 * 2 * 4
    mask = 2 * 5 * 4
    assert t.bytes == q + kv + o + mask == 312
    assert brute(2, 1, 1, 5, 5, 2, 2, "float32", causal=True, pads=[0, 2], mask_shape=(2, 5),
                 mask_dtype="float32")[0] == 312


def test_sliding_window_leaves_old_keys_unread() -> None:
    # 2 queries over 12 keys with a causal window of 3: keys 8..11 are read, 0..7 are not
    t = traffic(1, 1, 1, 2, 12, 4, 4, "float16", causal=True, window=3)
    assert t.bytes == 2 * 4 * 2 + 4 * (4 + 4) * 2 + 2 * 4 * 2 == 96
    assert brute(1, 1, 1, 2, 12, 4, 4, "float16", causal=True, window=3)[0] == 96
    # the same call without the window reads all 12 keys
    assert traffic(1, 1, 1, 2, 12, 4, 4, "float16", causal=True).bytes == 32 + 12 * 16


def test_chunked_decode_reads_its_chunk_only() -> None:
    # decode at position 9 with chunks of 4: the chunk [8, 12) holds keys 8 and 9
    t = traffic(1, 2, 1, 1, 10, 4, 4, "float32", causal=True, chunk=4, decode=True)
    assert t.kv_bytes_read == 2 * (4 + 4) * 4 == 64
    assert (t.bytes, t.kv_bytes_read) == brute(1, 2, 1, 1, 10, 4, 4, "float32", causal=True,
                                               chunk=4)


def test_causal_with_more_queries_than_keys() -> None:
    # bottom-right: the first 3 of 5 queries see no key and are not read; O is written whole
    t = traffic(1, 1, 1, 5, 2, 2, 2, "float32", causal=True)
    assert t.bytes == 2 * 2 * 4 + 2 * 4 * 4 + 5 * 2 * 4 == 88
    assert brute(1, 1, 1, 5, 2, 2, 2, "float32", causal=True)[0] == 88


@pytest.mark.parametrize("mask_dtype", ["bool", "float32", "float16"])
def test_fp16_and_fp32_with_a_bool_or_float_mask(mask_dtype: str) -> None:
    # a mask broadcast over heads, (B, 1, Sq, Skv), read once; fp16 and fp32 inputs
    for dtype in ("float16", "float32"):
        shape = (2, 1, 3, 3)
        t = traffic(2, 4, 2, 3, 3, 8, 8, dtype, left_padding=[0, 1], mask_shape=shape,
                    mask_dtype=mask_dtype)
        expect = brute(2, 4, 2, 3, 3, 8, 8, dtype, pads=[0, 1], mask_shape=shape,
                       mask_dtype=mask_dtype)[0]
        assert t.bytes == expect
        without = traffic(2, 4, 2, 3, 3, 8, 8, dtype, left_padding=[0, 1], mask_shape=shape,
                          mask_dtype="bool").bytes
        assert t.bytes == without + 2 * 3 * 3 * (SIZE[mask_dtype] - 1)  # type: ignore[operator]


def test_a_static_caches_mask_is_read_up_to_the_keys() -> None:
    # the mask spans a 16-slot buffer, the call has 6 keys: 6 columns are read
    t = traffic(1, 1, 1, 1, 6, 2, 2, "float32", causal=True, left_padding=[0],
                mask_shape=(1, 1, 1, 16), mask_dtype="bool")
    assert t.bytes == traffic(1, 1, 1, 1, 6, 2, 2, "float32", causal=True).bytes + 6  # type: ignore[operator]


def test_mixed_kv_dtype() -> None:
    t = traffic(1, 2, 1, 4, 4, 4, 4, "bfloat16", kv_dtype="float8_e4m3fn")
    assert t.bytes == brute(1, 2, 1, 4, 4, 4, 4, "bfloat16", kv_dtype="float8_e4m3fn")[0]


# ---- not established: None, never a guess -----------------------------------------------------


def test_unknowns_are_none() -> None:
    assert traffic(1, 1, 1, 2, 2, 4, 4, "complex64") == UNKNOWN
    assert attention_traffic(1, 1, 1, 2, 2, None, None, "float32") == UNKNOWN
    assert attention_traffic(1, None, None, 2, 2, 4, 4, "float32") == UNKNOWN
    assert attention_traffic(1, 1, 1, 2, None, 4, 4, "float32") == UNKNOWN
    # a mask was passed but its padding, dtype or shape is not known
    assert traffic(1, 1, 1, 2, 2, 4, 4, "float32", mask=True, left_padding=[0]) == UNKNOWN
    assert traffic(1, 1, 1, 2, 2, 4, 4, "float32", mask_shape=(1, 2), mask_dtype="bool") \
        == UNKNOWN
    assert traffic(1, 1, 1, 2, 2, 4, 4, "float32", mask_shape=(1, 2), left_padding=[0]) \
        == UNKNOWN
    # a two-sided window (only its width is known), a chunked window, a padding list of another
    # batch, heads that are not a multiple of the KV heads
    assert traffic(1, 1, 1, 4, 4, 4, 4, "float32", window=3) == UNKNOWN
    assert traffic(1, 1, 1, 4, 4, 4, 4, "float32", causal=True, window=3, chunk=2) == UNKNOWN
    assert traffic(2, 1, 1, 4, 4, 4, 4, "float32", left_padding=[0]) == UNKNOWN
    assert traffic(1, 3, 2, 4, 4, 4, 4, "float32") == UNKNOWN
    # no FLOPs: bytes, but no intensity
    t = traffic(1, 1, 1, 2, 2, 4, 4, "float32")
    assert t.bytes is not None and t.arithmetic_intensity is None


def test_element_sizes() -> None:
    assert [element_size(n) for n in ("float32", "torch.bfloat16", "float16", "float64", "bool",
                                      "float8_e5m2", "int64")] == [4, 2, 2, 8, 1, 1, 8]
    assert element_size(None) is None and element_size("complex128") is None


# ---- many random small shapes against the brute force ------------------------------------------


def _random_case(rng: random.Random) -> dict[str, Any]:
    hkv = rng.randint(1, 3)
    hq = hkv * rng.randint(1, 3)
    skv = rng.randint(1, 9)
    sq = rng.randint(1, skv + 2) if rng.random() < 0.2 else rng.randint(1, skv)
    causal = rng.random() < 0.7
    window = rng.randint(1, 5) if causal and rng.random() < 0.35 else None
    chunk = rng.randint(1, 4) if causal and window is None and rng.random() < 0.3 else None
    b = rng.randint(1, 3)
    case: dict[str, Any] = dict(b=b, hq=hq, hkv=hkv, sq=sq, skv=skv, d=rng.randint(1, 4),
                                dv=rng.randint(1, 4), dtype=rng.choice(["float16", "float32"]),
                                causal=causal, window=window, chunk=chunk)
    if rng.random() < 0.5:
        case["pads"] = [rng.randint(0, skv) for _ in range(b)]
        s = skv + rng.randint(0, 3)
        case["mask_shape"] = rng.choice([(b, s), (b, 1, sq, s), (1, 1, sq, s), (b, hq, sq, s),
                                         (b, 1, 1, s)])
        case["mask_dtype"] = rng.choice(["bool", "float32", "float16"])
    return case


def test_random_shapes_match_the_brute_force() -> None:
    rng = random.Random(20261202)
    for _ in range(1500):
        c = _random_case(rng)
        total, kv = brute(**c)
        t = attention_traffic(
            c["b"], c["hq"], c["hkv"], c["sq"], c["skv"], c["d"], c["dv"], c["dtype"],
            causal=c["causal"], window=c["window"], chunk=c["chunk"],
            left_padding=c.get("pads"), mask_shape=c.get("mask_shape"),
            mask_dtype=c.get("mask_dtype"), decode=c["sq"] == 1,
            flops=flops_brute(c["b"], c["hq"], c["sq"], c["skv"], c["d"], c["dv"], c["causal"],
                              c["window"]))
        assert t.bytes == total, c
        assert t.kv_bytes_read == (kv if c["sq"] == 1 else None), c
        fl = flops_brute(c["b"], c["hq"], c["sq"], c["skv"], c["d"], c["dv"], c["causal"],
                         c["window"])
        assert t.arithmetic_intensity == fl / total, c


def test_counted_from_a_masks_reading() -> None:
    # What derive can pass without reading a mask again (docs: the integration): at decode the
    # one query reads exactly the keys it sees, so keys = pairs / query heads for a mask
    # broadcast over heads, whatever its layout (bands, documents); at a prefill without cache
    # (Sq = Skv) every real query sees itself, so rows = keys = tokens.
    rng = random.Random(5)
    for _ in range(300):
        hkv = rng.randint(1, 3)
        hq, b, skv = hkv * rng.randint(1, 3), rng.randint(1, 3), rng.randint(1, 8)
        causal = rng.random() < 0.8
        window = rng.randint(1, 4) if causal and rng.random() < 0.4 else None
        chunk = rng.randint(1, 3) if causal and window is None and rng.random() < 0.3 else None
        pads = [rng.randint(0, skv) for _ in range(b)]
        decode = rng.random() < 0.5
        sq = 1 if decode else skv
        hidden = frozenset((bi, j) for bi in range(b) for j in range(skv - 1)
                           if decode and rng.random() < 0.2)
        shape = (b, 1, sq, skv)
        tokens, pairs = shown(b, hq, sq, skv, pads, causal, window, chunk, hidden)
        counted = (tokens, pairs // hq) if decode else (tokens, tokens)
        t = attention_traffic(b, hq, hkv, sq, skv, 4, 2, "float16", counted=counted,
                              mask_shape=shape, mask_dtype="bool", decode=decode)
        total, kv = brute(b, hq, hkv, sq, skv, 4, 2, "float16", causal=causal, window=window,
                          chunk=chunk, pads=pads, mask_shape=shape, mask_dtype="bool",
                          hidden=hidden)
        assert (t.bytes, t.kv_bytes_read) == (total, kv if decode else None)


def test_cost_per_call_is_a_few_microseconds() -> None:
    # a generous bound: the worker's per-span cost is benchmarked; this catches a slow rewrite
    # (a loop over positions instead of closed forms) on any machine, not a regression of 10%
    def call() -> Traffic:
        return attention_traffic(8, 32, 8, 1, 4096, 128, 128, "bfloat16", causal=True,
                                 left_padding=[0, 3, 7, 0, 1, 2, 0, 9], mask_shape=(8, 1, 1, 4096),
                                 mask_dtype="bool", decode=True, flops=1 << 30)
    per_call = min(timeit.repeat(call, number=200, repeat=5)) / 200
    assert per_call < 50e-6
