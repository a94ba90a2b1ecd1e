"""The model-family registry (attnscope._attention.families): one module per family, each
filling one LayerTraits field, each exercised by the architecture sweep."""

from __future__ import annotations

import pathlib
import re

import torch

from attnscope._attention.families import FAMILIES, detected_traits
from attnscope._instrument.facts import layer_traits
from attnscope._record.facts import LayerTraits
from tests.support import arch_sweep as sweep
from tests.test_arch_sweep import FEATURED, NAMED


def _built_by_family_tests() -> set[str]:
    """Model types tests/test_arch_families.py builds (``sweep.build("<type>", ...)``, or a
    ``transformers.<Type>Config`` of its own)."""
    source = (pathlib.Path(__file__).parent / "test_arch_families.py").read_text()
    return (set(re.findall(r'sweep\.build\(\s*"([^"]+)"', source))
            | {name.lower() for name in re.findall(r"transformers\.(\w+)Config\(", source)})


def test_every_family_fills_its_own_traits_field_and_is_swept() -> None:
    fields = [f.trait for f in FAMILIES if f.trait is not None]
    assert len(set(fields)) == len(fields) and set(fields) <= set(LayerTraits._fields)
    swept = ({c.model_type for c in (*NAMED, *FEATURED)} | set(sweep.FEATURES)
             | _built_by_family_tests())
    for family in FAMILIES:
        assert family.models and set(family.models) <= swept, family.name


def test_a_plain_layer_is_of_no_family() -> None:
    plain = torch.nn.Linear(2, 2)
    assert detected_traits(plain) == {f.trait: LayerTraits._field_defaults[f.trait]
                                      for f in FAMILIES if f.trait is not None}
    assert not any(f.detect(plain) for f in FAMILIES if f.trait is None)
    assert layer_traits(plain) is None
