"""The report's "requests" section: what attention cost each request, from the
``attnscope.request`` spans an ``attnscope.batch(rows=[...])`` block ends with (one per row).

Read, never recomputed:

- A request is named by its ``attnscope.request.id`` (a plain id string the application gave),
  else by the span's parent (the application's request span: ``span <parent id>``). The
  request spans of one request (one per batch it was in: an engine that declares rows per
  decode step writes one per step) are summed.
- ``attention_ns``: Σ ``all_calls.attention_ns`` (else ``attention_ns``) — an estimate twice
  over: a row's share of each batched call's measured time (a fused kernel does not time rows
  separately), scaled from the sampled calls to all of them by 1/sample_rate. ``flops``:
  Σ ``all_calls.flops`` (else ``flops``), estimated the same way. ``tokens``, ``useful_flops``,
  ``padding_flops``, ``sampled_calls``: of the sampled calls, as counted.
- Padding share: ``padding_flops ÷ (useful_flops + padding_flops)``, of the sampled calls.
- A batch is one block: (service, ``attnscope.request.batch``). Its longest request is its row
  with the most tokens (ties: the costlier); its share is that row's attention time ÷ the sum of
  its rows'. A padding row (``None``) has no span, so a batch's figures are of its request rows.
- Quantiles: numpy's default (linear interpolation), as everywhere in the report.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from statistics import median
from typing import Any

from ... import _schema as schema
from ..render.units import MISSING, duration, si
from ..summary import Quantiles, quantiles
from ..traces import SpanRow

__all__ = ["REQUEST_SPAN", "RequestStats", "BatchStats", "Requests", "requests_of",
           "requests_json", "print_requests", "requests_html"]

REQUEST_SPAN = schema.REQUEST_SPAN  # the name the worker emits (_schema: no torch imported)
_P = schema.PREFIX + "request."
_ID, _BATCH, _BATCH_SIZE, _TOKENS = (schema.REQUEST_ID.name, schema.REQUEST_BATCH.name,
                                     schema.REQUEST_BATCH_SIZE.name, schema.REQUEST_TOKENS.name)
_CALLS, _UNAPPORTIONED = (schema.REQUEST_SAMPLED_CALLS.name,
                          schema.REQUEST_CALLS_UNAPPORTIONED.name)
_FLOPS, _USEFUL, _PADDING = (schema.REQUEST_FLOPS.name, schema.REQUEST_USEFUL_FLOPS.name,
                             schema.REQUEST_PADDING_FLOPS.name)
_KV_BYTES, _ATTENTION_NS = schema.REQUEST_KV_BYTES_READ.name, schema.REQUEST_ATTENTION_NS.name
_ALL_FLOPS, _ALL_NS, _EXACT = (schema.REQUEST_ALL_FLOPS.name, schema.REQUEST_ALL_ATTENTION_NS.name,
                               schema.REQUEST_EXACT.name)
_PHASES = ("prefill", "decode")


def _int(a: Any, key: str) -> int:
    value = a.get(key)
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0


@dataclass(slots=True)
class RequestStats:
    """One request: its request spans summed (see the module doc)."""

    request: str            # the id, else "span <parent span id>"
    trace_id: str
    spans: int = 0
    batches: int = 0
    tokens: int = 0
    sampled_calls: int = 0
    useful_flops: int = 0
    padding_flops: int = 0
    kv_bytes_read: int = 0
    sampled_attention_ns: int = 0
    attention_ns: float = 0.0  # estimated, all calls
    flops: float = 0.0         # estimated, all calls
    exact: bool = True
    phases: dict[str, dict[str, int]] = field(default_factory=dict)  # sampled calls

    @property
    def padding_share(self) -> float | None:
        total = self.useful_flops + self.padding_flops
        return self.padding_flops / total if total else None


@dataclass(frozen=True, slots=True)
class BatchStats:
    """One ``batch`` block: its request rows' figures and its longest request's share."""

    service: str
    batch: int
    rows: int
    batch_size: int
    attention_ns: float      # estimated, Σ over its request rows
    longest: str             # the request of the row with the most tokens
    longest_tokens: int
    longest_share: float | None
    padding_share: float | None
    # the longest request's share of the batch's useful FLOPs: in a padded batch every row
    # costs the kernel the same (its time share is 1 / rows); the real work is not shared so
    longest_useful_share: float | None = None


@dataclass(frozen=True, slots=True)
class Requests:
    """Every request and batch of a trace, costliest first."""

    requests: list[RequestStats]
    batches: list[BatchStats]
    spans: int
    unapportioned: int  # Σ calls_unapportioned: calls of a block apportioned to no row

    @property
    def attention(self) -> Quantiles:
        return quantiles([r.attention_ns for r in self.requests])

    def over_batches(self, pick: Any) -> tuple[float, float] | None:
        """(median, max) of ``pick(batch)`` over the batches that have one."""
        values = [v for v in map(pick, self.batches) if v is not None]
        return (median(values), max(values)) if values else None


def _identity(row: SpanRow) -> tuple[str, str]:
    given = row.attributes.get(_ID)
    if isinstance(given, str) and given:
        return given, given
    parent = row.parent_id or row.span_id  # no parent: the span alone names it
    return f"{row.trace_id}:{parent}", f"span {parent}"


def _attention(a: Any) -> float:
    return float(_int(a, _ALL_NS) if _ALL_NS in a else _int(a, _ATTENTION_NS))


def requests_of(rows: Iterable[SpanRow]) -> Requests | None:
    """The requests of ``rows``, or None when no ``attnscope.request`` span is among them."""
    spans = [r for r in rows if r.name == REQUEST_SPAN]
    if not spans:
        return None
    by_request: dict[str, RequestStats] = {}
    seen: dict[str, set[tuple[str, int]]] = {}
    blocks: dict[tuple[str, int], list[tuple[SpanRow, str]]] = {}
    for r in spans:
        a = r.attributes
        key, name = _identity(r)
        s = by_request.setdefault(key, RequestStats(name, r.trace_id))
        block = (r.service or MISSING, _int(a, _BATCH))
        seen.setdefault(key, set()).add(block)
        blocks.setdefault(block, []).append((r, key))
        s.spans += 1
        s.tokens += _int(a, _TOKENS)
        s.sampled_calls += _int(a, _CALLS)
        s.useful_flops += _int(a, _USEFUL)
        s.padding_flops += _int(a, _PADDING)
        s.kv_bytes_read += _int(a, _KV_BYTES)
        s.sampled_attention_ns += _int(a, _ATTENTION_NS)
        s.attention_ns += _attention(a)
        s.flops += float(_int(a, _ALL_FLOPS) if _ALL_FLOPS in a else _int(a, _FLOPS))
        s.exact = s.exact and a.get(_EXACT) is not False
        for phase in _PHASES:
            if f"{_P}{phase}.calls" in a:
                p = s.phases.setdefault(phase, {"calls": 0, "flops": 0, "attention_ns": 0})
                for figure in p:
                    p[figure] += _int(a, f"{_P}{phase}.{figure}")
    for key, s in by_request.items():
        s.batches = len(seen[key])
    batches = [_batch(service, batch, members, by_request)
               for (service, batch), members in blocks.items()]
    ranked = sorted(by_request.values(), key=lambda s: (-s.attention_ns, s.request))
    return Requests(ranked, batches, len(spans), sum(_int(r.attributes, _UNAPPORTIONED)
                                                     for r in spans))


def _batch(service: str, batch: int, members: Sequence[tuple[SpanRow, str]],
           requests: dict[str, RequestStats]) -> BatchStats:
    total = sum(_attention(r.attributes) for r, _ in members)
    longest, key = max(members, key=lambda m: (_int(m[0].attributes, _TOKENS),
                                               _attention(m[0].attributes)))
    useful = sum(_int(r.attributes, _USEFUL) for r, _ in members)
    padding = sum(_int(r.attributes, _PADDING) for r, _ in members)
    return BatchStats(
        service, batch, len(members), max(_int(r.attributes, _BATCH_SIZE) for r, _ in members),
        total, requests[key].request, _int(longest.attributes, _TOKENS),
        _attention(longest.attributes) / total if total > 0 else None,
        padding / (useful + padding) if useful + padding else None,
        _int(longest.attributes, _USEFUL) / useful if useful else None)


# -- output ---------------------------------------------------------------------------------

ESTIMATED = ("est., estimated: a request's share of the measured time of each batched call "
             "(a fused kernel does not time rows), scaled from the sampled calls to all by "
             "1/sample_rate. Tokens, padding, calls: of the sampled calls, as counted.")


def _share(value: float | None) -> str:
    return MISSING if value is None else f"{value:.1%}"


TOP_HEADERS = ("request", "est. attention", "est. FLOPs", "tokens", "padding", "calls",
               "batches")


def _top_cells(s: RequestStats) -> list[str]:
    return [s.request, duration(s.attention_ns), si(s.flops) + ("" if s.exact else " †"),
            f"{s.tokens:,}", _share(s.padding_share), str(s.sampled_calls), str(s.batches)]


DISTRIBUTION_HEADERS = ("requests", "request spans", "p50", "p95", "max")
BATCH_HEADERS = ("over batches", "longest's share", "longest's useful", "padding share")
_LEFT = ("request", "over batches")  # the tables whose first column names the row


def _distribution(req: Requests) -> list[list[str]]:
    q = req.attention
    return [[str(len(req.requests)), str(req.spans), duration(q.p50), duration(q.p95),
             duration(q.max)]]


def _batches(req: Requests) -> list[list[str]]:
    picks = (_longest_share, _longest_useful, _padding_share)
    pairs = [req.over_batches(pick) for pick in picks]
    counts = [str(sum(1 for b in req.batches if pick(b) is not None)) for pick in picks]
    return [["batches", *counts]] + [
        [which, *(MISSING if pair is None else f"{pair[i]:.1%}" for pair in pairs)]
        for i, which in ((0, "median"), (1, "max"))]


def _longest_useful(b: BatchStats) -> float | None:
    return b.longest_useful_share if b.rows > 1 else None


def _longest_share(b: BatchStats) -> float | None:
    """A batch of one request row has no share to speak of: left out."""
    return b.longest_share if b.rows > 1 else None


def _padding_share(b: BatchStats) -> float | None:
    return b.padding_share


def _lines(req: Requests) -> list[str]:
    lines = []
    shared = [b for b in req.batches if _longest_share(b) is not None]
    if shared:
        worst = max(shared, key=lambda b: (b.longest_share or 0.0, -b.batch))
        lines.append(f"Longest request: a batch's row with the most tokens; its share of the "
                     "batch's estimated attention time, over the batches with 2 or more "
                     "request rows (in a padded batch every row costs the kernel the same); "
                     "its useful share: of the batch's useful FLOPs, the real work. Padding "
                     "share: of the batch's FLOPs (sampled calls). "
                     "Largest share: batch "
                     f"{worst.batch} of {worst.service}, {worst.longest} ({worst.longest_tokens:,}"
                     f" tokens, {worst.rows} request rows).")
    else:
        lines.append("Longest request's share: no batch had 2 or more request rows.")
    inexact = sum(1 for s in req.requests if not s.exact)
    if inexact:
        lines.append(f"† {inexact} request(s): some call's FLOPs not exact (an upper bound).")
    if req.unapportioned:
        lines.append(f"{req.unapportioned} sampled call(s) inside batch blocks could not be "
                     "apportioned to rows: in no request's figures.")
    return lines


_TABLES = (
    ("Costliest requests (top {top} of {n} by estimated attention time, all calls)", TOP_HEADERS),
    ("Estimated attention time per request (all calls)", DISTRIBUTION_HEADERS),
    ("Batches: the longest request's share (est.), padding share", BATCH_HEADERS))


def _sections(req: Requests, top: int) -> list[tuple[str, tuple[str, ...], list[list[str]]]]:
    cells = [[_top_cells(s) for s in req.requests[:top]], _distribution(req), _batches(req)]
    return [(title.format(top=len(cells[0]), n=len(req.requests)), headers, rows)
            for (title, headers), rows in zip(_TABLES, cells, strict=True)]


def print_requests(console: Any, req: Requests, top: int) -> None:
    """The section on a rich console: three tables (folded to the width), then its notes."""
    from rich import box
    from rich.table import Table

    from ..render.console import fold

    for title, headers, cells in _sections(req, top):
        def table_of(columns: Sequence[int], title: str = title,
                     headers: tuple[str, ...] = headers, cells: list[list[str]] = cells) -> Any:
            t = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False,
                      min_width=len(title) + 1, collapse_padding=True, title_style="bold")
            for c in columns:
                left = c == 0 and headers[0] in _LEFT
                t.add_column(headers[c], justify="left" if left else "right", no_wrap=True)
            for row in cells:
                t.add_row(*(row[c] for c in columns))
            return t

        for t in fold(console, table_of, len(headers)):
            console.print(t)
    for line in [*_lines(req), ESTIMATED]:
        console.print(line, highlight=False, markup=False)


def _quantiles(q: Quantiles) -> dict[str, float]:
    return {"p50": q.p50, "p95": q.p95, "max": q.max}


def _pair(value: tuple[float, float] | None) -> dict[str, float] | None:
    return None if value is None else {"median": value[0], "max": value[1]}


def requests_json(req: Requests | None, top: int) -> dict[str, Any] | None:
    """The section as JSON values (keys in docs/cli.md), None when there are no requests."""
    if req is None:
        return None
    return {
        "requests": len(req.requests), "request_spans": req.spans,
        "calls_unapportioned": req.unapportioned,
        "estimated_attention_ns": _quantiles(req.attention),
        "top": [{"request": s.request, "trace_id": s.trace_id, "spans": s.spans,
                 "batches": s.batches, "estimated_attention_ns": s.attention_ns,
                 "estimated_flops": s.flops, "sampled_attention_ns": s.sampled_attention_ns,
                 "tokens": s.tokens, "sampled_calls": s.sampled_calls,
                 "useful_flops": s.useful_flops, "padding_flops": s.padding_flops,
                 "padding_share": s.padding_share, "kv_bytes_read": s.kv_bytes_read,
                 "exact": s.exact, "phases": s.phases} for s in req.requests[:top]],
        "batches": {
            "count": len(req.batches),
            "longest_request_share": _pair(req.over_batches(_longest_share)),
            "longest_request_useful_share": _pair(req.over_batches(_longest_useful)),
            "padding_share": _pair(req.over_batches(_padding_share)),
            "each": [{"service": b.service, "batch": b.batch, "request_rows": b.rows,
                      "batch_size": b.batch_size, "estimated_attention_ns": b.attention_ns,
                      "longest_request": b.longest, "longest_tokens": b.longest_tokens,
                      "longest_request_share": b.longest_share,
                      "longest_request_useful_share": b.longest_useful_share,
                      "padding_share": b.padding_share} for b in req.batches]},
    }


def requests_html(req: Requests, top: int) -> str:
    """The section's HTML body: the three tables, then the notes."""
    from ..render.html import escape, table

    parts = [f"<h3>{escape(title)}</h3>"
             + table(list(headers), cells, left=(0,) if headers[0] in _LEFT else ())
             for title, headers, cells in _sections(req, top)]
    notes = "".join(f"<p class=\"note\">{escape(line)}</p>" for line in [*_lines(req), ESTIMATED])
    return "".join(parts) + notes
