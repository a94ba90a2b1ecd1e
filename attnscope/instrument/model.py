"""``attnscope.instrument(model)``: trace every attention layer of a model in one line.

Each attention module gets an instance-level ``forward``: a bound method of the core wrapper
around the class's forward (its own call site, named by the module path). Nothing on the class
changes, so ``uninstrument`` only deletes what it added; ``copy.deepcopy`` re-binds the wrapper
to the copy; a pickled model unpickles uninstrumented. torch.compile inlines the original
forward (the wrapper is registered with ``torch.compiler.substitute_in_graph``): compiled calls
are not traced.
"""

from __future__ import annotations

import fnmatch
import functools
import re
import types
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import torch

from .. import _log
from .._state import state
from ..capture import retain, wrapper
from ..capture.args import param_names
from ..capture.compile import hide_from_dynamo, register_when_dynamo_loads
from ..capture.record import ATTENTION_KEY, MODEL_KEY, AttentionFacts, Capture, ModelFacts
from ..capture.sampling import CallSite
from . import Extractor, torch_nn
from . import transformers as hf
from .facts import head_info

__all__ = ["instrument", "instrumented_modules", "register_attention", "uninstrument"]

M = TypeVar("M", bound=torch.nn.Module)
UserExtractor = Callable[[torch.nn.Module, tuple[Any, ...], dict[str, Any]], Any]

_MARK = "__attnscope_site__"
_PRIOR = "_attnscope_prior_"  # + "forward" / "generate": the instance attribute we wrapped
_MISSING = object()
_FACT_FIELDS = frozenset(AttentionFacts.__slots__) - {"batch", "seq_q"}
_LAYER = re.compile(r"(?:^|\.)(\d+)(?:\.|$)")
_LAYER_DIGITS = re.compile(r"\.\d+(?=\.|$)")


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
    with state.registry_lock:
        state.attention_registry[cls] = extractor


