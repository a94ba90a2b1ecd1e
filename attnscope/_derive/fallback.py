"""Silent SDPA fallback: the best backend a call's inputs allowed, against the one that ran.

Worker side only, and from shapes, dtypes and flags only: no tensor data is read. CUDA calls ask
torch's own eligibility checks (``torch.backends.cuda.can_use_*`` with ``debug=True``) on
shape-only tensors of the call's device, shapes, dtype and last-dimension strides (no memory
behind them); their reason is the warning text they emit. CPU calls follow the CPU flash kernel's
conditions, checked against torch 2.13's choice (tests/test_fallback.py).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .. import _log
from .. import _schema as schema
from .._record.capture import SdpaCall, SdpaContext, TensorMeta, find_qkv
from .._runtime import runtime

__all__ = ["Inputs", "Verdict", "annotate", "annotate_implementation", "assess", "from_summary",
           "warn"]

# Fastest first, as torch's own priority order on CUDA (sdp_utils.cpp); CPU has flash or math.
_CUDA_ORDER = ("flash", "cudnn", "efficient")
_FUSED = frozenset(_CUDA_ORDER)
# Reasons are torch's words, kept to a span attribute's size.
_REASON_CHARS = 240


@dataclass(frozen=True)
class Inputs:
    """What the worker knows of one SDPA call: shapes, dtypes, strides and flags, never data.

    ``allowed`` is the set of backends the call's ``sdpa_kernel`` context allowed (None: unknown);
    it only changes the reason given, since an excluded faster backend is still a fallback.
    """

    device_type: str
    shapes: tuple[Sequence[int], Sequence[int], Sequence[int]]
    dtype: Any
    last_dim_strides: tuple[int, int, int] | None = None  # None: not recorded
    mask_shape: Sequence[int] | None = None
    mask_dtype: Any = None
    dropout_p: float = 0.0
    is_causal: bool = False
    enable_gqa: bool = False
    allowed: frozenset[str] | None = None
    device_index: int | None = None  # the call's device (cuda:N); None: the worker's current one


@dataclass(frozen=True)
class Verdict:
    """``expected``: the best eligible backend ("" when none was); ``reason``: why not fused."""

    fallback: bool
    expected: str
    reason: str


def _bounded(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _REASON_CHARS else text[:_REASON_CHARS - 1] + "…"


def _cpu(inputs: Inputs) -> tuple[str, str]:
    """CPU flash (``use_flash_attention_cpp``): the conditions that decide it for dense inputs."""
    if inputs.dropout_p > 0.0:
        return "", f"flash (CPU) does not support dropout (dropout_p={inputs.dropout_p:g})"
    if any(len(shape) != 4 for shape in inputs.shapes):
        return "", "flash (CPU) needs 4-D query, key and value"
    strides = inputs.last_dim_strides
    if strides is None:
        return "?", ""  # eligibility hangs on the strides, which were not recorded
    if any(stride != 1 for stride in strides):
        return "", ("flash (CPU) needs query, key and value with last-dimension stride 1, got "
                    f"{list(strides)}")
    return "flash", ""


def _cuda_checks() -> dict[str, Callable[..., bool]]:
    import torch

    checks = {"flash": torch.backends.cuda.can_use_flash_attention,
              "efficient": torch.backends.cuda.can_use_efficient_attention}
    cudnn = getattr(torch.backends.cuda, "can_use_cudnn_attention", None)
    if cudnn is not None:
        checks["cudnn"] = cudnn
    return checks


# What torch's checks say, in their debug warnings, of a backend the process's flags turn off.
# The flags (``sdpa_kernel``, ``torch.backends.cuda.enable_*_sdp``) are process-wide and read when
# the worker asks, not when the call ran: such a "no" says nothing about the call's inputs, unless
# the call's own record (``Inputs.allowed``) shows the backend was off for it too.
_DISABLED = "runtime disabled"


@functools.cache
def _shape_only_type() -> type[Any]:
    """A tensor type with sizes, strides, a dtype and a device but no memory behind it
    (``_make_wrapper_subclass``: a storage with a null pointer, no allocator call)."""
    import torch

    class ShapeOnly(torch.Tensor):
        @classmethod
        def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (),  # type: ignore[override]
                               kwargs: Any = None) -> Any:
            # torch's checks read metadata only; an op asked of one is a torch change to hear of
            raise RuntimeError(f"attnscope: a shape-only tensor was asked to run {func}")

    return ShapeOnly


def _shape_only(shape: Sequence[int], dtype: Any, device: Any, last_stride: int = 1) -> Any:
    """A tensor of ``shape`` and ``dtype`` on ``device`` (``cuda:N``) whose last dimension has
    stride ``last_stride`` (the others packed around it), for torch's checks only.

    Why not meta tensors (torch rejects them: "All tensors need to be on cuda device"), nor tiny
    real ones (``torch.empty(0)`` views fail as_strided's bounds check; any real allocation goes
    through the caching allocator on the worker's stream and, on a cache miss, ``cudaMalloc``,
    which a CUDA graph capturing on another thread must not meet): these carry the call's real
    device type with no storage, so asking the checks makes no allocation, no stream work and no
    sync. What the checks do touch on the device side is the current device's properties (cached
    by torch after the first read), under the worker's relaxed capture mode (worker.cuda), and only
    for profiled calls, which are never made while their stream captures (capture.wrapper).
    """
    import torch

    dims = tuple(int(n) for n in shape)
    strides = [0] * len(dims)
    step = max(int(last_stride), 0)
    for i in range(len(dims) - 1, -1, -1):
        strides[i] = step
        step *= max(dims[i], 1)
    return torch.Tensor._make_wrapper_subclass(
        _shape_only_type(), dims, strides=tuple(strides), dtype=dtype, device=device)


def _params(inputs: Inputs) -> Any:
    """torch's ``SDPAParams`` for the call, on shape-only tensors of its device."""
    import torch

    device = torch.device("cuda", inputs.device_index) if inputs.device_index is not None \
        else torch.device("cuda")
    strides = inputs.last_dim_strides or (1, 1, 1)  # unrecorded: as laid out by SDPA's callers
    q, k, v = (_shape_only(shape, inputs.dtype, device, stride)
               for shape, stride in zip(inputs.shapes, strides, strict=True))
    mask = (_shape_only(inputs.mask_shape, inputs.mask_dtype, device)
            if inputs.mask_shape is not None and inputs.mask_dtype is not None else None)
    make: Any = torch.backends.cuda.SDPAParams
    try:
        return make(q, k, v, mask, inputs.dropout_p, inputs.is_causal, inputs.enable_gqa)
    except TypeError:  # torch before 2.5: no enable_gqa
        if inputs.enable_gqa:
            raise
        return make(q, k, v, mask, inputs.dropout_p, inputs.is_causal)


