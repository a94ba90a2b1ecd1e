"""Small helpers shared by the tests (not fixtures)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import torch
import torch.nn.functional as F

import attnscope


def load_script(path: Path, name: str) -> ModuleType:
    """A script of the repository (``scripts/...``), imported as module ``name`` to test its
    functions."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calls_on(monkeypatch: Any, device: Any) -> None:
    """Traced calls look as if their tensors were on ``device(the real device or None)``: both
    lookups the capture uses are patched, the arguments' (instrumented layers, graph marks) and
    the argument summary's (traced functions)."""
    from attnscope._capture import args

    real_tensor, real_summary = args.tensor_device, args.summarize_flat

    def tensor_device(a: Any, k: Any, first: int = 0) -> Any:
        return device(real_tensor(a, k, first))

    def summarize_flat(a: Any, k: Any, names: Any) -> tuple[list[Any], Any, bool]:
        flat, found, held = real_summary(a, k, names)
        return flat, device(found), held

    monkeypatch.setattr(args, "tensor_device", tensor_device)
    monkeypatch.setattr(args, "summarize_flat", summarize_flat)


def attrs(span: Any) -> dict[str, Any]:
    return dict(span.attributes or {})


def brute_force_flops(b: int, h: int, sq: int, skv: int, d: int, dv: int, causal: bool) -> int:
    """Count unmasked (query, key) pairs from an explicit bottom-right causal mask."""
    if causal:
        i = torch.arange(sq).unsqueeze(1)
        j = torch.arange(skv).unsqueeze(0)
        pairs = int((j <= i + (skv - sq)).sum())
    else:
        pairs = sq * skv
    return 2 * b * h * pairs * (d + dv)


@attnscope.trace
def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v)


@attnscope.trace
def naive(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    return torch.softmax(q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5, dim=-1) @ v


def traced_spans(spans: list[Any]) -> list[Any]:
    """attnscope's call spans (kernel children carry no tier)."""
    return [s for s in spans if "attnscope.tier" in (s.attributes or {})]


def children_of(spans: list[Any], parent: Any) -> list[Any]:
    return [s for s in spans if s.parent is not None and s.parent.span_id == parent.context.span_id]


def descendants_of(spans: list[Any], parent: Any) -> list[Any]:
    """Every span below ``parent`` (op spans nest under op spans)."""
    out: list[Any] = []
    todo = [parent]
    while todo:
        kids = children_of(spans, todo.pop())
        out.extend(kids)
        todo.extend(kids)
    return out


def base_name(span: Any) -> str:
    """A span's name without what an instrumented layer's or model forward's name ends with:
    its phase and implementation (``"x (decode, sdpa)"``, ``"x (decode)"``, ``"x (math)"``: ``x``).
    Other spans' names are their own (a ``span("f (naive)")`` block keeps its parentheses)."""
    name = str(span.name)
    attributes = getattr(span, "attributes", None) or {}
    if "attnscope.module" in attributes and name.endswith(")") and " (" in name:
        return name[: name.rindex(" (")]
    for phase in (" (prefill)", " (decode)"):
        if name.endswith(phase):
            return name[: -len(phase)]
    return name


def traced_to_file(path: Any, fmt: str, run: Any, **settings: Any) -> list[Any]:
    """Run ``run()`` with attnscope writing to ``fmt:path`` (``jaeger-json``, ``otlp-json``) through
    its own provider, then read the file back as the CLI reads it (rows with ``name`` and
    ``attributes``; Jaeger's list attributes decoded from their JSON text)."""
    from attnscope.cli.traces import load_spans

    options: dict[str, Any] = {"sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0,
                               "profile_rate": 0.0, "metrics": False, **settings}
    attnscope.configure(exporter=f"{fmt}:{path}", **options)
    try:
        run()
        assert attnscope.flush(timeout_s=30)
    finally:
        attnscope.shutdown(timeout_s=30)
    return load_spans(path)


_SCALE = {"ns": 1.0, "µs": 1e3, "ms": 1e6, "s": 1e9, "B": 1.0, "KiB": 1024.0,
          "MiB": 1024.0 ** 2, "GiB": 1024.0 ** 3}
_PREFIX = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15}


def quantity(text: str, unit: str) -> float:
    """``"4.56 ms"`` (unit ``"time"``), ``"8.45 MFLOP"`` (``"FLOP"``), ``"1.69 GFLOP/s"``
    (``"FLOP/s"``), ``"245 MiB"`` (``"bytes"``) read back as a plain number (ns, FLOP, FLOP/s,
    bytes). Written with at most 3 significant digits, never in exponent form."""
    number, _, rest = text.partition(" ")
    assert "e" not in number.lower() and number.replace(".", "", 1).isdigit(), text
    digits = number.replace(".", "").lstrip("0")
    assert len(digits.rstrip("0") or "0") <= 3 or "." not in number, text
    if unit in ("time", "bytes"):
        return float(number) * _SCALE[rest]
    assert rest.endswith(unit), text
    return float(number) * _PREFIX[rest[: -len(unit)]]


def near(shown: float, exact: float) -> bool:
    """``shown`` is ``exact`` to the 3 significant digits a summary writes."""
    return abs(shown - exact) <= 0.0051 * abs(exact) + 1e-9


