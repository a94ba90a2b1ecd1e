"""Tuple-style (legacy) KV caches: the model's tuple of per-layer pairs, a layer's own pair, and
an encoder-decoder layer's 4-tuple (issue 12 item 8: every decode step looked like prefill)."""

from __future__ import annotations

import torch

from attnscope.instrument.transformers import _past_length


def _kv(seq: int) -> torch.Tensor:
    return torch.zeros(1, 2, seq, 4)


def test_the_models_tuple_of_layer_pairs() -> None:
    cache = ((_kv(5), _kv(5)), (_kv(7), _kv(7)))
    assert _past_length(cache, None) == 5  # was None: the pair of pairs was read as one pair
    assert _past_length(cache, 1) == 7
    assert _past_length(cache, 2) == 0  # a layer the cache has not reached yet


def test_one_layers_pair_and_an_encoder_decoder_4_tuple() -> None:
    assert _past_length((_kv(3), _kv(3)), 0) == 3
    layer = (_kv(3), _kv(3), _kv(9), _kv(9))  # self key/value, then cross key/value
    assert _past_length(layer, 0) == 3
    assert _past_length(layer, 0, cross=True) == 9
    assert _past_length(((_kv(3), _kv(3), _kv(9), _kv(9)),), 0, cross=True) == 9


def test_empty_and_unknown() -> None:
    assert _past_length((), None) is None
    assert _past_length((object(), object()), None) is None
