"""What a person reads on a span: ``attnscope.summary`` and the ``kernel.top`` list (worker side).

The exact attributes stay as they are (machines read them: ``attnscope report``/``diff``, backends);
these strings only repeat them in units, one line per span, so that Jaeger's tag list reads at a
glance. They are built once per emitted span, so they are plain f-strings over the attributes
already computed: ``attnscope.cli.render.units`` (the CLI's formatter, the same rules) costs
several times as much per value, which the worker would pay on every span (docs/benchmarks.md,
"Goal 4, second pass").

Numbers have 3 significant digits and never print in exponent form (``999.7 µs`` is ``1 ms``,
``12345 s`` is ``12345 s``, not ``1.23e+04 s``).
"""

from __future__ import annotations

from typing import Any, TypeGuard

from .. import _schema as schema
from .._units import binary_bytes, duration, flop_rate, si, top_list

__all__ = ["Summaries", "duration", "si", "flop_rate", "binary_bytes",
           "op_summary", "top_list", "shapes", "compact_shapes"]

MAX_SUMMARY = 256  # a span's strings are cut there anyway (emit.MAX_STRING)

_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64",
           "float8_e4m3fn": "fp8e4m3", "float8_e5m2": "fp8e5m2"}
_PHASES = frozenset(("prefill", "decode"))

_WALL, _DEVICE_NS = schema.WALL_NS.name, schema.DEVICE_NS.name
_FLOPS, _TFLOPS, _TOKENS = schema.FLOPS.name, schema.TFLOPS.name, schema.TOKENS.name
_IMPL, _BACKEND, _PHASE = schema.IMPLEMENTATION.name, schema.BACKEND.name, schema.PHASE.name
_BATCH, _HEADS, _KV_HEADS = schema.BATCH_SIZE.name, schema.NUM_HEADS.name, schema.NUM_KV_HEADS.name
_SEQ_Q, _SEQ_KV, _HEAD_DIM = schema.SEQ_LEN_Q.name, schema.SEQ_LEN_KV.name, schema.HEAD_DIM.name
_DTYPE, _REPEATED = schema.DTYPE.name, schema.KV_REPEATED_FROM.name
_AUTOCAST, _RECOMPUTE = schema.AUTOCAST_DTYPE.name, schema.RECOMPUTE.name
_TIER, _PROFILED_BY, _SLOW = schema.TIER.name, schema.PROFILED_BY.name, schema.SLOW.name
_EXACT, _REASON = schema.EXACT.name, schema.INEXACT_REASON.name
_PEAK, _RSS = schema.PEAK_BYTES.name, schema.HOST_RSS_BYTES.name
_IN, _OUT = schema.INPUT_TOKENS.name, schema.OUTPUT_TOKENS.name
_SELF_NS, _FOLDED = schema.KERNEL_SELF_NS.name, schema.KERNEL_FOLDED.name
_SHAPES = schema.KERNEL_INPUT_SHAPES.name


def _int(value: Any) -> TypeGuard[int]:
    return type(value) is int


def shapes(attrs: dict[str, Any]) -> str | None:
    """The query's and keys' shapes as ``q[B,H,Sq,D] k[B,Hkv,Skv,D] bf16`` (that order, whatever
    the tensors' layout), from the call's attributes; None without the query's four."""
    b, h, sq, d = attrs.get(_BATCH), attrs.get(_HEADS), attrs.get(_SEQ_Q), attrs.get(_HEAD_DIM)
    if not (_int(b) and _int(h) and _int(sq) and _int(d)):
        return None
    text = f"q[{b},{h},{sq},{d}]"
    hk, skv = attrs.get(_KV_HEADS), attrs.get(_SEQ_KV)
    if _int(hk) and _int(skv):
        text += f" k[{b},{hk},{skv},{d}]"
    dtype = attrs.get(_DTYPE)
    if isinstance(dtype, str):
        text += " " + _DTYPES.get(dtype, dtype)
    autocast = attrs.get(_AUTOCAST)
    if isinstance(autocast, str):
        text += f" (autocast {_DTYPES.get(autocast, autocast)})"
    return text


