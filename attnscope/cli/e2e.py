"""End-to-end context for a report: what ``generate()`` and model forwards took, and attention's
share of the model's time.

- **generate**: per ``generate()`` call site (span name), the calls' wall time, output tokens/s
  (their output tokens ÷ their wall time, summed), time to first token (TTFT: the end of the
  call's prefill forward − the call's start) and time per output token (TPOT: the rest of the
  call ÷ its decode forwards). TTFT needs the call's prefill forward traced (``instrument(...,
  trace_model=True)``, as ``attnscope run`` does); TPOT needs every forward of the call traced
  (forwards at sample rate 1): else they are unknown for that call, never estimated.
- **blocks**: per name, the application's own traced spans (``attnscope.span`` blocks, functions
  under ``@attnscope.trace`` that are not attention calls): their wall time, tokens/s and
  attention's share of their time, estimated as for forwards (below); and how many attention
  calls ran while a block of their process was open but in no block (``outside_blocks``):
  a block holds what its own thread (or task) calls, and work handed to another thread
  (``generate()`` with a ``TextIteratorStreamer``, a thread pool, ``loop.run_in_executor``)
  lands outside it.
- **attention share**, per model and phase: the time of attention calls nested in the model's
  traced forwards ÷ those forwards' time; a forward weighs 1/its sample rate, a nested call
  1/(its rate × its forward's), so below rate 1 the share is a ratio of two estimated totals.

Times are wall times (``attnscope.wall_ns``): device time is measured for attention calls only.
A call or forward that holds a profiled call was slowed by the profiler: it is left out of the
times and shares whenever others are left (``*_used`` says how many were used), as the report's
latency percentiles leave profiled calls out.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from .. import _schema as schema
from .summary import Quantiles, int_attribute, is_profiled, quantiles, wall_ns, weight
from .traces import SpanRow, attention_calls, descendants, model_label, process_of

__all__ = ["GenerateStats", "ShareStats", "BlockStats", "EndToEnd", "end_to_end",
           "MIN_FOR_INTERVAL", "OUTSIDE_BLOCKS", "UNKNOWN"]

# what the report says of EndToEnd.outside_blocks (terminal and HTML), when there are any
OUTSIDE_BLOCKS = (
    "{} attention calls ran while one of your blocks was open, but in none: a block holds what "
    "its own thread (or task) calls. For work handed to another thread (generate() with a "
    "TextIteratorStreamer, a thread pool, asyncio's loop.run_in_executor), start it with the "
    "block's context: threading.Thread("
    "target=contextvars.copy_context().run, args=(model.generate,), kwargs=...) "
    "(docs/instrument.md, \"Work on another thread\").")

_FORWARD = ".forward"
_GENERATE = ".generate"


@dataclass(frozen=True, slots=True)
class GenerateStats:
    name: str
    calls: int
    used: int  # calls the times are of (those without a profiled call, when there are any)
    wall: Quantiles
    output_tokens: int | None  # summed over the calls that counted them
    tokens_per_s: float | None
    ttft: Quantiles | None
    ttft_calls: int  # calls whose TTFT is known
    tpot: Quantiles | None
    tpot_calls: int
    # why TTFT or TPOT is unknown, per call whose TPOT is (UNKNOWN's keys): (reason, calls)
    unknown: tuple[tuple[str, int], ...] = ()

    def partial_line(self) -> str | None:
        """Why TTFT or TPOT is unknown for some of the timed calls; None when known for all."""
        if self.ttft_calls >= self.used and self.tpot_calls >= self.used:
            return None
        why = "; ".join(f"{n} {UNKNOWN[reason]}" for reason, n in self.unknown)
        return (f"{self.name}: TTFT of {self.ttft_calls}, TPOT of {self.tpot_calls} of its "
                f"{self.used} timed calls ({why})")


# Why a generate() call's TTFT or TPOT is unknown, in the order the report lists them
UNKNOWN = {
    "not_all_traced": "with forwards not all traced",
    "several_tokens_a_step": "decoding several tokens in a step, as assisted or speculative "
                             "decoding does: a step is not a token, so no TPOT",
    "began_on_a_filled_cache": "beginning with a one-token step on a cache carried over: no "
                               "prefill of their own",
    "one_step": "of one step only: no TPOT",
    "no_phase": "whose first forward says no phase (a cache attnscope cannot read): no prefill "
                "to end TTFT",
}


@dataclass(frozen=True, slots=True)
class ShareStats:
    model: str
    phase: str | None
    forwards: int
    used: int  # forwards the share is of
    calls: int  # attention calls sampled inside them
    model_ns: float  # weighted by 1/sample rate
    attention_ns: float
    share: float | None  # None with no attention call to estimate it from
    # 95% bootstrap interval of ``share`` over the forwards; None when exact (rate 1), unknown
    # or from fewer than MIN_FOR_INTERVAL forwards
    share_interval: tuple[float, float] | None = None
    sampled: bool = False  # the share is an estimate from sampled calls (not exact)


@dataclass(frozen=True, slots=True)
class BlockStats:
    """The application's own traced spans of one name: ``attnscope.span`` blocks and
    ``@attnscope.trace``'d functions that are not attention calls, forwards or ``generate()``."""

    name: str
    calls: int
    used: int  # calls the times are of (those without a profiled call, when there are any)
    wall: Quantiles
    tokens_per_s: float | None  # Σ attnscope.tokens ÷ Σ wall time of the used calls that have it
    attention_calls: int  # attention calls sampled inside the used calls
    block_ns: float  # weighted by 1/sample rate, as ShareStats
    attention_ns: float
    share: float | None
    share_interval: tuple[float, float] | None = None  # as ShareStats's, over the blocks
    sampled: bool = False  # as ShareStats's


