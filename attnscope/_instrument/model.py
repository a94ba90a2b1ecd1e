"""``attnscope.instrument(model)``: trace every attention layer of a model in one line.

Each attention module gets an instance-level ``forward``: a bound method of the core wrapper
around the class's forward (its own call site, named by the module path). Nothing on the class
changes, so ``uninstrument`` only deletes what it added; ``copy.deepcopy`` re-binds the wrapper
to the copy; a pickled model unpickles uninstrumented. torch.compile inlines the original
forward (the wrapper is registered with ``torch.compiler.substitute_in_graph``): compiled calls
are not traced. Which modules are chosen: :mod:`.selection`; how one is patched: :mod:`.patching`.
"""

from __future__ import annotations

import functools
import re
import sys
import warnings
from collections.abc import Iterable
from typing import Any, TypeVar

import torch

from .. import _log
from .. import _schema as schema
from .._attention.families.xlm import bidirectional_model
from .._capture.args import add_attributes
from .._capture.compile import register_when_dynamo_loads
from .._capture.early_warmup import warm_up_early
from .._config import from_env
from .._record.facts import BLOCK_FACTS, Facts
from .._runtime import runtime
from . import Extractor, torch_nn
from . import transformers as hf
from .patching import (
    is_instrumented,
    restore,
    sites_of,
    wrap_forward,
    wrap_fused,
    wrap_generate,
)
from .selection import UserExtractor, extractor_for, patterns, selected, targets

__all__ = ["instrument", "instrumented_modules", "register_attention", "uninstrument"]

M = TypeVar("M", bound=torch.nn.Module)

_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")


def register_attention(cls: type, extractor: UserExtractor | None = None) -> None:
    """Treat instances of ``cls`` as attention layers in :func:`instrument`.

    ``extractor(module, args, kwargs)`` runs on the calling thread of a sampled call and returns
    a dict of shapes and ints: ``batch`` and ``seq_q`` (required), optionally ``seq_kv``,
    ``past``, ``cached``, ``heads``, ``kv_heads``, ``head_dim``, ``head_dim_v``, ``causal``,
    ``window``, ``mask`` (a tensor kept by reference; padding counted later), ``dtype``,
    ``device``. Without an extractor the forward must take hidden states ``(batch, seq, width)``
    and the module must say its head count (``num_heads`` or ``config.num_attention_heads``...).
    """
    if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
        raise TypeError(f"register_attention expects an nn.Module subclass, got {cls!r}")
    if extractor is not None and not callable(extractor):
        raise TypeError(f"register_attention: extractor must be callable, got {extractor!r}")
    with runtime.instrumentation.registry_lock:
        runtime.instrumentation.attention_registry[cls] = extractor


def _layer_index(path: str) -> int | None:
    match = _LAYER.search(path)
    return int(match.group(1)) if match else None


def _naming(path: str, module: torch.nn.Module, name_prefix: str | None,
            root_name: str) -> tuple[str, dict[str, Any]]:
    """A layer's span name and its module attributes."""
    name = (f"{name_prefix}.{path}" if name_prefix else path) if path else root_name
    attrs: dict[str, Any] = {schema.MODULE.name: path or root_name,
                             schema.MODULE_CLASS.name: type(module).__qualname__}
    index = _layer_index(path)
    if index is not None:
        attrs[schema.LAYER_INDEX.name] = index
    return name, attrs


def _instrument_fused(model: torch.nn.Module, name_prefix: str | None, root_name: str,
                      sample_rate: float | None) -> None:
    """``nn.TransformerEncoderLayer``s whose (instrumented) attention may be fused away."""
    for path, module in model.named_modules():
        attn = getattr(module, "self_attn", None)
        if (not torch_nn.may_take_fast_path(module) or is_instrumented(module)
                or not isinstance(attn, torch.nn.Module) or not is_instrumented(attn)):
            continue
        name, attrs = _naming(path, module, name_prefix, root_name)
        wrap_fused(module, name, attrs, sample_rate)


def _instrument_layers(model: torch.nn.Module, inc: tuple[str, ...] | None,
                       exc: tuple[str, ...] | None, name_prefix: str | None, root_name: str,
                       sample_rate: float | None) -> int:
    """Wrap every selected attention layer; returns how many already were."""
    already = 0
    bidirectional = bidirectional_model(model)
    for path, module in targets(model):
        if not selected(path, inc, exc):
            continue
        if is_instrumented(module):
            already += 1
            continue
        name, attrs = _naming(path, module, name_prefix, root_name)
        extractor = functools.partial(extractor_for, module, bidirectional=bidirectional)
        wrap_forward(module, name, attrs, sample_rate, extractor)
    _instrument_fused(model, name_prefix, root_name, sample_rate)
    return already


