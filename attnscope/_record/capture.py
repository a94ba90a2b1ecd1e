"""The plain records the calling thread fills for one sampled call: the interface of the two sides.

A :class:`Capture` is written on the calling thread only, then handed to the worker, which reads
it and never writes to it (what it derives goes into its own result object). Its facts are typed
(:mod:`.facts`: no magic keys in the argument summary). It holds no OpenTelemetry SDK objects,
but it does hold live references: the application span's ``SpanContext`` (an immutable API
value), a mask tensor or 0-d cache-length tensor kept for the worker to count (never their
values on this thread), the module instance, the calling side's call site, device timer and
grant (typed by :mod:`.handles`: what the worker may use of them) and a profiler session. The
worker drops the Capture once it has built the span.
"""

from __future__ import annotations

import enum
import itertools
import traceback
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry.trace import SpanContext

from .facts import (
    NO_FACTS,
    AttentionFacts,
    Facts,
    HostCopy,
    HostKind,
    LayerTraits,
    ModelFacts,
    SdpaCall,
    SdpaContext,
)
from .graphs import GraphRecord
from .handles import DeviceTimerHandle, GrantHandle, SiteHandle

if TYPE_CHECKING:  # batches imports the OpenTelemetry API, which a record never needs to load
    from .batches import BatchRecord

__all__ = [
    "Capture", "NO_SITE", "TensorMeta", "AttentionFacts", "ModelFacts", "DeviceMemory",
    "ProfileSession", "next_id", "PROFILE_MARKER", "TIER_NONE", "TIER_TIMING", "TIER_PROFILE",
    "TIER_NAMES", "Facts", "NO_FACTS", "LayerTraits", "SdpaCall", "SdpaContext", "HostKind",
    "MASK_NAMES", "MAX_NAME", "MAX_EXTRA", "MAX_ERROR_TEXT", "MAX_VALUE", "MAX_ITEMS",
    "ErrorInfo", "error_info", "HostCopy", "find_qkv", "attribute_value", "expand_summary",
]

TIER_NONE = 0
TIER_TIMING = 1
TIER_PROFILE = 2
TIER_NAMES = {TIER_TIMING: "timing", TIER_PROFILE: "profile"}
# The record_function name around a profiled call; the worker aligns clocks on it.
PROFILE_MARKER = "attnscope"
# Argument names whose tensor is kept by reference (the worker counts real tokens in it).
MASK_NAMES = frozenset({"attention_mask", "attn_mask", "mask", "key_padding_mask", "padding_mask"})
# Bounds of what a capture keeps of user-given text (docs/attributes.md, "Bounds").
MAX_NAME = 128  # span names, attribute names
MAX_EXTRA = 64  # attributes given to one span() block
MAX_VALUE = 256  # an attribute's string value
MAX_ITEMS = 64  # an attribute's list value
MAX_ERROR_TEXT = 4096  # an exception's message, and its stack trace (the innermost part)
_MAX_FRAMES = 64

# itertools.count is atomic under the GIL: ids are unique across threads without a lock.
next_id = itertools.count(1).__next__


class TensorMeta(NamedTuple):
    """What the calling thread keeps of a tensor argument: never its values."""

    shape: tuple[int, ...]
    dtype: Any
    device: Any

    @classmethod
    def of(cls, tensor: Any) -> TensorMeta:
        """A tensor's metadata; a nested tensor's shape is ``()`` (strided nested tensors have
        none, jagged ones a symbolic one)."""
        shape = () if tensor.is_nested else tuple(tensor.shape)
        return cls(shape, tensor.dtype, tensor.device)


_meta_new = tuple.__new__  # TensorMeta(...) without NamedTuple's __new__ wrapper (the worker's
# cost per argument of a traced call)


def expand_summary(flat: Sequence[Any]) -> list[tuple[str, Any]]:
    """The ``(name, value)`` pairs of a flat summary (``capture.args.summarize_flat``): four
    entries per argument, ``name, shape, dtype, device`` for a tensor's metadata and ``name,
    value, None, None`` for a value kept as it is (a scalar, None, a mask)."""
    out: list[tuple[str, Any]] = []
    for i in range(0, len(flat) - 3, 4):  # indexing: a third faster than zip's unpacking here
        dtype = flat[i + 2]
        out.append((flat[i], flat[i + 1] if dtype is None
                    else _meta_new(TensorMeta, (flat[i + 1], dtype, flat[i + 3]))))
    return out