@dataclass(frozen=True, slots=True)
class EndToEnd:
    generates: list[GenerateStats]
    shares: list[ShareStats]
    blocks: list[BlockStats] = field(default_factory=list)
    # attention calls that started while a block of their process was open, in no block
    outside_blocks: int = 0


def _function(row: SpanRow) -> str:
    value = row.attributes.get(schema.CODE_FUNCTION_NAME.name)
    return value if isinstance(value, str) else ""


def _is_generate(row: SpanRow) -> bool:
    return schema.TIER.name in row.attributes and _function(row).endswith(_GENERATE)


def _is_forward(row: SpanRow, attention: set[str]) -> bool:
    return (schema.TIER.name in row.attributes and row.span_id not in attention
            and schema.KERNEL_KIND.name not in row.attributes
            and _function(row).endswith(_FORWARD) and schema.NUM_HEADS.name not in row.attributes)


def end_to_end(rows: Sequence[SpanRow]) -> EndToEnd:
    """The generate and attention-share figures of a trace (empty lists when it has none)."""
    attention = {r.span_id for r in attention_calls(rows)}
    children: dict[str, list[SpanRow]] = defaultdict(list)
    for r in rows:
        if r.parent_id:
            children[r.parent_id].append(r)
    forwards = [r for r in rows if _is_forward(r, attention)]
    forward_ids = {r.span_id for r in forwards}
    # the outermost forwards only: a model inside a traced model is part of its time
    by_id = {r.span_id: r for r in rows}
    # the outermost model forwards: a decoder layer (it has a layer index) whose model forward
    # was not sampled is part of a model's time, not a model
    outer = [r for r in forwards if not _has_ancestor(r, by_id, forward_ids)
             and schema.LAYER_INDEX.name not in r.attributes]
    blocks = [r for r in rows if _is_block(r, attention)]
    return EndToEnd(_generates(rows, children, forward_ids),
                    _shares(outer, children, attention), _blocks(blocks, children, attention),
                    _outside_blocks(rows, blocks, children, attention))


def _outside_blocks(rows: Sequence[SpanRow], blocks: Sequence[SpanRow],
                    children: Mapping[str, list[SpanRow]], attention: set[str]) -> int:
    """Attention calls in no block that started while a block of the same process was open."""
    if not blocks:
        return 0
    held = {d.span_id for b in blocks for d in descendants(b, children)}
    # per process, the blocks' times merged
    open_: dict[tuple[Any, ...], list[tuple[int, int]]] = defaultdict(list)
    for b in sorted(blocks, key=lambda b: b.start_ns):
        spans = open_[process_of(b)]
        if spans and b.start_ns <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], b.end_ns))
        else:
            spans.append((b.start_ns, b.end_ns))
    starts = {k: [s for s, _ in v] for k, v in open_.items()}
    count = 0
    for r in rows:
        if r.span_id not in attention or r.span_id in held:
            continue
        key = process_of(r)
        if key not in open_:
            continue
        i = bisect.bisect_right(starts[key], r.start_ns) - 1
        if i >= 0 and r.start_ns <= open_[key][i][1]:
            count += 1
    return count


def _is_block(row: SpanRow, attention: set[str]) -> bool:
    """One of the application's own traced spans (see :class:`BlockStats`)."""
    a = row.attributes
    return (schema.TIER.name in a and row.span_id not in attention
            and schema.KERNEL_KIND.name not in a and schema.NUM_HEADS.name not in a
            and schema.GRAPH_REPLAY.name not in a and not row.name.startswith(schema.PREFIX)
            and not _function(row).endswith((_FORWARD, _GENERATE)))


