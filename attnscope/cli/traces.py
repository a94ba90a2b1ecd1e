"""Trace files read back as plain rows: the data model every analysis command shares.

``load_spans`` reads what attnscope's file exporters write — a Jaeger JSON document
(``jaeger-json:PATH``), OTLP/JSON lines (``otlp-json:PATH``) — or a directory written by
``attnscope run`` (``traces.otlp.jsonl``, else ``traces.jaeger.json``: both hold the same spans,
so only one is read). The same spans give the same rows from either format, with two differences
the formats impose: Jaeger keeps microseconds (``start_ns``/``end_ns`` are then whole
microseconds) and stores list attributes as JSON text (read back as lists here).

``load_runs`` reads one path as the runs it holds: a trace file or run directory is one run, a
repeat directory (``run-1`` ... ``run-N``, as ``attnscope run --repeat N`` writes) is N runs.

``attention_calls`` picks the captured attention calls out of all spans; ``group_key`` is the
(layer, phase) a call is summarised under, ``call_backends`` the backend it ran under (``report``
splits a layer's rows by it).
"""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from .. import _schema as schema
from ._errors import CLIError

__all__ = ["TraceFileError", "SpanRow", "load_spans", "load_runs", "run_directories",
           "attention_calls", "group_key", "model_label", "process_of", "call_backends", "GroupKey",
           "ATTENTION_FACTS", "DIRECTORY_FILES", "RECOMPUTE", "children_of", "descendants"]

# What `attnscope run` writes into its output directory, in the order they are preferred.
DIRECTORY_FILES = ("traces.otlp.jsonl", "traces.jaeger.json")
# The phase group_key gives a forward recomputed in a backward pass (activation checkpointing).
RECOMPUTE = "recompute"
# Attributes only an attention call carries (a model forward or a span() block has none of them).
ATTENTION_FACTS = (schema.NUM_HEADS.name, schema.HEAD_DIM.name, schema.FLOPS.name)
# Tags the Jaeger exporter adds from the span itself rather than its attributes.
_JAEGER_EXTRA = ("otel.scope.name", "otel.scope.version", "span.kind", "error")
_OTLP_STATUS = {1: "OK", 2: "ERROR"}
_RUN_DIR = re.compile(r"^run-(\d+)$")
# What `attnscope report` summarises a call under: (module, phase, backend; None: unknown).
GroupKey = tuple[str, str | None, str | None]


_NO_RESOURCE: Mapping[str, Any] = MappingProxyType({})


class TraceFileError(CLIError):
    """A path that gives no attnscope spans: missing, not JSON, not a trace, empty, or a trace
    written by another tool. The message is one line, naming the path."""