def _instrument_root(model: torch.nn.Module, root_name: str, name_prefix: str | None,
                     sample_rate: float | None) -> int:
    """``trace_model=True``: the model's forward and generate(); returns 1 if already done."""
    already = 0
    attrs: dict[str, Any] = {schema.MODULE.name: root_name,
                             schema.MODULE_CLASS.name: type(model).__qualname__}
    name = _request_model(model)
    if name is not None:  # a site attribute: read once here, never per call
        attrs[schema.REQUEST_MODEL.name] = name
    if is_instrumented(model):  # twice, or the root is itself an attention layer
        if not any(module is model for _, module in targets(model)):
            already = 1
    else:
        extract_model = functools.partial(hf.model_extractor, model)
        wrap_forward(model, root_name, attrs, sample_rate, extract_model)
    if callable(getattr(model, "generate", None)) and not is_instrumented(model, "generate"):
        wrap_generate(model, root_name + ".generate", attrs, sample_rate)
    for path, inner in _inner_models(model):
        if not is_instrumented(inner):
            inner_name = type(inner).__name__ if name_prefix is None else f"{name_prefix}.{path}"
            inner_attrs = {schema.MODULE.name: inner_name,
                           schema.MODULE_CLASS.name: type(inner).__qualname__}
            if name is not None:
                inner_attrs[schema.REQUEST_MODEL.name] = name
            wrap_forward(inner, inner_name, inner_attrs, sample_rate,
                         functools.partial(hf.model_extractor, inner))
    for path, layer in _decoder_layers(model):
        if not is_instrumented(layer):
            name, layer_attrs = _naming(path, layer, name_prefix, root_name)
            wrap_forward(layer, name, layer_attrs, sample_rate, _no_facts)
    return already


