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


def test_every_family_module_is_registered() -> None:
    # a model family is one module: each module of the package but its base is in FAMILIES
    package = pathlib.Path(__file__).parents[1] / "attnscope" / "_attention" / "families"
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "base"}
    registered = {f.detect.__module__.rsplit(".", 1)[-1] for f in FAMILIES}
    assert modules == registered


# ---- the families once inside generic code: each one's detector and tweak or rule ------------


def test_a_config_only_window_is_detected_and_carried() -> None:
    """Moshi's layers declare no window; their config names one (applied by a mask, if at all)."""
    from types import SimpleNamespace

    from attnscope._attention.families import config_window

    def layer(**own: object) -> torch.nn.Module:
        module = torch.nn.Module()
        vars(module).update(config=SimpleNamespace(sliding_window=4), **own)
        return module

    moshi = layer()
    assert config_window.layer_window(moshi) == 4 and config_window.config_window(moshi)
    traits = layer_traits(moshi)
    assert traits is not None and traits.config_window
    for own in ({"sliding_window": 4}, {"sliding_window": None}, {"is_sliding": False},
                {"attention_type": "local"}):  # its own window (GPT-Neo's kind), or none
        assert not config_window.config_window(layer(**own)), own
    off = layer()
    vars(off)["config"] = SimpleNamespace(sliding_window=4, use_sliding_window=False)
    assert config_window.layer_window(off) is None and not config_window.config_window(off)


def test_a_config_only_window_is_unapplied_where_the_mask_says_so() -> None:
    from types import SimpleNamespace

    from attnscope._attention.families.config_window import builds_masks, window_unapplied
    from attnscope._attention.masks import MaskReading

    causal = MaskReading(True, None, 36)
    assert window_unapplied(4, 8, causal, False, object())  # a causal mask wider than 4
    assert not window_unapplied(4, 8, MaskReading(True, 4, 26), False, object())  # it shows it
    assert not window_unapplied(8, 8, causal, False, object())  # no key beyond the window
    assert not window_unapplied(None, 8, causal, False, object())
    assert window_unapplied(4, 8, None, True, None)  # sdpa skipped the mask: none could bind
    assert not window_unapplied(4, 8, None, False, None)  # a flash kernel applies it itself
    for impl, builds in (("sdpa", True), ("eager", True), ("flash_attention_2", False),
                         (None, False)):
        assert builds_masks(SimpleNamespace(config=SimpleNamespace(
            _attn_implementation=impl))) is builds


def test_clip_causal_mask_apart_is_detected_from_the_forward() -> None:
    from attnscope._attention.families import clip

    class Clip(torch.nn.Module):
        def forward(self, hidden_states: torch.Tensor, attention_mask: object = None,
                    causal_attention_mask: object = None) -> torch.Tensor:
            return hidden_states

    assert clip.causal_mask_apart(Clip()) and clip.CAUSAL_MASK == ("causal_attention_mask",)
    assert not clip.causal_mask_apart(torch.nn.Linear(2, 2))


def test_modernbert_two_sided_local_layers_read_their_band_first() -> None:
    from attnscope._attention.families import modernbert

    local, global_ = torch.nn.Module(), torch.nn.Module()
    vars(local)["local_attention"], vars(global_)["local_attention"] = (2, 2), (-1, -1)
    assert modernbert.two_sided_local(local) and not modernbert.two_sided_local(global_)
    masks = ("attention_mask", "mask")
    assert modernbert.mask_names(local, masks) == ("sliding_window_mask", *masks)
    assert modernbert.mask_names(global_, masks) == masks


class _PerCall(torch.nn.Module):
    def __init__(self, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx


def test_zamba2_shared_attention_takes_its_layer_index_per_call() -> None:
    from attnscope._attention.families import zamba2

    class Shared(_PerCall):
        def forward(self, hidden_states: torch.Tensor, layer_idx: int) -> torch.Tensor:
            return hidden_states

    assert zamba2.FAMILY.detect(Shared(-1)) and not zamba2.FAMILY.detect(Shared(3))
    assert zamba2.index_per_call(None, ("self", "hidden_states", "layer_idx"))
    assert not zamba2.index_per_call(None, ("self", "hidden_states"))
    assert [zamba2.call_slot(v) for v in (3, 0, -1, True, "3")] == [3, 0, None, None, None]


def test_hrm_recurrent_passes_move_the_cache_slot() -> None:
    from attnscope._attention.families import hrm

    class Recurrent(_PerCall):
        def forward(self, hidden_states: torch.Tensor, cycle_offset: int = 0) -> torch.Tensor:
            return hidden_states

    assert hrm.FAMILY.detect(Recurrent(1)) and not hrm.FAMILY.detect(Recurrent(-1))
    for name in ("cycle_offset", "cache_offset"):
        assert hrm.offset_per_call(2, ("self", "hidden_states", name))
    assert not hrm.offset_per_call(None, ("self", "cycle_offset"))
    assert [hrm.offset_slot(1, v) for v in (4, 0, -2, True)] == [5, 1, 1, 1]
    assert hrm.offset_slot(None, 4) is None