_KEEP = 512  # texts kept per kind (bounded: cleared when full)
# what the kept texts are made of (:func:`_static_parts`): a site whose attributes hold none of
# these makes the same texts as any other site for the same shape
_STATIC = frozenset((_FLOPS, _IMPL, _BACKEND, _PHASE, _TOKENS, _IN, _OUT, _EXACT, _REASON, _BATCH,
                     _HEADS, _SEQ_Q, _HEAD_DIM, _KV_HEADS, _SEQ_KV, _DTYPE))


class Summaries:
    """``attnscope.summary`` of call spans, for one span builder.

    Most of a summary is what the call's shape decides (FLOPs, phase, tokens, shapes: derive's
    attributes, kept per summary by the worker) with the implementation and backend: those texts
    are kept, so a span pays for its time and its FLOP rate, one look-up and one f-string. The
    RSS (read at most every 250 ms, a new value at nearly every read) ends the summary, its text
    kept for the last reading only.
    """

    __slots__ = ("_kept", "_rss", "_sites")

    def __init__(self) -> None:
        self._kept: dict[tuple[Any, ...], tuple[Any, Any, str, str]] = {}
        # per site's attributes: (them, whether they hold a part of the kept texts); a site
        # that holds none shares its shape's texts with every other site (the layers of a
        # forward: a new shape each decode step when a padded batch's mask names it)
        self._sites: dict[int, tuple[Any, bool]] = {}
        # the last RSS reading and its text: RSS is the marks' last part, added per span and not
        # part of the kept texts' key (each new reading missed every kept text: in a traced
        # generate() 9 spans in 10 rebuilt their texts; issue 37 goal 4)
        self._rss: tuple[int | None, str] = (None, "")

    def call(self, attrs: dict[str, Any], kept: tuple[Any, Any] | None = None) -> str:
        """The summary of a call span: its time (the one ``tflops`` divides by: device time when
        measured, else wall time), FLOPs, FLOP rate (``tflops``), implementation and backend,
        phase and tokens, shapes and what marks the call, joined by `` · ``.

        ``kept``: (derive's attributes, the site's attributes) the span was made of, when nothing
        else of the call can change those figures (no ``span()`` attributes): the same two
        objects, with the same marks, give the same texts.
        """
        get = attrs.get
        texts: tuple[Any, Any, str, str] | None = None
        if kept is not None:
            shape, site = kept
            if not self._site_matters(site):
                site = None
            key = (id(shape), id(site), get(_IMPL), get(_BACKEND), get(_TIER), get(_REPEATED),
                   get(_PROFILED_BY), get(_SLOW), get(_PEAK), get(_AUTOCAST), get(_RECOMPUTE))
            # an entry holds its two objects: while it is kept, their ids are no other object's
            texts = self._kept.get(key)
        if texts is None:
            flops, rest = _static_parts(attrs)
            texts = (None, None, flops, rest + _marks(attrs))
            if kept is not None:
                if len(self._kept) >= _KEEP:
                    self._kept.clear()
                self._kept[key] = texts = (shape, site, flops, texts[3])
        # inline, no helper calls: this is what every span pays (a function call is a good part
        # of it: docs/benchmarks.md); the units and edges are those of duration() and flop_rate()
        ns = get(_DEVICE_NS)
        if type(ns) is int and ns > 0:
            basis = " device"
        else:
            ns, basis = get(_WALL), " wall"
        if type(ns) is not int:
            busy = "—"
        elif ns >= 999.5e3:
            busy = f"{ns / 1e6:.3g} ms{basis}" if ns < 999.5e6 else f"{duration(ns)}{basis}"
        elif ns >= 999.5:
            busy = f"{ns / 1e3:.3g} µs{basis}"
        else:
            busy = f"{ns} ns{basis}"
        t = get(_TFLOPS)
        work = get(_FLOPS)
        if type(t) is float and type(work) is int and type(ns) is int and ns > 0:
            # from the exact figures: the attribute's 4 digits rounded again to 3 can be one
            # digit off (103,468 FLOP/s kept as 1.035e-7 TFLOP/s read "104 kFLOP/s")
            t = work / ns / 1e3
        if type(t) is not float or not 0.9995e-9 <= t < 999.5:
            rate = "" if type(t) is not float or not -1e300 < t < 1e300 else " · " + flop_rate(t)
        elif t >= 0.9995:
            rate = f" · {t:.3g} TFLOP/s"
        elif t >= 0.9995e-3:
            rate = f" · {t * 1e3:.3g} GFLOP/s"
        elif t >= 0.9995e-6:
            rate = f" · {t * 1e6:.3g} MFLOP/s"
        else:
            rate = f" · {t * 1e9:.3g} kFLOP/s"
        rss, memory = get(_RSS), ""
        if _int(rss):
            if rss != self._rss[0]:
                self._rss = (rss, " · RSS " + binary_bytes(rss))
            memory = self._rss[1]
        text = f"{busy}{texts[2]}{rate}{texts[3]}{memory}"
        return text if len(text) <= MAX_SUMMARY else text[:MAX_SUMMARY]

    def _site_matters(self, site: Any) -> bool:
        found = self._sites.get(id(site))
        if found is None or found[0] is not site:
            if len(self._sites) >= _KEEP:
                self._sites.clear()
            # the entry holds the site's attributes: while it is kept, their id is no other's
            found = self._sites[id(site)] = (site, not _STATIC.isdisjoint(site))
        return found[1]