_Q_NAMES = ("query", "q", "query_states")
_K_NAMES = ("key", "k", "key_states")
_V_NAMES = ("value", "v", "value_states")


def find_qkv(summary: list[tuple[str, Any]]) -> tuple[TensorMeta, TensorMeta, TensorMeta] | None:
    """The query, key and value of a traced function's argument summary, when they form an
    attention call: ``(B, Hq, Sq, D)``, ``(B, Hkv, Skv, D)``, ``(B, Hkv, Skv, Dv)``, ``Hq`` a
    multiple of ``Hkv``. By name (``query``/``q``/``query_states``, ...), else the first three 4-D
    tensors that are not masks. Both sides read a summary this way: the calling thread to reduce a
    CUDA mask for the call's shape, the worker to derive the call's attributes."""
    named = dict(summary)
    found: list[Any] = [next((named[n] for n in names if n in named), None)
                        for names in (_Q_NAMES, _K_NAMES, _V_NAMES)]
    if found[0] is None:
        four = [v for k, v in summary if isinstance(v, TensorMeta) and len(v.shape) == 4
                and k not in MASK_NAMES]
        if len(four) >= 3:
            found = four[:3]
    q, k, v = found
    if not (isinstance(q, TensorMeta) and isinstance(k, TensorMeta) and isinstance(v, TensorMeta)):
        return None
    if len(q.shape) != 4 or len(k.shape) != 4 or len(v.shape) != 4:
        return None
    b, hq, _, d = q.shape
    kb, hkv, skv, kd = k.shape
    vb, vh, vs, _ = v.shape
    if kb != b or vb != b or kd != d or vh != hkv or vs != skv or hkv <= 0 or hq % hkv:
        return None
    return q, k, v


class _NoSite:
    """The call site of a Capture not opened yet (every capture handed over has its own)."""

    key = ""
    name = ""

    @property
    def attributes(self) -> dict[str, Any]:
        return {}


NO_SITE: SiteHandle = _NoSite()


class Capture:
    """One sampled call, as the calling thread recorded it."""

    __slots__ = (
        "capture_id",
        "parent_id",
        "site",
        "name",
        "tier",
        "sample_rate",
        "otel_parent",
        "start_epoch_ns",
        "start_perf_ns",
        "end_perf_ns",
        "summary",
        "flat_summary",
        "facts",
        "sdpa",
        "instance",
        "extra",
        "error",
        "timer",
        "profile",
        "memory",
        "kept_bytes",
        "step_no",
        "grant",
        "batch",
        "counted",
        "graph",
        "replay",
        "in_profile",
        "autocast",
        "recompute",
    )

    def __init__(self) -> None:
        self.capture_id: int = 0
        self.parent_id: int | None = None
        self.site: SiteHandle = NO_SITE
        self.name: str = ""
        self.tier: int = TIER_TIMING
        self.sample_rate: float = 1.0
        self.otel_parent: SpanContext | None = None  # of the app's current span, if valid
        self.start_epoch_ns: int = 0
        self.start_perf_ns: int = 0
        self.end_perf_ns: int = 0
        # the user's arguments: shapes, dtypes, devices and scalars (a mask by reference)
        self.summary: list[tuple[str, Any]] = []
        # ... or, from a traced call of shapes and scalars, flat until the worker expands it
        # (:meth:`expand`): the calling thread makes no pair or TensorMeta per argument
        self.flat_summary: tuple[Any, ...] | list[Any] = ()
        # what an instrument() extractor found (an attention layer's, a model's): typed facts
        self.facts: Facts = NO_FACTS
        # a profiled call's SDPA call, for its fallback verdict (capture.inner_sdpa)
        self.sdpa: SdpaCall | None = None
        self.instance: Any = None  # the module for method/forward calls (to read its config)
        self.extra: dict[str, Any] | None = None  # attributes given by span(..., tokens=...)
        self.error: ErrorInfo | None = None
        self.timer: DeviceTimerHandle | None = None  # resolved later by the worker
        self.profile: ProfileSession | None = None
        self.memory: DeviceMemory | None = None
        self.kept_bytes = 0  # of tensors this capture keeps by reference (see capture.retain)
        self.step_no: int | None = None  # attnscope.step() in force when the call was sampled
        self.grant: GrantHandle | None = None  # why this call got the profile tier
        # the attnscope.batch() block in force: its rows are checked against the call's batch by
        # the worker, which reads the shapes
        self.batch: BatchRecord | None = None
        # a worker counted it (queued or dropped): set under the submit lock, read by a leave()
        # that a Ctrl-C cut short, so that it hands the capture over once and only once
        self.counted = False
        # a call captured into that CUDA graph (a template its replays' spans are built from),
        # never handed to the worker by itself
        self.graph: GraphRecord | None = None
        # (GraphRecord, generation): a sampled replay of that graph, the replay's number
        self.replay: tuple[GraphRecord, int] | None = None
        # timed while attnscope profiled an enclosing call on this thread: the profiler slowed it
        self.in_profile = False
        # the dtype torch.autocast was on with for the call's device ("bfloat16"), else None
        self.autocast: str | None = None
        # run inside a backward pass (activation checkpointing's recomputed forward)
        self.recompute = False

    def expand(self) -> None:
        """``summary`` made from ``flat_summary`` when the call left one (the worker does, first
        thing for each capture)."""
        if self.flat_summary:
            self.summary = expand_summary(self.flat_summary)
            self.flat_summary = ()

    @property
    def wall_ns(self) -> int:
        return self.end_perf_ns - self.start_perf_ns

    @property
    def end_epoch_ns(self) -> int:
        return self.start_epoch_ns + self.wall_ns