def _blocks(blocks: Sequence[SpanRow], children: Mapping[str, list[SpanRow]],
            attention: set[str]) -> list[BlockStats]:
    by_name: dict[str, list[SpanRow]] = defaultdict(list)
    for r in blocks:
        by_name[r.name].append(r)
    out = []
    for name, every in sorted(by_name.items()):
        kept = _unslowed(every, children)
        with_tokens = [(t, wall_ns(b)) for b in kept
                       if (t := int_attribute(b, schema.TOKENS.name)) is not None]
        tokens_ns = sum(ns for _, ns in with_tokens)
        got = _attention_in(kept, children, attention)
        out.append(BlockStats(
            name=name, calls=len(every), used=len(kept),
            wall=quantiles([wall_ns(b) for b in kept]),
            tokens_per_s=sum(t for t, _ in with_tokens) / (tokens_ns / 1e9)
            if with_tokens and tokens_ns > 0 else None,
            attention_calls=got.calls, block_ns=got.own_ns, attention_ns=got.attention_ns,
            share=got.attention_ns / got.own_ns if got.own_ns > 0 and got.calls else None,
            share_interval=got.interval, sampled=got.sampled))
    return out


class _Inside(NamedTuple):
    own_ns: float  # Σ wall time of the spans, weighted
    attention_ns: float  # Σ that of the attention calls inside them, weighted
    calls: int
    interval: tuple[float, float] | None  # _share_interval, when there is one
    sampled: bool  # some weight is above 1: the share is an estimate


def _attention_in(spans: Sequence[SpanRow], children: Mapping[str, list[SpanRow]],
                  attention: set[str]) -> _Inside:
    """Σ wall time of ``spans`` and Σ that of the attention calls sampled inside them, each
    weighted by 1/its sample rate (a call inside: 1/(its rate × its span's), as it was sampled
    on its own once its span was), how many such calls, and the share's interval
    (:func:`_share_interval`, from :data:`MIN_FOR_INTERVAL` spans up)."""
    spans = [s for s in spans if weight(s) > 0]  # an extra span stands for no other
    own = [wall_ns(s) * weight(s) for s in spans]
    inside = [0.0] * len(spans)
    calls, sampled = 0, any(weight(s) > 1 for s in spans)
    for k, s in enumerate(spans):
        for d in descendants(s, children):
            if d.span_id in attention and weight(d) > 0:
                inside[k] += wall_ns(d) * weight(d) * weight(s)
                calls += 1
                sampled = sampled or weight(d) > 1
    interval = _share_interval(own, inside) \
        if sampled and calls and len(spans) >= MIN_FOR_INTERVAL else None
    return _Inside(sum(own), sum(inside), calls, interval, sampled)


def _share_interval(own: Sequence[float], inside: Sequence[float]) -> tuple[float, float]:
    """95% percentile-bootstrap interval of Σ inside ÷ Σ own, the spans resampled with their
    calls (1,000 rounds, a fixed seed: the same trace gives the same interval). Only for a share
    of sampled calls: at rate 1 it is exact."""
    import numpy as np

    a, b = np.asarray(own, dtype=np.float64), np.asarray(inside, dtype=np.float64)
    picks = np.random.default_rng(0).integers(0, len(a), size=(_BOOT, len(a)))
    totals = a[picks].sum(axis=1)
    ratios = b[picks].sum(axis=1)[totals > 0] / totals[totals > 0]
    lo, hi = np.percentile(ratios, [2.5, 97.5]) if len(ratios) else (np.nan, np.nan)
    return float(lo), float(hi)


_BOOT = 1000
# Fewer spans than this give a share of sampled calls no interval (a bootstrap of 1-9 spans says
# little of the spread): the report marks it an estimate (``≈``) instead.
MIN_FOR_INTERVAL = 10


def _has_ancestor(row: SpanRow, by_id: Mapping[str, SpanRow], ids: set[str]) -> bool:
    seen = 0
    parent = row.parent_id
    while parent and seen < 1000:
        if parent in ids:
            return True
        up = by_id.get(parent)
        parent = up.parent_id if up is not None else None
        seen += 1
    return False