def _on_device(index: int | None) -> Any:
    """The call's device current on the worker while the checks read its properties (its
    compute capability decides flash and cuDNN); the worker's own device otherwise."""
    import torch

    if index is None or not torch.cuda.is_available():
        return contextlib.nullcontext()
    return torch.cuda.device(index)


def _cuda(inputs: Inputs) -> tuple[str, str]:
    """Torch's checks on the call's device: the first eligible backend in torch's order and,
    when none is, their reasons; ``"?"`` when a faster backend's answer hangs on the process's
    flags of the moment (see ``_DISABLED``)."""
    params = _params(inputs)
    checks = _cuda_checks()
    reasons: list[str] = []
    unknown = False
    with _on_device(inputs.device_index):
        for name in _CUDA_ORDER:
            if name not in checks:
                continue
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                ok = checks[name](params, True)
            if ok:
                return name, ""
            words = "; ".join(str(w.message) for w in caught) or "not eligible"
            # off now but not known to have been off for the call: its eligibility is unknown
            unknown = unknown or (_DISABLED in words
                                  and (inputs.allowed is None or name in inputs.allowed))
            reasons.append(f"{name}: {words}")
    return ("?" if unknown else ""), " | ".join(reasons)


def assess(ran: str, inputs: Inputs) -> Verdict | None:
    """The verdict for an SDPA call whose backend ``ran``; None when nothing can be said.

    A fallback is a call that ran math while a fused backend was eligible, or ran math because
    none was. ``ran`` unknown, or a device without known rules, gives None: never a guess.
    """
    if ran not in _FUSED and ran != "math":
        return None
    if inputs.device_type == "cpu":
        expected, reason = _cpu(inputs)
    elif inputs.device_type == "cuda":
        expected, reason = _cuda(inputs)
    else:
        return None
    if expected == "?":
        return Verdict(False, ran, "") if ran != "math" else None
    if ran != "math":
        return Verdict(False, expected, _bounded(reason))
    if expected and inputs.allowed is not None and expected not in inputs.allowed:
        # Still slower than it had to be, but the cause is the program's own context.
        reason = f"{expected} was eligible but excluded by an sdpa_kernel context"
    elif expected:
        reason = f"{expected} was eligible but the math kernel ran"
    return Verdict(True, expected, _bounded(reason))