def _patterns(value: str | Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return (value,) if isinstance(value, str) else tuple(value)


def _selected(path: str, include: tuple[str, ...] | None, exclude: tuple[str, ...] | None) -> bool:
    if include is not None and not any(fnmatch.fnmatchcase(path, p) for p in include):
        return False
    return not (exclude and any(fnmatch.fnmatchcase(path, p) for p in exclude))


def _registered(module: torch.nn.Module) -> tuple[bool, UserExtractor | None]:
    registry = state.attention_registry
    for cls in type(module).__mro__:
        if cls in registry:
            return True, registry[cls]
    return False, None


def _targets(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Attention modules of ``model`` by path; for structural matches the innermost wins."""
    declared = hf.recorded_attention_classes(model)
    explicit: list[tuple[str, torch.nn.Module]] = []
    structural: list[tuple[str, torch.nn.Module]] = []
    for path, module in model.named_modules():
        if isinstance(module, torch.jit.ScriptModule):
            continue  # TorchScript dispatches on the compiled class, not instance attributes
        if _registered(module)[0] or torch_nn.is_multihead_attention(module):
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
    """Hybrid models (linear attention, Mamba): a module of another class where the model's
    declared attention class sits in other layers is a different token mixer, not attention."""
    slots = {_LAYER_DIGITS.sub(".*", p) for p, m in model.named_modules() if isinstance(m, declared)}
    return [(p, m) for p, m in found
            if not declared or isinstance(m, declared) or _LAYER_DIGITS.sub(".*", p) not in slots]


def _layer_index(path: str) -> int | None:
    match = _LAYER.search(path)
    return int(match.group(1)) if match else None


def _extractor_for(module: torch.nn.Module, names: tuple[str, ...]) -> Extractor:
    registered, user = _registered(module)
    if registered and user is not None:
        return _wrap_user_extractor(module, user)
    if torch_nn.is_multihead_attention(module):
        return torch_nn.multihead_extractor(module)  # type: ignore[arg-type]
    return hf.hidden_state_extractor(module, names)


def _wrap_user_extractor(module: torch.nn.Module, user: UserExtractor) -> Extractor:
    heads, kv_heads, head_dim, head_dim_v = head_info(module)

    def extract(instance: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[tuple[str, Any]]:
        found = user(instance, args[1:], kwargs)
        if isinstance(found, AttentionFacts):
            return [(ATTENTION_KEY, found)]
        if not isinstance(found, Mapping):
            return []
        facts = AttentionFacts(int(found["batch"]), int(found["seq_q"]))
        facts.heads, facts.kv_heads = heads, kv_heads
        facts.head_dim, facts.head_dim_v = head_dim, head_dim_v
        for key, value in found.items():
            if key in _FACT_FIELDS:
                setattr(facts, key, value)
        return [(ATTENTION_KEY, facts)]

    return extract


def is_instrumented(module: torch.nn.Module, attr: str = "forward") -> bool:
    bound = module.__dict__.get(attr)
    return isinstance(bound, types.MethodType) and hasattr(bound.__func__, _MARK)


def _wrap_forward(
    module: torch.nn.Module,
    name: str,
    attributes: dict[str, Any],
    sample_rate: float | None,
    make_extractor: Callable[[tuple[str, ...]], Extractor],
) -> None:
    key = f"attnscope.instrument:{name}:{attributes['attnscope.module_class']}"
    site, names, fn = _site_for(module, "forward", name, attributes, sample_rate, key)
    site.extractor = make_extractor(names)
    _install(module, "forward", fn, site)


def _wrap_fused(module: torch.nn.Module, name: str, attributes: dict[str, Any],
                sample_rate: float | None) -> None:
    """An encoder layer whose fused fast path skips ``self_attn.forward``: that path is traced
    here (one span for the layer); the other calls go straight to the layer's forward, where
    the attention module's own wrapper traces them."""
    attributes = {**attributes, **torch_nn.FUSED_ATTRIBUTES}
    key = f"attnscope.instrument:{name}:fused"
    site, _, fn = _site_for(module, "forward", name, attributes, sample_rate, key)
    site.extractor = torch_nn.encoder_layer_extractor(module)
    traced = wrapper.wrap(fn, site, compile_check=False)
    taken = torch_nn.takes_fast_path

    @functools.wraps(fn)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if taken(args[0], args, kwargs):
            return traced(*args, **kwargs)
        return fn(*args, **kwargs)

    hide_from_dynamo(forward, fn)
    setattr(forward, _MARK, site)
    object.__setattr__(module, "forward", types.MethodType(forward, module))


def _naming(path: str, module: torch.nn.Module, name_prefix: str | None,
            root_name: str) -> tuple[str, dict[str, Any]]:
    """A layer's span name and its module attributes."""
    name = (f"{name_prefix}.{path}" if name_prefix else path) if path else root_name
    attrs: dict[str, Any] = {"attnscope.module": path or root_name,
                             "attnscope.module_class": type(module).__qualname__}
    index = _layer_index(path)
    if index is not None:
        attrs["attnscope.layer_index"] = index
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
        _wrap_fused(module, name, attrs, sample_rate)


def _site_for(module: torch.nn.Module, attr: str, name: str, attributes: dict[str, Any],
              sample_rate: float | None, key: str) -> tuple[CallSite, tuple[str, ...], Any]:
    """The call site for ``module.<attr>``, its parameter names and the function to wrap."""
    fn, names = _target(module, attr)
    site = wrapper.make_site(fn, name, sample_rate, _named(attributes, module, attr),
                             kind="method", param_names=names, key=key)
    return site, names, fn


def _install(module: torch.nn.Module, attr: str, fn: Callable[..., Any], site: CallSite) -> None:
    """An instance-level ``attr``: the core wrapper around ``fn``, bound to ``module``."""
    traced = wrapper.wrap(fn, site, compile_check=False)
    setattr(traced, _MARK, site)
    object.__setattr__(module, attr, types.MethodType(traced, module))


def _named(attributes: dict[str, Any], module: torch.nn.Module, attr: str) -> dict[str, Any]:
    """``code.function.name``: the class's method, also when an instance-level one was wrapped."""
    method = getattr(type(module), attr, None)
    name = getattr(method, "__qualname__", None) or f"{type(module).__qualname__}.{attr}"
    return {**attributes, "code.function.name": name}


def _target(module: torch.nn.Module, attr: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """The method to wrap and its parameter names.

    An instance-level attribute that was already there (accelerate hooks, user patches) is kept on
    the module and wrapped through :func:`_through`; otherwise the class's method is wrapped.
    """
    prior = module.__dict__.get(attr, _MISSING)
    if prior is _MISSING:
        fn: Callable[..., Any] = getattr(type(module), attr)
        return fn, param_names(fn, self_first=True)
    module.__dict__[_PRIOR + attr] = prior
    return _through(attr), param_names(prior, self_first=True, bound=True)


def _through(attr: str) -> Callable[..., Any]:
    """A method calling the instance-level ``attr`` that was there before instrumenting.

    The previous callable is kept on the module itself, not in this closure: a deep copy of the
    module then carries (and re-binds) its own, and nothing global keeps the module alive.
    """
    key = _PRIOR + attr

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        return self.__dict__[key](*args, **kwargs)

    return forward


def _wrap_generate(
    model: torch.nn.Module, name: str, attributes: dict[str, Any], sample_rate: float | None
) -> None:
    """``generate()`` gets a span with gen_ai.usage.input_tokens / output_tokens.

    The core wrapper, with one step after the call (the site's ``on_result``): the returned ids
    are handed to the worker, which counts new tokens up to each row's first end-of-sequence.
    """
    site, names, fn = _site_for(model, "generate", name, attributes, sample_rate,
                                f"attnscope.instrument:{name}")
    facts_for = hf.generate_facts(model, names)
    site.extractor = lambda instance, args, kwargs: (
        [] if (f := facts_for(args, kwargs)) is None else [(MODEL_KEY, f)]
    )
    site.on_result = _keep_output
    _install(model, "generate", fn, site)


def _keep_output(cap: Capture, result: Any) -> None:
    for key, value in cap.summary:
        if key == MODEL_KEY and isinstance(value, ModelFacts):
            value.output = retain.keep(cap, getattr(result, "sequences", result))


def _restore(module: torch.nn.Module, attr: str) -> bool:
    if not is_instrumented(module, attr):
        return False
    del module.__dict__[attr]
    prior = module.__dict__.pop(_PRIOR + attr, _MISSING)
    if prior is not _MISSING:
        module.__dict__[attr] = prior
    return True


def _instrument_layers(model: torch.nn.Module, inc: tuple[str, ...] | None,
                       exc: tuple[str, ...] | None, name_prefix: str | None, root_name: str,
                       sample_rate: float | None) -> int:
    """Wrap every selected attention layer; returns how many already were."""
    already = 0
    for path, module in _targets(model):
        if not _selected(path, inc, exc):
            continue
        if is_instrumented(module):
            already += 1
            continue
        name, attrs = _naming(path, module, name_prefix, root_name)
        extractor = functools.partial(_extractor_for, module)
        _wrap_forward(module, name, attrs, sample_rate, extractor)
    _instrument_fused(model, name_prefix, root_name, sample_rate)
    return already


def _instrument_root(model: torch.nn.Module, root_name: str, sample_rate: float | None) -> int:
    """``trace_model=True``: the model's forward and generate(); returns 1 if already done."""
    already = 0
    attrs = {"attnscope.module": root_name, "attnscope.module_class": type(model).__qualname__}
    if is_instrumented(model):  # twice, or the root is itself an attention layer
        if not any(module is model for _, module in _targets(model)):
            already = 1
    else:
        extract_model = functools.partial(hf.model_extractor, model)
        _wrap_forward(model, root_name, attrs, sample_rate, extract_model)
    if callable(getattr(model, "generate", None)) and not is_instrumented(model, "generate"):
        _wrap_generate(model, root_name + ".generate", attrs, sample_rate)
    return already


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
    ``trace_model=True`` adds a parent span per model forward and one per ``generate()`` call.
    Instrumenting twice keeps one wrapper per module and warns once.
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"attnscope.instrument expects an nn.Module, got {type(model).__name__}")
    inner = _unwrap_compiled(model)
    if inner is not model:  # torch.compile'd already: instrument the module it wraps
        instrument(inner, include, exclude, name_prefix, trace_model=trace_model,
                   sample_rate=sample_rate)
        return model
    root_name = name_prefix or type(model).__name__
    already = 0
    try:
        already += _instrument_layers(model, _patterns(include), _patterns(exclude), name_prefix,
                                      root_name, sample_rate)
        if trace_model:
            already += _instrument_root(model, root_name, sample_rate)
        register_when_dynamo_loads()
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


def _unwrap_compiled(model: torch.nn.Module) -> torch.nn.Module:
    if type(model).__name__ != "OptimizedModule":
        return model
    inner = model._modules.get("_orig_mod", model.__dict__.get("_orig_mod"))
    return inner if isinstance(inner, torch.nn.Module) else model


def uninstrument(model: M) -> M:
    """Remove what :func:`instrument` added: forwards, hooks and state dict are as before."""
    for module in model.modules():
        try:
            _restore(module, "forward")
            _restore(module, "generate")
        except Exception as err:
            _log.internal_error("uninstrument", err)
    return model


def instrumented_modules(model: torch.nn.Module) -> list[str]:
    """Paths of the modules that carry an attnscope wrapper (compiled: as spans name them)."""
    root = _unwrap_compiled(model)
    return [path for path, module in root.named_modules() if is_instrumented(module)]