def _inner_models(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The outermost transformers models inside a root that is not one (PEFT's ``PeftModel``):
    such a wrapper's ``generate()`` runs the inner model's own, whose steps call the inner
    model, never the wrapper's ``forward``; their forwards are the model forwards then."""
    transformers = sys.modules.get("transformers")
    base = getattr(transformers, "PreTrainedModel", None)
    if not isinstance(base, type) or isinstance(model, base):
        return []
    found: list[tuple[str, torch.nn.Module]] = []
    for path, module in model.named_modules():
        is_model = isinstance(module, base)  # (not narrowed: module stays an nn.Module)
        if path and is_model and not any(path.startswith(outer + ".") for outer, _ in found):
            found.append((path, module))
    return found


def _request_model(model: torch.nn.Module) -> str | None:
    """``gen_ai.request.model``: the name or path the model was loaded from, as its config gives
    it (transformers' ``name_or_path``, set by ``from_pretrained``); None when it gives none (a
    model built from a config), never a name made up from the class."""
    config = getattr(model, "config", None)
    for attr in ("name_or_path", "_name_or_path"):
        try:
            value = getattr(config, attr, None)
        except Exception:  # a config's own property that raises: no name
            value = None
        if type(value) is str and value.strip():
            return value.strip()
    return None


def _decoder_layers(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The blocks holding an instrumented attention layer, as the module tree says: the entry of
    the outermost ``nn.ModuleList`` above it (``model.layers.3``; T5's ``encoder.block.0``, not
    the sublayer inside it). Their spans hold the block's other operators (norms, MLP)."""
    modules = dict(model.named_modules())
    found: dict[str, torch.nn.Module] = {}
    for path, module in modules.items():
        if not path or not is_instrumented(module) or path in found:
            continue
        parts = path.split(".")
        for cut in range(1, len(parts)):
            parent = ".".join(parts[:cut - 1])
            if isinstance(modules.get(parent), torch.nn.ModuleList):
                block = ".".join(parts[:cut])
                if block != path:
                    found[block] = modules[block]
                break
    return list(found.items())


def _no_facts(names: tuple[str, ...]) -> Extractor:
    """A block's call has no attention facts of its own: its span is its time and operators."""
    def extract(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Facts:
        return BLOCK_FACTS  # not None: the arguments' shapes would be summarised instead

    return extract


def instrument(
    model: M,
    include: str | Iterable[str] | None = None,
    exclude: str | Iterable[str] | None = None,
    name_prefix: str | None = None,
    *,
    trace_model: bool = False,
    sample_rate: float | None = None,
) -> M:
    """Trace the attention layers of ``model``; returns ``model`` (instrumented in place).

    Finds ``nn.MultiheadAttention``, classes given to :func:`register_attention` and
    transformers-style attention modules (recognised by structure). ``include``/``exclude`` are
    glob patterns on module paths (``"model.layers.*.self_attn"``). Span name = module path.
    ``trace_model=True`` adds a parent span per model forward, one per ``generate()`` call and
    one per decoder layer (the ``nn.ModuleList`` entry holding an attention layer).
    Instrumenting twice keeps one wrapper per module and warns once.
    """
    _check_module(model, "instrument")
    inner = _unwrap_compiled(model)
    if inner is not model:  # torch.compile'd already: instrument the module it wraps
        instrument(inner, include, exclude, name_prefix, trace_model=trace_model,
                   sample_rate=sample_rate)
        return model
    root_name = name_prefix or type(model).__name__
    already = 0
    try:
        before = {id(site) for site in sites_of(model)}
        already += _instrument_layers(model, patterns(include), patterns(exclude), name_prefix,
                                      root_name, sample_rate)
        if trace_model:
            already += _instrument_root(model, root_name, name_prefix, sample_rate)
        _number(model, root_name, [s for s in sites_of(model) if id(s) not in before])
        register_when_dynamo_loads()
        # a model on the GPU: CUDA is up now, so CUPTI's start-up can run during set-up (the
        # settings the first call will take when none were set: warnings are that call's)
        warm_up_early(runtime.config.current or from_env(strict=False))
    except Exception as err:  # never break the host program: keep what was done, log the rest
        _log.internal_error("instrument", err)
    if already:
        warnings.warn(
            f"attnscope.instrument: {type(model).__name__} is already instrumented "
            f"({already} modules); keeping one wrapper each",
            UserWarning,
            stacklevel=2,
        )
    return model


def _number(model: torch.nn.Module, root_name: str, sites: list[Any]) -> None:
    """A model whose module paths another instrumented model of the process has already (an
    assistant model, a second encoder of one class): its new sites say which model they are
    (``attnscope.model``, ``attnscope.model.instance``: its number among the models
    ``instrument()`` was given), so that ``attnscope report`` keeps their rows apart. Any other
    model's spans carry neither."""
    number, others = runtime.instrumentation.model_number(model)
    paths = {site.attributes.get(schema.MODULE.name) for site in sites}
    mine = {id(m) for m in model.modules()}
    taken = {site.attributes.get(schema.MODULE.name) for other in others
             if id(other) not in mine and not any(m is model for m in other.modules())
             for site in sites_of(other)}
    if number > 1 and paths & taken:
        for site in sites:  # bounded as any site attribute (name_prefix is the user's)
            add_attributes(site.attributes, {schema.MODEL.name: root_name,
                                             schema.MODEL_INSTANCE.name: number})


def _check_module(model: Any, where: str) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"attnscope.{where} expects an nn.Module, got {type(model).__name__}")


def _unwrap_compiled(model: torch.nn.Module) -> torch.nn.Module:
    if type(model).__name__ != "OptimizedModule":
        return model
    inner = model._modules.get("_orig_mod", model.__dict__.get("_orig_mod"))
    return inner if isinstance(inner, torch.nn.Module) else model


def uninstrument(model: M) -> M:
    """Remove what :func:`instrument` added: forwards, hooks and state dict are as before.
    ``TypeError`` for anything but an ``nn.Module``."""
    _check_module(model, "uninstrument")
    for module in model.modules():
        try:
            restore(module, "forward")
            restore(module, "generate")
        except Exception as err:
            _log.internal_error("uninstrument", err)
    return model


def instrumented_modules(model: torch.nn.Module) -> list[str]:
    """Paths of the modules that carry an attnscope wrapper (compiled: as spans name them).
    ``TypeError`` for anything but an ``nn.Module``."""
    _check_module(model, "instrumented_modules")
    root = _unwrap_compiled(model)
    return [path for path, module in root.named_modules() if is_instrumented(module)]