def _static_parts(attrs: dict[str, Any]) -> tuple[str, str]:
    """(FLOPs; implementation, backend, phase and tokens, shapes, not exact) of a call."""
    flops = attrs.get(_FLOPS)
    parts: list[str] = []
    for key in (_IMPL, _BACKEND):
        value = attrs.get(key)
        if isinstance(value, str) and value:
            parts.append(value)
    phase, tokens = attrs.get(_PHASE), attrs.get(_TOKENS)
    if _int(tokens):
        parts.append(f"{phase} {tokens} tok" if phase in _PHASES else f"{tokens} tok")
    elif phase in _PHASES:
        parts.append(str(phase))
    prompt, made = attrs.get(_IN), attrs.get(_OUT)
    if _int(prompt):
        parts.append(f"prompt {prompt} tok")
    if _int(made):
        parts.append(f"generated {made} tok")
    shape = shapes(attrs)
    if shape is not None:
        parts.append(shape)
    if attrs.get(_EXACT) is False:
        parts.append(f"not exact: {attrs.get(_REASON)}")
    return (" · " + si(flops, "FLOP") if _int(flops) else ""), "".join(" · " + p for p in parts)


def _marks(attrs: dict[str, Any]) -> str:
    """What sets the call apart: recomputed in a backward pass, repeated K/V, its profile, slow;
    its peak memory (each part with its leading " · "). The RSS, last, :meth:`Summaries.call`
    adds."""
    parts: list[str] = []
    if attrs.get(_RECOMPUTE) is True:
        parts.append("recomputed in backward")
    repeated = attrs.get(_REPEATED)
    if _int(repeated):
        parts.append(f"K/V repeated from {repeated} heads")
    if attrs.get(_TIER) == "profile":
        parts.append("profiled")
    elif attrs.get(_PROFILED_BY) == "enclosing":
        parts.append("timed inside an enclosing call's profile")
    elif attrs.get(_PROFILED_BY) == "nested":
        parts.append("a call in it profiled")
    if attrs.get(_SLOW) is True:
        parts.append("slow")
    peak = attrs.get(_PEAK)
    if _int(peak):
        parts.append("peak " + binary_bytes(peak))
    return "".join(" · " + p for p in parts)


def compact_shapes(text: str) -> str:
    """``kernel.input_shapes`` as ``[2,64] [384,256]`` (its own form; a nested list such as
    ``[[2, 64], [384, 256]]``, from an older parser or a test, is rewritten to it)."""
    if text.startswith("[[") and text.endswith("]]"):
        return text.replace(" ", "")[1:-1].replace("],[", "] [")
    return text


def op_summary(attrs: dict[str, Any], duration_ns: int) -> str:
    """``attnscope.summary`` of an operator span: its time, own time, folded ops, input shapes."""
    parts = [duration(duration_ns)]
    own = attrs.get(_SELF_NS)
    if _int(own) and own != duration_ns:
        parts.append("own " + duration(own))
    folded = attrs.get(_FOLDED)
    if _int(folded) and folded:
        parts.append(f"{folded} folded")
    shape = attrs.get(_SHAPES)
    if isinstance(shape, str) and shape:
        parts.append(compact_shapes(shape))
    return " · ".join(parts)[:MAX_SUMMARY]