class ErrorInfo:
    """The exception a call raised, as text: never the exception, its traceback or frames (they
    hold the call's tensors alive)."""

    __slots__ = ("type_name", "message", "frames")

    def __init__(self, type_name: str, message: str, frames: traceback.StackSummary) -> None:
        self.type_name = type_name
        self.message = message
        self.frames = frames

    def stacktrace(self) -> str:
        """The traceback as Python prints it (without chained exceptions), at most
        ``MAX_ERROR_TEXT`` characters: its end, where the error is. Reads source lines: for the
        worker."""
        # the message's start only: it is exported whole (capped) as exception.message
        text = "".join(["Traceback (most recent call last):\n", *self.frames.format(),
                        f"{self.type_name}: {self.message[:256]}\n"])
        return text if len(text) <= MAX_ERROR_TEXT else "..." + text[-(MAX_ERROR_TEXT - 3):]


def error_info(exc: BaseException) -> ErrorInfo | None:
    """What a span keeps of ``exc``; None when it is not an error (``sys.exit(0)``, ``exit()``)."""
    if isinstance(exc, SystemExit) and exc.code in (None, 0):
        return None
    cls = type(exc)
    module = cls.__module__
    type_name = (f"{module}.{cls.__qualname__}" if module and module != "builtins"
                 else cls.__qualname__)
    try:
        message = str(exc)[:MAX_ERROR_TEXT]
    except Exception:
        message = "<unprintable>"
    # the innermost frames; no source read here (lookup_lines=False) and no frame kept
    walked = list(traceback.walk_tb(exc.__traceback__))[-_MAX_FRAMES:]
    return ErrorInfo(type_name, message, traceback.StackSummary.extract(iter(walked),
                                                                        lookup_lines=False))


