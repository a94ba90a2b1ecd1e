"""Issue 37 goal 4: an instrumented layer's arguments, read by a reader made for its forward."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from attnscope._instrument.transformers import _argument_groups, _reader

_NAMES = ("self", "hidden_states", "position_embeddings", "attention_mask", "past_key_values")


class _Counted(dict[str, Any]):
    """kwargs that count their look-ups."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.reads: list[str] = []

    def get(self, key: str, default: Any = None) -> Any:
        self.reads.append(key)
        return super().get(key, default)


def _reference(names: tuple[str, ...], groups: Any, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> list[Any]:
    """The rule: per candidate set, the first candidate given and not None, keyword first."""
    found = []
    for group in groups:
        value = None
        for name in group:
            value = kwargs.get(name)
            if value is None and name in names and names.index(name) < len(args):
                value = args[names.index(name)]
            if value is not None:
                break
        found.append(value)
    return found


@pytest.mark.parametrize("positional", [0, 1, 2, 3, 4])
def test_the_reader_finds_what_the_rule_says(positional: int) -> None:
    h, cache, mask = torch.zeros(1, 2, 8), object(), torch.ones(1, 1, 2, 2)
    values = {"hidden_states": h, "position_embeddings": (h, h), "attention_mask": mask,
              "past_key_values": cache}
    given = [object(), *(values[n] for n in _NAMES[1:])]
    args = tuple(given[:1 + positional])
    kwargs = {n: values[n] for n in _NAMES[1 + positional:]}
    kwargs.update(use_cache=True, mask=None, cache=None)
    groups = _argument_groups(torch.nn.Module(), _NAMES, False, False, False)
    read = _reader(_NAMES, groups)
    assert read(args, kwargs) == _reference(_NAMES, groups, args, kwargs)
    got = read(args, kwargs)
    assert got[0] is h and got[2] is cache and got[3] is True and got[5] is mask


def test_each_candidate_is_read_once() -> None:
    """A candidate listed twice (the forward's first name is also a hidden-state name) is
    looked up once, not once per listing."""
    groups = _argument_groups(torch.nn.Module(), _NAMES, False, False, False)
    kwargs = _Counted(use_cache=False)
    found = _reader(_NAMES, groups)((object(),), kwargs)
    assert found == [None, None, None, False, None, None, None, None]
    assert sorted(kwargs.reads) == sorted(set(kwargs.reads))
    assert len(kwargs.reads) == len({n for g in groups for n in g})


def test_names_are_only_literals_in_the_reader() -> None:
    """A parameter name that would be code, were it pasted in, is read as the name it is."""
    odd = "x'); import os; ('"
    read = _reader(("self", odd), ((odd,), ()))
    assert read((None, 5), {}) == [5, None]
    assert read((None,), {odd: 6}) == [6, None]
