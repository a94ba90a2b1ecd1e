"""One trace per declared step, shared by every rank of a job, on the worker thread.

The ids are a pure function of the run id (_spans/run_id.py: the ``run_id`` setting, else
torchrun's ``TORCHELASTIC_RUN_ID`` and restart count, else one id agreed once through
torch.distributed's store) and the step number, so the ranks agree without talking at each step:
the trace id (128 bits) and the step root's span id (64 bits) hash ``(run id, step)``; a
rank's own span id hashes ``(run id, step, rank)``. Rank 0 emits the root (``attnscope.step N``),
every rank emits one ``attnscope.rank R`` span under it, and the rank's top-level sampled calls of
the step hang under that. Without a run id, the ids come from a random per-process id: one trace
per step of this process (ranks of a job without one do not join; a warning says so once).

The root and rank spans cover this process's sampled calls of the step: from the first one's start
to the last one's end (the worker never sees the step's own boundaries). Rank 0's root therefore
covers rank 0's calls; a straggler's rank span may end after it — Jaeger and the file exporters
draw it as it is. They are emitted when the worker sees a sampled call of another step (or none),
and when it stops (``shutdown()``, exit): a late call of a step already closed still goes under its
rank span, past its end.

Through the application's own provider (``SdkEmitter``) attnscope cannot choose span ids: the rank
span is a running span of that provider, its parent the step root's id, and no root is emitted
(Jaeger shows the rank spans side by side under a missing parent, in one trace).
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

from opentelemetry.trace import SpanContext

from .. import _dist
from .. import _schema as schema
from .._runtime import runtime
from .emit import OpenSpan
from .run_id import RunId

__all__ = ["RANK_NAME", "ROOT_NAME", "StepOut", "StepTraces", "configured_run_id", "rank_name",
           "root_name", "step_ids"]

ROOT_NAME = schema.PREFIX + "step"  # span names start so; the step's or rank's number follows
RANK_NAME = schema.PREFIX + "rank"


class StepOut(Protocol):
    """What step spans leave through: the span builder's (``_spans.spans.SpanBuilder``)."""

    def context_with(self, trace_id: int, span_id: int, name: str,
                     parent: SpanContext | None) -> SpanContext: ...

    def open_span(self, ctx: SpanContext, name: str, parent: SpanContext | None,
                  attrs: dict[str, Any], start_ns: int) -> OpenSpan | None: ...


def root_name(step_no: int) -> str:
    """The step root's name: ``attnscope.step 3`` (Jaeger's search list shows the step)."""
    return f"{ROOT_NAME} {step_no}"


def rank_name(rank: int) -> str:
    """A rank span's name: ``attnscope.rank 1`` (told apart in the timeline and statistics)."""
    return f"{RANK_NAME} {rank}"
_KEEP_CLOSED = 64  # closed steps whose rank span late calls can still find


def step_ids(run_id: str, step_no: int, rank: int) -> tuple[int, int, int]:
    """(trace id, step root span id, this rank's span id): the same in every process."""
    digest = hashlib.blake2b(f"attnscope-step\x00{run_id}\x00{step_no}".encode(),
                             digest_size=24).digest()
    rank_digest = hashlib.blake2b(f"attnscope-rank\x00{run_id}\x00{step_no}\x00{rank}".encode(),
                                  digest_size=8).digest()
    # An all-zero id is invalid in OpenTelemetry; 1 in 2**64 is not worth another hash.
    return (int.from_bytes(digest[:16], "big") or 1, int.from_bytes(digest[16:], "big") or 1,
            int.from_bytes(rank_digest, "big") or 1)


def configured_run_id() -> str | None:
    """The ``run_id`` setting in force, else torchrun's (read when a step starts); None when
    neither gives one (then :class:`RunId` asks the process group's store)."""
    cfg = runtime.config.current
    return _dist.run_id(cfg.run_id if cfg is not None else None)


_FLOPS, _BYTES, _SEQ_Q = schema.FLOPS.name, schema.BYTES.name, schema.SEQ_LEN_Q.name
_CALLS, _LFLOPS, _LBYTES = (schema.LAYERS_CALLS.name, schema.LAYERS_FLOPS.name,
                            schema.LAYERS_BYTES.name)
_NQ2, _NQ_NKV = schema.SUM_NQ2.name, schema.SUM_NQ_NKV.name