class ProfileSession:
    """One profiler session around one call; ``result`` is torch's profile once stopped.

    Its steps are flags and lists filled from C, so that a clean-up interrupted by a Ctrl-C and
    run again (``_interrupt_safe.settle``) does each once: ``prepared`` / ``stopped`` hold what
    kineto's prepare / disable returned, ``enabling`` is set just before enable is called.
    """

    __slots__ = ("prepared", "stopped", "marker", "device", "on_cuda", "aborted", "enabling",
                 "synced", "counted", "released", "capture")

    def __init__(self, device: Any, on_cuda: bool, capture: Capture | None = None) -> None:
        self.prepared: list[Any] = []
        self.stopped: list[Any] = []
        self.marker: Any = None
        self.device = device
        self.on_cuda = on_cuda
        self.aborted = False
        self.enabling = False
        self.synced = False
        self.counted = False  # in stats()'s "profiled"
        self.released = False  # the session lock let go (once, by whichever run gets there)
        self.capture = capture  # whose call it profiles: an orphaned session is one whose ended

    @property
    def result(self) -> Any:
        """torch's profile, None until stopped (or when stopping failed)."""
        return self.stopped[0] if self.stopped else None


class DeviceMemory:
    """Allocator readings taken on the calling thread around one call."""

    __slots__ = ("device", "allocated_before", "peak_before", "allocated_after", "peak_after",
                 "reset")

    def __init__(self, device: Any, allocated_before: int, peak_before: int, reset: bool) -> None:
        self.device = device
        self.allocated_before = allocated_before
        self.peak_before = peak_before
        self.allocated_after: int | None = None  # None: no reading after the call
        self.peak_after: int | None = None
        self.reset = reset

    @property
    def delta_bytes(self) -> int | None:
        if self.allocated_after is None:
            return None
        return self.allocated_after - self.allocated_before

    @property
    def peak_bytes(self) -> int | None:
        """Peak allocated during the call above what was allocated before it.

        Exact when the peak statistics were reset before the call or when the call set a new
        process-wide peak; otherwise the call's own peak is hidden under an older one: None.
        """
        if self.peak_after is None:
            return None
        if self.reset or self.peak_after > self.peak_before:
            return max(0, self.peak_after - self.allocated_before)
        return None


# ---- user-given attribute values -----------------------------------------------------------------

_PLAIN = (str, bool, int, float)
_MAX_INSIDE = 16  # items of a container described inside another value
_MAX_DEPTH = 2  # containers inside containers described; deeper: their type name
# types whose own str() is a library's, never the application's: read as text
_TEXT_TYPES = frozenset({("torch", "dtype"), ("torch", "device"), ("pathlib", "PosixPath"),
                         ("pathlib", "WindowsPath"), ("pathlib", "PurePosixPath"),
                         ("pathlib", "PureWindowsPath")})
_ARRAY_MODULES = frozenset({"torch", "numpy"})


def attribute_value(value: Any) -> Any:
    """A user-given attribute value as a span carries it, never its contents' values and never
    its own ``__str__``/``__repr__`` (which may read a CUDA tensor, or raise):

    - ``str``, ``bool``, ``int``, ``float``: the value (a string cut to ``MAX_VALUE``), ``None``
      as it is (no attribute);
    - a ``list``/``tuple`` of those: a list of one type (at most ``MAX_ITEMS``; mixed types as
      texts); other items as described below;
    - a tensor or array (its type has a ``shape`` and a ``dtype``): ``Tensor(shape=(1, 3),
      dtype=int64)``, ``Tensor(shape=(1, 3), dtype=int64, device=cuda:0)`` off the CPU;
    - a mapping (a ``dict``, transformers' ``BatchEncoding``): its keys and their described
      values, ``{input_ids: Tensor(...), attention_mask: Tensor(...)}``, at most ``MAX_VALUE``
      characters; a sequence inside it as its type and length, ``list[12]``;
    - anything else: its type name, ``<Config>`` (an enum member: ``Color.RED``).

    Cheap (no value is read, at most ``_MAX_INSIDE`` items of a container are looked at) and
    safe on either thread. Raises only what the value's own code raised while read (a ``shape``
    property, a mapping's ``items()``): the caller leaves that attribute out.
    """
    kind = type(value)
    if kind in _PLAIN or value is None:
        return value[:MAX_VALUE] if kind is str else value
    if isinstance(value, (list, tuple)):
        items = [_scalar(v) for v in itertools.islice(_base_iter(value), MAX_ITEMS)]
        described = [v if type(v) in _PLAIN else _described(v, 1) for v in items]
        if all(type(v) is str for v in described):
            return [v[:MAX_VALUE] for v in described]
        if all(type(v) is bool for v in described) or all(
                type(v) is int or type(v) is float for v in described):
            return described
        return [v[:MAX_VALUE] if type(v) is str else str(v) for v in described]  # plain: builtin
    scalar = _scalar(value)
    if scalar is not value:
        return scalar
    return _described(value, 0)[:MAX_VALUE]


