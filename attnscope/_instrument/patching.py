"""How :func:`attnscope.instrument` patches a module, and how :func:`attnscope.uninstrument`
undoes it.

Each patched module gets an instance-level ``forward`` (or ``generate``): a bound method of the
core wrapper around the class's method, marked with its call site. An instance-level attribute
that was there before (accelerate hooks, user patches) is kept on the module and called through,
and put back on restore. Nothing on the class changes.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import torch

from .. import _schema as schema
from .._capture import inner_sdpa, retain, wrapper
from .._capture.args import param_names
from .._capture.sampling import CallSite
from .._record.capture import Capture, Facts
from . import Extractor, torch_nn
from . import transformers as hf

__all__ = ["is_instrumented", "sites_of", "wrap_forward", "wrap_fused", "wrap_generate",
           "restore"]

_MARK = "__attnscope_site__"
_PRIOR = "_attnscope_prior_"  # + "forward" / "generate": the instance attribute we wrapped
_MISSING = object()


def is_instrumented(module: torch.nn.Module, attr: str = "forward") -> bool:
    bound = module.__dict__.get(attr)
    return isinstance(bound, types.MethodType) and hasattr(bound.__func__, _MARK)


def wrap_forward(
    module: torch.nn.Module,
    name: str,
    attributes: dict[str, Any],
    sample_rate: float | None,
    make_extractor: Callable[[tuple[str, ...]], Extractor],
) -> None:
    key = f"attnscope.instrument:{name}:{attributes[schema.MODULE_CLASS.name]}"
    site, names, fn = _site_for(module, "forward", name, attributes, sample_rate, key)
    site.extractor = make_extractor(names)
    site.on_profile = inner_sdpa.arm  # the SDPA call inside, for its fallback verdict
    install(module, "forward", fn, site)


def wrap_fused(module: torch.nn.Module, name: str, attributes: dict[str, Any],
                sample_rate: float | None) -> None:
    """An encoder layer whose fused fast path skips ``self_attn.forward``: that path is traced
    here (one span for the layer); the other calls go straight to the layer's forward, where
    the attention module's own wrapper traces them."""
    attributes = {**attributes, **torch_nn.FUSED_ATTRIBUTES}
    key = f"attnscope.instrument:{name}:fused"
    site, _, fn = _site_for(module, "forward", name, attributes, sample_rate, key)
    site.extractor = torch_nn.encoder_layer_extractor(module)
    traced = wrapper.wrap(fn, site, compile_check=True)
    taken = torch_nn.takes_fast_path

    @functools.wraps(fn)
    def forward(*args: Any, **kwargs: Any) -> Any:
        if taken(args[0], args, kwargs):
            return traced(*args, **kwargs)
        return fn(*args, **kwargs)

    setattr(forward, _MARK, site)
    object.__setattr__(module, "forward", types.MethodType(forward, module))


def _site_for(module: torch.nn.Module, attr: str, name: str, attributes: dict[str, Any],
              sample_rate: float | None, key: str) -> tuple[CallSite, tuple[str, ...], Any]:
    """The call site for ``module.<attr>``, its parameter names and the function to wrap."""
    fn, names = _target(module, attr)
    site = wrapper.make_site(fn, name, sample_rate, _named(attributes, module, attr),
                             kind="method", param_names=names, key=key)
    return site, names, fn


def install(module: torch.nn.Module, attr: str, fn: Callable[..., Any], site: CallSite) -> None:
    """An instance-level ``attr``: the core wrapper around ``fn``, bound to ``module``.

    The wrapper asks ``is_compiling()`` rather than being registered with Dynamo: a registered
    wrapper is replaced by a stand-in that calls ``fn`` without a source, so Dynamo cannot follow
    the globals ``fn`` reads when they are modules (transformers 5.25 makes
    ``apply_rotary_pos_emb`` one: 10 graphs instead of 1 for a compiled Llama), and a frame
    Dynamo starts at the wrapper itself would trace the sampling code."""
    traced = wrapper.wrap(fn, site, compile_check=True)
    setattr(traced, _MARK, site)
    object.__setattr__(module, attr, types.MethodType(traced, module))


def _named(attributes: dict[str, Any], module: torch.nn.Module, attr: str) -> dict[str, Any]:
    """``code.function.name``: the class's method, also when an instance-level one was wrapped."""
    method = getattr(type(module), attr, None)
    name = getattr(method, "__qualname__", None) or f"{type(module).__qualname__}.{attr}"
    return {**attributes, schema.CODE_FUNCTION_NAME.name: name}


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


def wrap_generate(
    model: torch.nn.Module, name: str, attributes: dict[str, Any], sample_rate: float | None
) -> None:
    """``generate()`` gets a span with gen_ai.operation.name and gen_ai.usage.input_tokens /
    output_tokens (and the forward's gen_ai.request.model, in ``attributes`` when known).

    The core wrapper, with one step after the call (the site's ``on_result``): the returned ids
    are handed to the worker, which counts new tokens up to each row's first end-of-sequence.
    The operation is a site attribute: no per-call work.
    """
    attributes = {**attributes, schema.OPERATION_NAME.name: schema.TEXT_COMPLETION}
    site, names, fn = _site_for(model, "generate", name, attributes, sample_rate,
                                f"attnscope.instrument:{name}")
    facts_for = hf.generate_facts(model, names)
    site.extractor = lambda instance, args, kwargs: (
        None if (f := facts_for(args, kwargs)) is None else Facts(model=f)
    )
    site.on_result = _keep_output
    install(model, "generate", fn, site)


def _keep_output(cap: Capture, result: Any) -> None:
    model = cap.facts.model
    if model is not None:
        model.output = retain.keep(cap, getattr(result, "sequences", result))


def sites_of(model: torch.nn.Module) -> list[CallSite]:
    """The call sites of every wrapped ``forward`` and ``generate`` in ``model``."""
    found = []
    for module in model.modules():
        for attr in ("forward", "generate"):
            if is_instrumented(module, attr):
                found.append(getattr(module.__dict__[attr].__func__, _MARK))
    return found


def restore(module: torch.nn.Module, attr: str) -> bool:
    if not is_instrumented(module, attr):
        return False
    del module.__dict__[attr]
    prior = module.__dict__.pop(_PRIOR + attr, _MISSING)
    if prior is not _MISSING:
        module.__dict__[attr] = prior
    return True