class _Sums:
    """A step's sampled attention calls and its forwards' step figures, summed; a figure some
    call or forward lacked is left out (``bytes_ok``, ``nq_ok``)."""

    __slots__ = ("calls", "flops", "bytes", "bytes_ok", "nq2", "nq_nkv", "nq_ok", "forwards")

    def __init__(self) -> None:
        self.calls = self.flops = self.bytes = self.nq2 = self.nq_nkv = self.forwards = 0
        self.bytes_ok = self.nq_ok = True

    def add(self, attrs: dict[str, Any]) -> None:
        """One top-level call of the step: an attention call, or a model forward with its own."""
        if type(attrs.get(_FLOPS)) is int:
            self.calls += 1
            self.flops += attrs[_FLOPS]
            moved = attrs.get(_BYTES)
            self.bytes_ok = self.bytes_ok and type(moved) is int
            self.bytes += moved if type(moved) is int else 0
            return
        if _SEQ_Q not in attrs:
            return
        self.forwards += 1
        if type(attrs.get(_CALLS)) is int:
            self.calls += attrs[_CALLS]
            self.flops += attrs[_LFLOPS]
            moved = attrs.get(_LBYTES)
            self.bytes_ok = self.bytes_ok and type(moved) is int
            self.bytes += moved if type(moved) is int else 0
        nq2, nq_nkv = attrs.get(_NQ2), attrs.get(_NQ_NKV)
        if type(nq2) is int and type(nq_nkv) is int:
            self.nq2 += nq2
            self.nq_nkv += nq_nkv
        else:
            self.nq_ok = False

    def attributes(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.calls:
            out[_CALLS], out[_LFLOPS] = self.calls, self.flops
            if self.bytes_ok:
                out[_LBYTES] = self.bytes
        if self.forwards and self.nq_ok:
            out[_NQ2], out[_NQ_NKV] = self.nq2, self.nq_nkv
        return out


class _Step:
    __slots__ = ("end_ns", "parent", "rank_span", "root", "start_ns", "step_no", "sums")

    def __init__(self, step_no: int, root: OpenSpan | None, rank_span: OpenSpan | None,
                 parent: SpanContext, start_ns: int, end_ns: int) -> None:
        self.step_no = step_no
        self.root = root
        self.rank_span = rank_span
        self.parent = parent  # what the step's top-level calls hang under
        self.start_ns = start_ns
        self.end_ns = end_ns
        self.sums = _Sums()


class StepTraces:
    """The open step's spans; :meth:`parent_for` is asked once per top-level call of a step."""

    def __init__(self, out: StepOut, run_id: Callable[[], str | None]) -> None:
        self.out = out  # the span builder: step spans leave as call spans do
        self._run_id = RunId(run_id)  # ``run_id``, else agreed by the ranks, else this process's
        self._open: _Step | None = None
        self._closed: OrderedDict[int, SpanContext] = OrderedDict()

    def parent_for(self, step_no: int | None, start_ns: int, end_ns: int,
                   attrs: dict[str, Any] | None = None) -> SpanContext | None:
        """The span a top-level call of ``step_no`` goes under (None: no step, its own trace).
        A call of another step (or none) closes the open one first. ``attrs``: the call's, summed
        into the open step's rank span (a late call of a closed step is not)."""
        step = self._open
        if step is not None and step.step_no != step_no:
            self.close()
            step = None
        if step_no is None:
            return None
        if step is None:
            closed = self._closed.get(step_no)
            if closed is not None:  # a late call of a closed step: under its rank span
                return closed
            step = self._open = self._start(step_no, start_ns, end_ns)
        step.start_ns = min(step.start_ns, start_ns)
        step.end_ns = max(step.end_ns, end_ns)
        if attrs is not None:
            step.sums.add(attrs)
        return step.parent

    def close(self) -> None:
        """Emit the open step's rank span (and, on rank 0, its root)."""
        step, self._open = self._open, None
        if step is None:
            return
        self._closed[step.step_no] = step.parent
        if len(self._closed) > _KEEP_CLOSED:
            self._closed.popitem(last=False)
        if step.rank_span is not None:  # children first, as a span processor expects
            step.rank_span.close(step.start_ns, step.end_ns, step.sums.attributes())
        if step.root is not None:
            step.root.close(step.start_ns, step.end_ns)

    def _start(self, step_no: int, start_ns: int, end_ns: int) -> _Step:
        run_id = self._run_id()
        world = _dist.world_size()
        rank = _dist.rank()
        trace_id, root_id, rank_id = step_ids(run_id, step_no, rank)
        out = self.out
        root_ctx = out.context_with(trace_id, root_id, root_name(step_no), None)
        root = None
        if rank == 0:
            root = out.open_span(root_ctx, root_name(step_no), None, {
                schema.STEP.name: step_no, schema.WORLD_SIZE.name: world,
                schema.RUN_ID.name: run_id[:256]},
                start_ns)
        rank_attrs = {schema.STEP.name: step_no, schema.RANK.name: rank,
                      schema.WORLD_SIZE.name: world,
                      schema.HOST_NAME.name: _dist.host()[:256]}
        rank_ctx = out.context_with(trace_id, rank_id, rank_name(rank), root_ctx)
        rank_span = out.open_span(rank_ctx, rank_name(rank), root_ctx, rank_attrs, start_ns)
        parent = rank_span.context if rank_span is not None else root_ctx
        return _Step(step_no, root, rank_span, parent, start_ns, end_ns)