def _generates(rows: Sequence[SpanRow], children: Mapping[str, list[SpanRow]],
               forward_ids: set[str]) -> list[GenerateStats]:
    by_name: dict[str, list[SpanRow]] = defaultdict(list)
    for r in rows:
        if _is_generate(r):
            by_name[model_label(r, r.name)].append(r)
    out = []
    for name, every in sorted(by_name.items()):
        calls = _unslowed(every, children)
        ttft: list[float] = []
        tpot: list[float] = []
        unknown: dict[str, int] = dict.fromkeys(UNKNOWN, 0)
        tokens = 0
        counted_ns = 0
        counted = False
        for g in calls:
            out_tokens = int_attribute(g, schema.OUTPUT_TOKENS.name)
            if out_tokens is not None:
                tokens += out_tokens
                counted_ns += wall_ns(g)
                counted = True
            # the model's forwards: not a layer's (an encoder-decoder model's encoder runs under
            # generate() itself, its layers children of the call)
            steps = sorted((c for c in children.get(g.span_id, ()) if c.span_id in forward_ids
                            and schema.LAYER_INDEX.name not in c.attributes),
                           key=lambda c: c.start_ns)
            # every forward of the call traced: each at rate 1 (a call at rate 1 is never
            # left out), so none is missing
            whole = bool(steps) and all(c.attributes.get(schema.SAMPLE_RATE.name) == 1.0
                                        for c in steps)
            uncached = _without_cache(steps)
            first = steps[0].attributes.get(schema.PHASE.name) if steps else None
            if not steps or (first != "prefill" and not uncached):
                if not whole:
                    unknown["not_all_traced"] += 1
                elif first == "decode":
                    unknown["began_on_a_filled_cache"] += 1
                else:
                    unknown["no_phase"] += 1
                continue
            first_end = steps[0].start_ns + wall_ns(steps[0])
            ttft.append(first_end - g.start_ns)
            decodes = steps[1:]
            if not whole:
                unknown["not_all_traced"] += 1
            elif not decodes:
                unknown["one_step"] += 1
            elif uncached or all(c.attributes.get(schema.PHASE.name) == "decode"
                                 for c in decodes):
                tpot.append((g.start_ns + wall_ns(g) - first_end) / len(decodes))
            elif all(_phase_with_cache(c) for c in decodes):
                unknown["several_tokens_a_step"] += 1
            else:  # a later forward without a cache: not one decoding loop
                unknown["not_all_traced"] += 1
        out.append(GenerateStats(
            name=name, calls=len(every), used=len(calls),
            wall=quantiles([wall_ns(g) for g in calls]),
            output_tokens=tokens if counted else None,
            tokens_per_s=tokens / (counted_ns / 1e9) if counted and counted_ns > 0 else None,
            ttft=quantiles(ttft) if ttft else None, ttft_calls=len(ttft),
            tpot=quantiles(tpot) if tpot else None, tpot_calls=len(tpot),
            unknown=tuple((k, n) for k, n in unknown.items() if n)))
    return out


def _without_cache(steps: Sequence[SpanRow]) -> bool:
    """``generate(..., use_cache=False)``: every step a forward over the whole sequence so far,
    one token longer each time, with no cache (no phase); each still makes one token a row."""
    lengths = [int_attribute(c, schema.SEQ_LEN_Q.name) for c in steps]
    return (bool(steps) and all(schema.PHASE.name not in c.attributes for c in steps)
            and lengths[0] is not None
            and lengths == [lengths[0] + i for i in range(len(steps))])


def _phase_with_cache(forward: SpanRow) -> bool:
    """A forward of a decoding loop: a decode, or several query tokens on a filled cache (the
    step of assisted or speculative decoding), not a forward without a cache."""
    phase = forward.attributes.get(schema.PHASE.name)
    past = int_attribute(forward, schema.KV_CACHE_LEN.name)
    return phase == "decode" or (phase == "prefill" and past is not None and past > 0)


def _profiled(row: SpanRow, children: Mapping[str, list[SpanRow]]) -> bool:
    return any(is_profiled(d) for d in (row, *descendants(row, children)))


def _unslowed(rows: Sequence[SpanRow], children: Mapping[str, list[SpanRow]]) -> list[SpanRow]:
    """``rows`` without those the profiler slowed, unless that leaves none."""
    kept = [r for r in rows if not _profiled(r, children)]
    return kept or list(rows)


def _shares(forwards: Sequence[SpanRow], children: Mapping[str, list[SpanRow]],
            attention: set[str]) -> list[ShareStats]:
    grouped: dict[tuple[str, str | None], list[SpanRow]] = defaultdict(list)
    for f in forwards:
        phase = f.attributes.get(schema.PHASE.name)
        module = f.attributes.get(schema.MODULE.name)  # the span's name also says the phase
        grouped[(model_label(f, module if isinstance(module, str) and module else f.name),
                 phase if isinstance(phase, str) else None)].append(f)
    out = []
    for (model, phase), every in sorted(grouped.items(),
                                        key=lambda kv: (kv[0][0], kv[0][1] != "prefill",
                                                        kv[0][1] or "")):
        kept = _unslowed(every, children)
        got = _attention_in(kept, children, attention)
        out.append(ShareStats(model=model, phase=phase, forwards=len(every), used=len(kept),
                              calls=got.calls, model_ns=got.own_ns, attention_ns=got.attention_ns,
                              share=got.attention_ns / got.own_ns if got.own_ns > 0 and got.calls
                              else None, share_interval=got.interval, sampled=got.sampled))
    return out