def from_summary(summary: list[tuple[str, Any]], sdpa: SdpaCall | None = None) -> Inputs | None:
    """An SDPA call's :class:`Inputs` from its argument summary and, for a profiled call, its
    :class:`SdpaCall`: the SDPA call made inside it (``capture.inner_sdpa``), or the strides and
    the backends allowed of a call of ``instrument_sdpa()``, which records them.

    The mask is read for its shape and dtype only; None when the summary is not an SDPA call.
    """
    context: SdpaContext | None = None
    if sdpa is not None:
        if sdpa.inner:  # the SDPA call inside a profiled call: judged on its own summary
            summary = sdpa.inner
        context = sdpa.context
    named = dict(summary)
    qkv = find_qkv(summary)
    if qkv is None:
        return None
    q, k, v = qkv
    mask: Any = named.get("attn_mask")
    mask_shape = mask_dtype = None
    if isinstance(mask, TensorMeta) or (hasattr(mask, "shape") and hasattr(mask, "dtype")):
        mask_shape, mask_dtype = tuple(mask.shape), mask.dtype
    dropout = named.get("dropout_p", 0.0)
    strides: tuple[int, int, int] | None = None
    allowed: frozenset[str] | None = None
    if context is not None and len(context.strides) == 3:
        strides = (context.strides[0], context.strides[1], context.strides[2])
        allowed = frozenset(context.allowed)
    index = getattr(q.device, "index", None)
    return Inputs(getattr(q.device, "type", str(q.device)), (q.shape, k.shape, v.shape), q.dtype,
                  last_dim_strides=strides, mask_shape=mask_shape, mask_dtype=mask_dtype,
                  dropout_p=float(dropout) if isinstance(dropout, (int, float)) else 0.0,
                  is_causal=named.get("is_causal") is True,
                  enable_gqa=named.get("enable_gqa") is True, allowed=allowed,
                  device_index=index if isinstance(index, int) else None)