def _scalar(value: Any) -> Any:
    """A subclass of ``str``/``int``/``float`` (an ``IntEnum``, a ``StrEnum``) as the plain value,
    without its own methods; anything else as it is."""
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int) and not isinstance(value, enum.Enum):
        return int.__index__(value)
    if isinstance(value, float) and not isinstance(value, enum.Enum):
        return float.__float__(value)
    if isinstance(value, str) and not isinstance(value, enum.Enum):
        return str.__str__(value)[:MAX_VALUE]
    return value


def _base_iter(value: list[Any] | tuple[Any, ...]) -> Any:
    """The items of a list or tuple without a subclass's own ``__iter__``."""
    return list.__iter__(value) if isinstance(value, list) else tuple.__iter__(value)


def _described(value: Any, depth: int) -> str:
    """``value`` as text, without its values (see :func:`attribute_value`)."""
    kind = type(value)
    if kind in _PLAIN or value is None:
        return repr(value)[:MAX_NAME] if kind is str else str(value)
    module = getattr(kind, "__module__", "") or ""
    name = getattr(kind, "__qualname__", "") or "object"
    if (module.partition(".")[0], kind.__name__) in _TEXT_TYPES:
        return str(value)[:MAX_NAME]
    if isinstance(value, enum.Enum):
        return f"{name}.{value._name_}"[:MAX_NAME]
    if getattr(kind, "shape", None) is not None and getattr(kind, "dtype", None) is not None:
        return _array(value, kind)
    if isinstance(value, (list, tuple)):
        return f"{kind.__name__}[{len(value)}]"
    if isinstance(value, Mapping):
        if depth >= _MAX_DEPTH:
            return f"<{name}>"
        return _mapping(value, depth)
    return f"<{name}>"


def _array(value: Any, kind: type) -> str:
    """``Tensor(shape=(1, 3), dtype=int64, device=cuda:0)``: metadata only, no value read (no
    device synchronisation)."""
    try:
        shape: Any = tuple(value.shape)
        if not all(type(n) is int for n in shape):
            shape = None
    except Exception:
        if not any(c.__module__.partition(".")[0] in _ARRAY_MODULES for c in kind.__mro__):
            raise  # the application's own shape property: that value is left out
        shape = None  # a nested (strided) tensor: no single shape
    parts = [] if shape is None else [f"shape={shape}"]
    dtype = value.dtype
    if type(dtype).__module__.partition(".")[0] in _ARRAY_MODULES or type(dtype) is str:
        parts.append("dtype=" + str(dtype).removeprefix("torch."))
    if getattr(kind, "device", None) is not None:
        device = value.device
        if type(device).__module__.partition(".")[0] == "torch" or type(device) is str:
            text = str(device)
            if text != "cpu":  # as torch's own repr: the device is named when it is not the CPU
                parts.append(f"device={text}")
    return f"{kind.__name__}({', '.join(parts)})"


def _mapping(value: Mapping[Any, Any], depth: int) -> str:
    """``{key: described value, ...}``: at most ``_MAX_INSIDE`` items and ``MAX_VALUE``
    characters; a key that is not a plain value as its type name."""
    items = dict.items(value) if type(value) is dict else value.items()
    parts: list[str] = []
    size = 2
    for key, item in itertools.islice(items, _MAX_INSIDE + 1):
        if len(parts) == _MAX_INSIDE or size > MAX_VALUE:
            parts.append("...")
            break
        key_text = (str.__str__(key) if isinstance(key, str) else
                    str(_scalar(key)) if isinstance(key, (bool, int, float)) or key is None
                    else f"<{type(key).__qualname__}>")
        part = f"{key_text[:MAX_NAME]}: {_described(_scalar(item), depth + 1)}"
        parts.append(part)
        size += len(part) + 2
    return "{" + ", ".join(parts) + "}"