@dataclass(frozen=True, slots=True)
class SpanRow:
    """One span as read from a file. ``attributes`` keep their full keys and typed values."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    start_ns: int  # unix epoch nanoseconds
    end_ns: int
    attributes: Mapping[str, Any]
    service: str | None
    # the writing process's resource (Jaeger: its process tags); one mapping per process, shared
    resource: Mapping[str, Any] = field(default_factory=lambda: _NO_RESOURCE, compare=False,
                                        repr=False)

    @property
    def duration_ns(self) -> int:
        return max(0, self.end_ns - self.start_ns)


def load_spans(path: str | os.PathLike[str]) -> list[SpanRow]:
    """Every span in a trace file or ``attnscope run`` directory, by start time.

    A directory holds one file per process that exported (``traces.otlp.jsonl``, and per rank
    or extra process ``traces.rank1.otlp.jsonl``, ``traces.pid42.otlp.jsonl``, rotated ones with
    ``.1`` ...): all of them are read, in one format (OTLP/JSON lines, else Jaeger JSON: the two
    hold the same spans). Raises :class:`TraceFileError` unless at least one span was written by
    attnscope.
    """
    given = Path(path)
    rows: list[SpanRow] = []
    for file in _trace_files(given):
        try:
            text = file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise TraceFileError(f"{file}: cannot read it as text ({_reason(exc)})") from None
        if given.is_dir() and not text.strip():
            continue  # a process that exported nothing (an empty trace document or file)
        rows.extend(_parse(file, text))
    if not rows:
        raise TraceFileError(
            f"{given}: the trace holds no spans (did the program sample any call?)")
    if not any(schema.TIER.name in r.attributes for r in rows):
        raise TraceFileError(f"{given}: {len(rows)} spans but none from attnscope (no "
                             "attnscope.tier attribute): a trace written by another tool?")
    unique = {(r.trace_id, r.span_id): r for r in rows}
    return sorted(_models_apart(list(unique.values())),
                  key=lambda r: (r.start_ns, r.end_ns, r.span_id))


def process_of(row: SpanRow) -> tuple[Any, ...]:
    """Which process wrote ``row``, as far as its resource says."""
    r = row.resource
    return (r.get("service.instance.id"), r.get("process.pid"), r.get("host.name"), row.service)


def _models_apart(rows: list[SpanRow]) -> list[SpanRow]:
    """A model's number (``attnscope.model.instance``) is kept only where another model of the
    same process has spans with the same module path (``attnscope.module``): that is where
    :func:`model_label` must tell them apart. A second model with paths of its own (an encoder
    beside a decoder) keeps plain labels: its number is dropped from the rows read."""
    key = schema.MODEL_INSTANCE.name
    if not any(key in r.attributes for r in rows):
        return rows
    numbers: dict[tuple[Any, ...], set[Any]] = defaultdict(set)
    for r in rows:
        module = r.attributes.get(schema.MODULE.name)
        if module:
            numbers[(process_of(r), module)].add(r.attributes.get(key))
    out = []
    for r in rows:
        module = r.attributes.get(schema.MODULE.name)
        if key in r.attributes and len(numbers.get((process_of(r), module), ())) < 2:
            r = replace(r, attributes=MappingProxyType(
                {k: v for k, v in r.attributes.items() if k != key}))
        out.append(r)
    return out


def run_directories(path: str | os.PathLike[str]) -> list[Path]:
    """The runs a path holds, in run order: the path itself (a trace file, a run directory), or
    a repeat directory's ``run-1`` ... ``run-N`` (a directory with no trace file of its own and
    ``run-K`` subdirectories). Only a path that exists is looked into."""
    given = Path(path)
    if not given.is_dir() or _has_trace_files(given):
        return [given]
    numbered = [(int(m.group(1)), p) for p in given.iterdir()
                if p.is_dir() and (m := _RUN_DIR.match(p.name))]
    if numbered:
        return [p for _, p in sorted(numbered)]
    halves = [given / side for side in ("a", "b") if (given / side).is_dir()]
    if halves:  # `run --repeat N --alternate`: the two commands' runs
        raise TraceFileError(f"{given}: the runs of two commands ({', '.join(map(str, halves))}"
                             "): give one per side")
    return [given]  # load_spans says what is missing


def load_runs(path: str | os.PathLike[str]) -> list[tuple[str, list[SpanRow]]]:
    """Each run a path holds (:func:`run_directories`) as (its path, its spans)."""
    return [(str(run), load_spans(run)) for run in run_directories(path)]


def _has_trace_files(path: Path) -> bool:
    try:
        return bool(_trace_files(path))
    except TraceFileError:
        return False


def children_of(rows: Sequence[SpanRow]) -> dict[str, list[SpanRow]]:
    """Each span id's child rows, in file order."""
    children: dict[str, list[SpanRow]] = {}
    for r in rows:
        if r.parent_id:
            children.setdefault(r.parent_id, []).append(r)
    return children


def descendants(row: SpanRow, children: Mapping[str, list[SpanRow]]) -> list[SpanRow]:
    """Every span under ``row``, at any depth (``children``: :func:`children_of`)."""
    out, stack = [], list(children.get(row.span_id, ()))
    while stack:
        r = stack.pop()
        out.append(r)
        stack.extend(children.get(r.span_id, ()))
    return out


