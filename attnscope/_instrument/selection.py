"""Which modules of a model :func:`attnscope.instrument` patches, and how each one's facts are read.

Pure choices over the module tree: nothing here patches a module. Attention layers are those
registered with :func:`attnscope.register_attention`, ``nn.MultiheadAttention`` and
transformers-style modules recognised by structure (innermost wins; in hybrid models state-space
and convolution mixers, and a module of another class where the declared attention class sits in
other layers, are other token mixers).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from .._record.facts import AttentionFacts, Facts
from .._runtime import runtime
from . import Extractor, torch_nn
from . import transformers as hf
from .facts import head_info

__all__ = ["UserExtractor", "patterns", "selected", "registered", "targets", "extractor_for"]

UserExtractor = Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any]], Any]

_FACT_FIELDS = frozenset(AttentionFacts.__slots__) - {"batch", "seq_q"}
_LAYER_DIGITS = re.compile(r"\.\d+(?=\.|$)")


def patterns(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def selected(path: str, include: tuple[str, ...] | None, exclude: tuple[str, ...] | None) -> bool:
    if include is not None and not any(fnmatch.fnmatchcase(path, p) for p in include):
        return False
    return not (exclude and any(fnmatch.fnmatchcase(path, p) for p in exclude))


def registered(module: torch.nn.Module) -> tuple[bool, UserExtractor | None]:
    registry = runtime.instrumentation.attention_registry
    for cls in type(module).__mro__:
        if cls in registry:
            return True, registry[cls]
    return False, None


def targets(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Attention modules of ``model`` by path; for structural matches the innermost wins."""
    declared = hf.recorded_attention_classes(model)
    explicit: list[tuple[str, torch.nn.Module]] = []
    structural: list[tuple[str, torch.nn.Module]] = []
    for path, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            continue  # TorchScript dispatches on the compiled class, not instance attributes
        if registered(module)[0] or torch_nn.is_multihead_attention(module):
            explicit.append((path, module))
        elif hf.is_attention_module(module, declared):
            structural.append((path, module))
    inner = [
        (path, module)
        for path, module in structural
        if not any(
            other != path and (path == "" or other.startswith(path + "."))
            for other, _ in structural + explicit
        )
    ]
    chosen = {id(module) for _, module in explicit + _no_other_mixers(model, inner, declared)}
    return [(path, module) for path, module in model.named_modules() if id(module) in chosen]


def _no_other_mixers(model: torch.nn.Module, found: list[tuple[str, torch.nn.Module]],
                     declared: tuple[type, ...]) -> list[tuple[str, torch.nn.Module]]:
    """Hybrid models (linear attention, Mamba, short convolutions): only softmax attention is
    attention. Not attention: a module of another class where the model's declared attention
    class sits in other layers, and a state-space, convolution or linear-attention mixer
    (:func:`_sequence_mixer`), even of a declared class (MiniMax declares its lightning layers)."""
    slots = {_LAYER_DIGITS.sub(".*", p)
             for p, m in model.named_modules() if isinstance(m, declared)}
    return [(p, m) for p, m in found
            if not _sequence_mixer(m) and (
                (declared and isinstance(m, declared))
                or not declared or _LAYER_DIGITS.sub(".*", p) not in slots)]


def _sequence_mixer(module: torch.nn.Module) -> bool:
    """A state-space or convolution token mixer (Jamba's, Bamba's, Zamba2's, Falcon-H1's and
    Granite's Mamba layers, LFM2's short convolution, gated delta rules): it owns a convolution
    over the sequence (``nn.Conv1d``; transformers' ``Conv1D`` is a linear layer) or a state
    matrix (``A_log``), or says it is linear attention (``layer_type``, from the config's
    ``layer_types``: MiniMax's lightning layers). Softmax attention does none of these."""
    return ("A_log" in module._parameters
            or vars(module).get("layer_type") == "linear_attention"
            or any(isinstance(child, torch.nn.Conv1d) for child in module.children()))


def extractor_for(module: torch.nn.Module, names: tuple[str, ...],
                  bidirectional: bool = False) -> Extractor:
    """The module's extractor; ``bidirectional``: its model says its layers attend both ways."""
    is_registered, user = registered(module)
    if is_registered and user is not None:
        return _wrap_user_extractor(module, user)
    if torch_nn.is_multihead_attention(module):
        return torch_nn.multihead_extractor(module)  # type: ignore[arg-type]
    return hf.hidden_state_extractor(module, names, bidirectional)


def _wrap_user_extractor(module: torch.nn.Module, user: UserExtractor) -> Extractor:
    heads, kv_heads, head_dim, head_dim_v = head_info(module)

    def extract(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Facts | None:
        found = user(instance, args[1:], kwargs)
        if isinstance(found, AttentionFacts):
            return Facts(found)
        if not isinstance(found, Mapping):
            return None
        facts = AttentionFacts(int(found["batch"]), int(found["seq_q"]))
        facts.heads, facts.kv_heads = heads, kv_heads
        facts.head_dim, facts.head_dim_v = head_dim, head_dim_v
        for key, value in found.items():
            if key in _FACT_FIELDS:
                setattr(facts, key, value)
        return Facts(facts)

    return extract