def call_summary_facts(attributes: Any) -> dict[str, str]:
    """A call span's ``attnscope.summary`` checked part by part against its exact attributes
    (figures recomputed here from ``wall_ns``/``device_ns`` and ``flops``, never read from the
    summary's own formatter); returns the parts that are not numbers, by kind."""
    a = dict(attributes)
    parts = str(a["attnscope.summary"]).split(" · ")
    time_text, _, basis = parts[0].rpartition(" ")
    busy = int(a["attnscope.device_ns"] if basis == "device" else a["attnscope.wall_ns"])
    assert basis == ("device" if a.get("attnscope.device_ns") else "wall"), parts[0]
    assert near(quantity(time_text, "time"), busy), (parts[0], busy)
    rest = parts[1:]
    if "attnscope.flops" in a:
        assert near(quantity(rest[0], "FLOP"), a["attnscope.flops"]), (rest[0], a)
        rate = a["attnscope.flops"] / busy * 1e9  # FLOP per ns -> FLOP/s
        assert near(quantity(rest[1], "FLOP/s"), rate), (rest[1], rate)
        rest = rest[2:]
    else:
        assert not any(p.endswith("FLOP") or p.endswith("FLOP/s") for p in rest), parts
    facts: dict[str, str] = {}
    for part in rest:
        if part.startswith("RSS "):
            assert near(quantity(part[4:], "bytes"), a["attnscope.memory.host_rss_bytes"]), part
            facts["rss"] = part
        elif part.startswith("peak "):
            assert near(quantity(part[5:], "bytes"), a["attnscope.memory.peak_bytes"]), part
            facts["peak"] = part
        elif part.endswith(" tok"):
            facts.setdefault("tokens", part)
        elif part.startswith("q["):
            facts["shapes"] = part
        else:
            facts.setdefault("words", "")
            facts["words"] = (facts["words"] + " · " + part).lstrip(" ·")
    return facts


def summary_trace(path: Any, fmt: str) -> tuple[list[Any], tuple[int, ...]]:
    """A trace file holding timed ``sdpa`` calls on known tensors and a profiled tiny Llama
    (sdpa, GQA 4/2 heads, prefill of 5 tokens and one decode step); returns its rows and the
    query's shape given to ``sdpa``."""
    import transformers

    cfg = transformers.LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, vocab_size=64,
                                   max_position_embeddings=32, attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(cfg).eval()
    attnscope.instrument(model)
    shape = (2, 4, 32, 16)
    q = torch.randn(*shape)
    ids = torch.randint(1, 64, (1, 5))

    def run() -> None:
        for _ in range(3):
            sdpa(q, q, q)
        with torch.no_grad(), attnscope.sampling(force=True, profile=True):
            model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=2,
                           min_new_tokens=2, do_sample=False, pad_token_id=0)

    try:
        return traced_to_file(path, fmt, run, profile_max_per_minute=1000), shape
    finally:
        attnscope.uninstrument(model)


def check_summary_trace(rows: list[Any], shape: tuple[int, ...]) -> None:
    """Every summary of :func:`summary_trace`'s file against its exact attributes and inputs."""
    b, h, s, d = shape
    calls = [r for r in rows if r.name == "sdpa"]
    assert len(calls) == 3
    for r in calls:
        a = r.attributes
        assert a["attnscope.flops"] == brute_force_flops(b, h, s, s, d, d, False)
        facts = call_summary_facts(a)
        assert facts["shapes"] == f"q[{b},{h},{s},{d}] k[{b},{h},{s},{d}] fp32"
        assert facts["tokens"] == f"{b * s} tok" and "rss" in facts
    layers = sorted((r for r in rows if r.attributes.get("attnscope.module")
                     == "model.layers.0.self_attn"), key=lambda r: r.start_ns)
    assert [r.attributes["attnscope.phase"] for r in layers] == ["prefill", "decode"]
    for r, (sq, skv) in zip(layers, [(5, 5), (1, 6)], strict=True):
        a = r.attributes
        assert a["attnscope.tier"] == "profile"
        facts = call_summary_facts(a)
        assert facts["shapes"] == f"q[1,4,{sq},8] k[1,2,{skv},8] fp32"
        assert facts["tokens"] == f"{a['attnscope.phase']} {sq} tok"
        assert facts["words"] == f"sdpa · {a['attnscope.backend']} · profiled"
        # the kernel list: the same five as top_names / top_ns, as "name: time"
        top = a["attnscope.kernel.top"]
        names, times = a["attnscope.kernel.top_names"], a["attnscope.kernel.top_ns"]
        assert len(top) == len(names) == len(times) > 0
        for entry, name, ns in zip(top, names, times, strict=True):
            shown_name, _, shown_time = entry.rpartition(": ")
            assert shown_name == name and near(quantity(shown_time, "time"), ns), entry
        check_op_summaries(rows, r)


def check_op_summaries(rows: list[Any], call: Any) -> None:
    """The operator spans under ``call``: time, own time, folded count, shapes (compact)."""
    import re

    ops = [r for r in rows
           if r.parent_id == call.span_id and "attnscope.kernel.kind" in r.attributes]
    assert ops
    for op in ops:
        a = op.attributes
        parts = a["attnscope.summary"].split(" · ")
        # Jaeger keeps whole microseconds: the file's duration is within 1 µs of the span's
        assert abs(quantity(parts[0], "time") - op.duration_ns) <= 0.0051 * op.duration_ns + 1000
        rest = parts[1:]
        if rest and rest[0].startswith("own "):
            assert near(quantity(rest[0][4:], "time"), a["attnscope.kernel.self_ns"])
            rest = rest[1:]
        if a.get("attnscope.kernel.folded"):
            assert rest[0] == f"{a['attnscope.kernel.folded']} folded"
            rest = rest[1:]
        if "attnscope.kernel.input_shapes" in a:
            text = a["attnscope.kernel.input_shapes"]
            given = [[int(d) for d in one.split(",") if d]
                     for one in re.findall(r"\[([0-9,]*)\]", text)]
            assert given and text == " ".join(str(one).replace(" ", "") for one in given)
            assert rest == [text]