class _Warned:
    """The once-per-site keys handed to ``_log`` so far, at most ``limit`` of them: ``_log`` keeps
    a rate-limit entry per key for the process's life, so a program whose sites never stop
    changing (a model built per request) must not hand it new keys for ever. Forgotten with
    ``_log``'s own memory (``runtime.reset()`` gives it a new dict). Worker thread only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.keys: set[str] = set()
        self.owner: object = None

    def admit(self, key: str) -> bool:
        """Whether ``key`` may be logged: known already, or room for one more."""
        if self.owner is not runtime.log.last_logged:
            self.owner, self.keys = runtime.log.last_logged, set()
        if key in self.keys:
            return True
        if len(self.keys) >= self.limit:
            return False
        self.keys.add(key)
        return True


# Distinct sites (and fallbacks) warned about; past this many, one WARNING says the rest are
# named on their spans only.
_WARN_SITES = 256
_warned = _Warned(_WARN_SITES)


def _warn_site(key: str, text: str) -> None:
    if _warned.admit(key):
        _log.warn_once(key, text)
    else:
        _log.warn_once("fallback-sites-full", f"attnscope: more than {_warned.limit} call sites "
                       "fell back to a slower attention kernel; the others are not logged (their "
                       "spans still say so: attnscope.backend.fallback)")


def warn(site: str, verdict: Verdict) -> None:
    """One WARNING per call site and fallback (rate-limited by ``_log``) in plain words.

    The key is the site and the verdict: a site is one traced function or layer, so the SDPA
    calls of every source line that calls ``F.scaled_dot_product_attention`` (one site under
    ``instrument_sdpa()``) share it, and each different fallback among them gets its own line.
    """
    if not verdict.fallback:
        return
    site = site[:160]
    if verdict.expected:
        text = f"{site} ran the math kernel: {verdict.reason or verdict.expected + ' was eligible'}"
    else:
        text = f"{site} ran the math kernel: no fused kernel was eligible because {verdict.reason}"
    _warn_site(f"fallback:{site}\x00{verdict.expected}\x00{verdict.reason}", text)


def _site_label(attrs: dict[str, Any], site: str) -> str:
    """What a WARNING calls the call site: the layer's module path; else the span's name and,
    when it differs, the traced function's qualified name (two functions traced under one name
    are two sites)."""
    if attrs.get(_MODULE):
        return site
    qualname = attrs.get(_FUNCTION)
    return f"{site} ({qualname[:96]})" if isinstance(qualname, str) and qualname \
        and qualname != site else site


_FALLBACK, _EXPECTED, _REASON = (schema.BACKEND_FALLBACK.name, schema.BACKEND_EXPECTED.name,
                                 schema.BACKEND_REASON.name)
_MODULE, _FUNCTION = schema.MODULE.name, schema.CODE_FUNCTION_NAME.name


# Calls repeat their shapes: one verdict per distinct input, a bounded number of them.
@functools.lru_cache(maxsize=256)
def _cached(ran: str, inputs: Inputs) -> Verdict | None:
    return assess(ran, inputs)


def annotate(attrs: dict[str, Any], summary: list[tuple[str, Any]], site: str,
             sdpa: SdpaCall | None = None) -> None:
    """Add the fallback attributes to an SDPA call's span ``attrs`` (backend known) and warn;
    ``summary`` and ``sdpa``: the call's (:func:`from_summary`)."""
    ran = attrs.get(schema.BACKEND.name)
    if not isinstance(ran, str) or (not summary and sdpa is None):
        return
    try:
        inputs = from_summary(summary, sdpa)
        verdict = _cached(ran, inputs) if inputs is not None else None
    except Exception as exc:  # noqa: BLE001 - never break the span over a verdict
        _log.internal_error("fallback", exc)
        return
    if verdict is None:
        return
    attrs[_FALLBACK] = verdict.fallback
    if verdict.fallback:
        # no fused kernel eligible: the math kernel was the only one, and "none" says so (an
        # empty string reads as a value left blank)
        attrs[_EXPECTED] = verdict.expected or "none"
        attrs[_REASON] = verdict.reason
        warn(_site_label(attrs, site), verdict)


# transformers' attn_implementation names, as ran_implementation names them
_CONFIGURED = {"sdpa": "sdpa", "eager": "eager", "flex_attention": "flex"}
_SLOWER = {"eager"}  # what a fused implementation falls back to


def annotate_implementation(attrs: dict[str, Any], site: str) -> None:
    """A profiled layer whose config names one implementation but whose ops show another ran
    (transformers before 5 ran ``eager`` for ``sdpa`` layers under ``output_attentions=True``):
    one WARNING per site; when the one that ran is eager, a fallback with the configured one as
    expected."""
    configured = attrs.get(schema.IMPLEMENTATION.name)
    ran = attrs.get(schema.IMPLEMENTATION_RAN.name)
    want = _CONFIGURED.get(configured) if isinstance(configured, str) else None
    if want is None or ran not in _CONFIGURED.values() or ran == want:
        return
    reason = _bounded(f"the model's config names attn_implementation={configured!r} but the "
                      f"layer's ops show {ran} attention ran")
    if ran in _SLOWER:
        attrs[_FALLBACK], attrs[_EXPECTED], attrs[_REASON] = True, configured, reason
    _warn_site(f"implementation:{site[:160]}", f"{site[:160]}: {reason}")