def attention_calls(rows: Sequence[SpanRow]) -> list[SpanRow]:
    """The captured attention calls among ``rows``, by start time.

    Candidates are attnscope's call spans (with ``attnscope.tier``), never its operator/kernel
    child spans (``attnscope.kernel.kind``). When some candidates carry attention facts
    (``ATTENTION_FACTS``: head counts or FLOPs), the calls are those, except the calls of an
    **inner site**: a site (:func:`group_key`'s layer or name) one of whose calls ran nested in
    another site's call — SDPA traced inside an instrumented layer. Its calls are that layer's
    work, nested or not: each was sampled on its own, so at a sample rate below 1 most of them
    ran inside a layer call that was not sampled, and reporting them as well would count that
    attention twice (and the report's rows would change with the sample rate). Model forwards,
    ``generate()`` and ``span()`` blocks around the calls are left out. When no candidate has
    facts (only ``@trace``/``span()`` on inputs attnscope did not recognise), the calls are the
    innermost candidates, so such a trace is still reported.
    """
    candidates = [r for r in rows if schema.TIER.name in r.attributes
                  and schema.KERNEL_KIND.name not in r.attributes]
    by_id = {r.span_id: r for r in candidates}
    with_facts = {r.span_id for r in candidates if _has_facts(r)}
    if with_facts:
        outermost, inner_sites = [], set()
        for r in candidates:
            if r.span_id not in with_facts:
                continue
            above = next((a for a in _ancestors(r, by_id) if a.span_id in with_facts), None)
            if above is None:
                outermost.append(r)
            elif group_key(above)[0] != group_key(r)[0]:
                inner_sites.add(group_key(r)[0])
        return [r for r in outermost if group_key(r)[0] not in inner_sites]
    parents = {a.span_id for r in candidates for a in _ancestors(r, by_id)}
    return [r for r in candidates if r.span_id not in parents]


def group_key(row: SpanRow) -> tuple[str, str | None]:
    """(module path, else span name; phase or None): what a call is summarised under. A layer
    of the second or later model instrumented in its process says which (:func:`model_label`).
    A forward recomputed in a backward pass (``attnscope.recompute``) has the phase
    ``recompute``: a row of its own, whatever its phase."""
    attrs = row.attributes
    module = attrs.get(schema.MODULE.name)
    phase = RECOMPUTE if attrs.get(schema.RECOMPUTE.name) is True else attrs.get(schema.PHASE.name)
    return (model_label(row, str(module) if module else row.name), str(phase) if phase else None)


def model_label(row: SpanRow, label: str) -> str:
    """``label`` (a module path, a model's or ``generate()``'s span name), followed by the model
    it belongs to when that is the process's second or later instrumented model
    (``attnscope.model.instance``): ``model.layers.0.self_attn (LlamaForCausalLM #2)``,
    ``LlamaForCausalLM.generate #2``. The first model's labels are the paths alone."""
    number = row.attributes.get(schema.MODEL_INSTANCE.name)
    if type(number) is not int or number < 2:
        return label
    model = str(row.attributes.get(schema.MODEL.name) or "model")
    if label == model or label.startswith(model + "."):
        return f"{label} #{number}"
    return f"{label} ({model} #{number})"


def call_backends(rows: Sequence[SpanRow],
                  calls: Sequence[SpanRow]) -> dict[tuple[str, str], str]:
    """The attention backend each of ``calls`` ran under, by (trace id, span id); a call whose
    backend is unknown is left out (reported as "—").

    1. The call's own ``attnscope.backend``: written when it was profiled (the profiler saw
       which kernels ran), or when a call in it was (the worker names a layer call's backend
       from its profiled SDPA call, or the ops of a profile around it). Else that of the
       profiled calls it holds, when they agree (a trace written before the worker did).
    2. Else the backend of its **site**, when every call of the site that recorded one recorded
       the same: a site is the calls with the same :func:`group_key` and the same names of the
       call spans nested in them (``rows``: the trace's spans) — one piece of code. The demo runs
       ``attention.naive`` and ``attention.sdpa`` inside the same layers: two sites per layer,
       told apart by that nested span. A nested call is sampled on its own, so two sites whose
       nested names are one a subset of the other (a layer call whose SDPA call was not
       sampled, beside one whose was) count as one piece of code; sites whose names are not
       (naive beside sdpa) stay apart.
    3. Else unknown: no profiled call of the site, or profiled calls that disagree.
    """
    children: dict[tuple[str, str], list[SpanRow]] = defaultdict(list)
    for r in rows:
        if r.parent_id and schema.TIER.name in r.attributes \
                and schema.KERNEL_KIND.name not in r.attributes:
            children[(r.trace_id, r.parent_id)].append(r)

    def site(call: SpanRow) -> tuple[str, str | None, frozenset[str]]:
        names: set[str] = set()
        todo, seen = [call], {call.span_id}
        while todo:
            for kid in children.get((call.trace_id, todo.pop().span_id), ()):
                if kid.span_id not in seen:
                    seen.add(kid.span_id)
                    names.add(kid.name)
                    todo.append(kid)
        return (*group_key(call), frozenset(names))

    own = {(c.trace_id, c.span_id): str(b) for c in calls
           if (b := c.attributes.get(schema.BACKEND.name))}
    for c in calls:
        held = {str(b) for kid in children.get((c.trace_id, c.span_id), ())
                if kid.attributes.get(schema.TIER.name) == "profile"
                and (b := kid.attributes.get(schema.BACKEND.name))}
        if len(held) == 1 and (c.trace_id, c.span_id) not in own:
            own[(c.trace_id, c.span_id)] = held.pop()
    site_of = {(c.trace_id, c.span_id): site(c) for c in calls}
    seen_at: dict[tuple[str, str | None], dict[frozenset[str], set[str]]] = defaultdict(dict)
    for key, backend in own.items():
        module, phase, names = site_of[key]
        seen_at[(module, phase)].setdefault(names, set()).add(backend)
    out = dict(own)
    for key, (module, phase, names) in site_of.items():
        if key in out:
            continue
        backends = {b for other, found in seen_at[(module, phase)].items()
                    if other <= names or names <= other for b in found}
        if len(backends) == 1:
            out[key] = backends.pop()
    return out


def _has_facts(row: SpanRow) -> bool:
    return any(key in row.attributes for key in ATTENTION_FACTS)


def _ancestors(row: SpanRow, by_id: Mapping[str, SpanRow]) -> Iterator[SpanRow]:
    """The call spans above ``row``, nearest first; the walk ends at the first parent that is
    not one (an application span, or a span missing from the file)."""
    seen: set[str] = set()
    parent = by_id.get(row.parent_id) if row.parent_id else None
    while parent is not None and parent.span_id not in seen:
        seen.add(parent.span_id)
        yield parent
        parent = by_id.get(parent.parent_id) if parent.parent_id else None


# -- reading files --------------------------------------------------------------------------


def _trace_files(path: Path) -> list[Path]:
    if path.is_dir():
        for suffix in ("otlp.jsonl", "jaeger.json"):
            pattern = re.compile(rf"^traces(\.[A-Za-z0-9-]+)?\.{re.escape(suffix)}(\.\d+)?$")
            found = sorted(p for p in path.iterdir() if pattern.match(p.name) and p.is_file())
            if found:
                return found
        raise TraceFileError(f"{path}: no trace file in this directory (expected "
                             f"{' or '.join(DIRECTORY_FILES)}, as `attnscope run` writes)")
    if not path.exists():
        raise TraceFileError(f"{path}: no such file or directory")
    if not path.is_file():
        raise TraceFileError(f"{path}: not a regular file")
    return [path]


def _reason(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


def _parse(file: Path, text: str) -> list[SpanRow]:
    """Rows from a whole JSON document, else from JSON lines."""
    if not text.strip():
        raise TraceFileError(f"{file}: the file is empty (no spans)")
    try:
        documents: Iterable[Any] = [json.loads(text)]
    except ValueError:
        documents = _json_lines(file, text)
    rows: list[SpanRow] = []
    for doc in documents:
        if isinstance(doc, dict) and isinstance(doc.get("data"), list):
            spans = _jaeger_rows(doc["data"])
        elif isinstance(doc, dict) and isinstance(doc.get("resourceSpans"), list):
            spans = _otlp_rows(doc["resourceSpans"])
        elif _is_chrome_trace(doc):
            raise TraceFileError(
                f"{file}: a Chrome trace (traceEvents, as torch.profiler's export_chrome_trace "
                "writes), not spans: open it in Perfetto (ui.perfetto.dev) or chrome://tracing; "
                "attnscope reads the Jaeger JSON / OTLP/JSON files of exporter=\"jaeger-json:PATH\""
                " / \"otlp-json:PATH\" or an `attnscope run` directory")
        else:
            raise TraceFileError(f"{file}: JSON but not a trace (expected a Jaeger JSON document "
                                 '{"data": [...]} or OTLP/JSON lines {"resourceSpans": [...]})')
        try:
            rows.extend(spans)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise TraceFileError(f"{file}: a malformed span ({type(exc).__name__}: "
                                 f"{_reason(exc)})") from None
    return rows


def _intern(key: Any) -> Any:
    return sys.intern(key) if type(key) is str else key


def _json_lines(file: Path, text: str) -> Iterator[Any]:
    """Each line's document, parsed as it is reached: a file's documents are never all held at
    once (a rotated 64 MiB OTLP file parses to about a GB of objects). Lines end at ``\n``
    only: JSON text may hold U+2028 and the other breaks ``splitlines`` would cut at."""
    start, lineno = 0, 0
    while start < len(text):
        end = text.find("\n", start)
        if end < 0:
            end = len(text)
        line, start, lineno = text[start:end], end + 1, lineno + 1
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except ValueError as exc:
            raise TraceFileError(f"{file}: not JSON (line {lineno}: {_reason(exc)})") from None


def _is_chrome_trace(doc: Any) -> bool:
    """The Trace Event Format: ``{"traceEvents": [...]}`` (torch.profiler, Chrome, Perfetto) or
    its bare array of events (each with a phase ``"ph"``)."""
    if isinstance(doc, dict):
        return isinstance(doc.get("traceEvents"), list)
    return isinstance(doc, list) and bool(doc) and all(
        isinstance(e, dict) and "ph" in e for e in doc[:10])


# attnscope's own string attributes: text that looks like a JSON list (``kernel.input_shapes``,
# ``[2,24]``) stays text, as it is in OTLP
_STRINGS = frozenset(a.name for a in schema.ATTRIBUTES if a.type == "string")


def _jaeger_value(tag: Mapping[str, Any]) -> Any:
    value = tag.get("value")
    if tag.get("type") == "string" and isinstance(value, str) and value.startswith("[") \
            and tag.get("key") not in _STRINGS:
        try:  # the Jaeger exporter writes list attributes as JSON text
            decoded = json.loads(value)
        except ValueError:
            return value
        # An OpenTelemetry list attribute is flat, of one primitive type; anything else (a
        # nested list such as attnscope.kernel.input_shapes) was a string attribute.
        if isinstance(decoded, list) and len({type(v) for v in decoded}) <= 1 \
                and all(isinstance(v, (str, int, float, bool)) for v in decoded):
            return decoded
    return value


def _jaeger_rows(traces: list[Any]) -> Iterator[SpanRow]:
    for trace in traces:
        if not isinstance(trace, dict):
            continue
        processes = trace.get("processes") or {}
        resources = {pid: _process_resource(p) for pid, p in processes.items()
                     if isinstance(p, dict)}
        for span in trace.get("spans") or ():
            refs = span.get("references") or ()
            parent = next((r.get("spanID") for r in refs if r.get("refType") == "CHILD_OF"),
                          span.get("parentSpanID"))
            tags = {_intern(t["key"]): _jaeger_value(t) for t in span.get("tags") or ()
                    if "key" in t}
            for key in _JAEGER_EXTRA:
                tags.pop(key, None)
            start = int(span.get("startTime", 0)) * 1000
            process = processes.get(span.get("processID")) or {}
            yield SpanRow(trace_id=str(span.get("traceID", trace.get("traceID", ""))),
                          span_id=str(span.get("spanID", "")), parent_id=parent or None,
                          name=str(span.get("operationName", "")), start_ns=start,
                          end_ns=start + int(span.get("duration", 0)) * 1000,
                          attributes=tags, service=process.get("serviceName"),
                          resource=resources.get(span.get("processID"), _NO_RESOURCE))


def _process_resource(process: Mapping[str, Any]) -> Mapping[str, Any]:
    tags = {t["key"]: _jaeger_value(t) for t in process.get("tags") or ()
            if isinstance(t, dict) and "key" in t}
    if process.get("serviceName"):
        tags.setdefault("service.name", process["serviceName"])
    return MappingProxyType(tags)


def _otlp_value(value: Mapping[str, Any]) -> Any:
    """One OTLP/JSON AnyValue as a Python value (64-bit ints are decimal strings in JSON)."""
    if "intValue" in value:
        return int(value["intValue"])
    if "doubleValue" in value:
        return float(value["doubleValue"])  # also "NaN", "Infinity"
    if "arrayValue" in value:
        return [_otlp_value(v) for v in (value["arrayValue"].get("values") or ())]
    if "kvlistValue" in value:
        return {kv["key"]: _otlp_value(kv.get("value") or {})
                for kv in value["kvlistValue"].get("values") or ()}
    for key in ("stringValue", "boolValue", "bytesValue"):
        if key in value:
            return value[key]
    return None


def _otlp_id(value: Any) -> str:
    """Hex, as the OTLP/JSON spec writes ids; base64 (the plain protobuf mapping) converted."""
    text = str(value or "")
    if len(text) in (16, 32) and all(c in "0123456789abcdefABCDEF" for c in text):
        return text.lower()
    try:
        return base64.b64decode(text, validate=True).hex() if text else ""
    except (binascii.Error, ValueError):
        return text


def _otlp_rows(resource_spans: list[Any]) -> Iterator[SpanRow]:
    for rs in resource_spans:
        resource = MappingProxyType({a["key"]: _otlp_value(a.get("value") or {})
                                     for a in (rs.get("resource") or {}).get("attributes") or ()})
        service = resource.get("service.name")
        for ss in rs.get("scopeSpans") or rs.get("instrumentationLibrarySpans") or ():
            for span in ss.get("spans") or ():
                # keys interned: one string per name, not one per span (a third of the rows'
                # memory on a large file)
                attrs = {_intern(a["key"]): _otlp_value(a.get("value") or {})
                         for a in span.get("attributes") or ()}
                status = span.get("status") or {}
                if _OTLP_STATUS.get(status.get("code", 0)):
                    attrs["otel.status_code"] = _OTLP_STATUS[status["code"]]
                    if status.get("message"):
                        attrs["otel.status_description"] = status["message"]
                parent = _otlp_id(span.get("parentSpanId"))
                yield SpanRow(trace_id=_otlp_id(span.get("traceId")),
                              span_id=_otlp_id(span.get("spanId")), parent_id=parent or None,
                              name=str(span.get("name", "")),
                              start_ns=int(span.get("startTimeUnixNano", 0)),
                              end_ns=int(span.get("endTimeUnixNano", 0)), attributes=attrs,
                              service=str(service) if service is not None else None,
                              resource=resource)
