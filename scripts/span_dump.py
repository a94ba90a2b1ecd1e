"""Every span attribute of a fixed set of runs, as one JSON file: the "behaviour unchanged" check.

Each scenario runs in a fresh interpreter (``sys.executable``) on the CPU, seeded, through the
public API only (``configure(exporter=<an in-memory SpanExporter>)``, one scenario through
``attnscope.testing.capture_spans``), so the same script runs against any version of attnscope
on ``PYTHONPATH``; the tiny models come from this checkout's ``tests/support/arch_sweep.py``.
For every span: its name, the names of its ancestors, kind, status, every attribute, its events
and links (by the name path of the span linked to); and per scenario the resource attributes.

Normalised (what is measured, random or the machine's), replaced by ``"#"`` (lists: each item):
  - times: every attribute whose key ends in ``_ns`` (``wall_ns``, ``kernel.top_ns``,
    ``request.attention_ns``, ...); span start/end times and ids are not written at all;
  - memory readings: keys starting with ``attnscope.memory.``;
  - rates computed from times: ``attnscope.tflops``, ``tokens_per_s``, ``core_tflops`` (also
    written when absent because the profile measured ``core_ns`` as 0),
    ``roofline.achieved_tflops``, ``roofline.achieved_gbps``, ``roofline.fraction``,
    ``graph.attention_share``; and ``attnscope.kernel.top_names`` / ``kernel.top``
    (the five ops with the most measured time: which five, and their order, is measured);
  - ``attnscope.summary``: each number becomes ``#`` and an SI or binary prefix after it is
    dropped (``12.3 µs`` and ``1.2 ms`` both read ``# s``, ``4 KiB`` reads ``# B``);
  - ``attnscope.profile.path`` (a file name with the pid and time), ``exception.stacktrace``
    (file paths and line numbers of the installed copy);
  - the machine's and the environment's, on spans and the resource: ``host.*``,
    ``process.pid``, ``process.creation.time``, ``process.command_args``,
    ``process.executable.*``, ``process.runtime.version``, ``telemetry.sdk.version``, and
    ``service.instance.id`` (random). The torch and transformers versions, which decide the ops
    and models the spans describe, are written once (``versions``): the test skips on others.
Everything else is kept verbatim. Spans have no stable ids: they are sorted by (scenario, parent
path, name, the normalised record).

The golden (tests/golden/span_attributes.json, checked by tests/test_span_dump.py) is this
script's output on the code before issue 39's redesign (39a2950), torch 2.13 on CPU and the dev
venv's transformers; to make it again, from the repository's root:
    git worktree add --detach ../before 39a2950
    PYTHONPATH=../before python scripts/span_dump.py --out tests/golden/span_attributes.json
(``PYTHONPATH=$PWD`` instead: this tree's code, for a change meant to alter spans.) Any two trees
compare the same way: run it with ``PYTHONPATH=<tree>`` for each and diff the two files.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SUPPORT = HERE.parent / "tests" / "support" / "arch_sweep.py"

# ---- the CI model slice: tests/test_arch_sweep.py's NAMED (tests/test_span_dump.py pins it) ----
CAUSAL = [
    ("llama", "LlamaForCausalLM"), ("mistral", "MistralForCausalLM"),
    ("mixtral", "MixtralForCausalLM"), ("qwen2", "Qwen2ForCausalLM"),
    ("qwen3", "Qwen3ForCausalLM"), ("qwen3_moe", "Qwen3MoeForCausalLM"),
    ("gemma", "GemmaForCausalLM"), ("gemma2", "Gemma2ForCausalLM"),
    ("gemma3_text", "Gemma3ForCausalLM"), ("phi", "PhiForCausalLM"),
    ("phi3", "Phi3ForCausalLM"), ("falcon", "FalconForCausalLM"), ("opt", "OPTForCausalLM"),
    ("gpt2", "GPT2LMHeadModel"), ("gptj", "GPTJForCausalLM"),
    ("gpt_neo", "GPTNeoForCausalLM"), ("gpt_neox", "GPTNeoXForCausalLM"),
    ("gpt_bigcode", "GPTBigCodeForCausalLM"), ("codegen", "CodeGenForCausalLM"),
    ("cohere", "CohereForCausalLM"), ("cohere2", "Cohere2ForCausalLM"),
    ("olmo", "OlmoForCausalLM"), ("olmo2", "Olmo2ForCausalLM"),
    ("starcoder2", "Starcoder2ForCausalLM"), ("smollm3", "SmolLM3ForCausalLM"),
    ("deepseek_v2", "DeepseekV2ForCausalLM"), ("deepseek_v3", "DeepseekV3ForCausalLM"),
    ("gpt_oss", "GptOssForCausalLM"), ("bloom", "BloomForCausalLM"),
    ("mpt", "MptForCausalLM"), ("xlm", "XLMWithLMHeadModel"), ("moshi", "MoshiForCausalLM"),
    ("ministral3", "Ministral3ForCausalLM"), ("diffllama", "DiffLlamaForCausalLM"),
    ("minimax", "MiniMaxForCausalLM"), ("hrm_text", "HrmTextForCausalLM"),
    ("deepseek_v4", "DeepseekV4ForCausalLM"), ("hunyuan_v1_dense", "HunYuanDenseV1ForCausalLM"),
    ("hunyuan_v1_moe", "HunYuanMoEV1ForCausalLM"), ("ministral", "MinistralForCausalLM"),
    ("nemotron", "NemotronForCausalLM"), ("lfm2_moe", "Lfm2MoeForCausalLM"),
    ("xmod", "XmodForCausalLM"), ("gemma4_text", "Gemma4ForCausalLM"),
    ("gemma3n_text", "Gemma3nForCausalLM"), ("zaya", "ZayaForCausalLM"),
    ("qwen4_exp_text", "Qwen4ExpForCausalLM"),
]
OTHERS = [
    *((t, c, "encoder") for t, c in [
        ("bert", "BertModel"), ("roberta", "RobertaModel"), ("distilbert", "DistilBertModel"),
        ("electra", "ElectraModel"), ("albert", "AlbertModel"),
        ("deberta-v2", "DebertaV2Model"), ("modernbert", "ModernBertModel")]),
    ("t5", "T5ForConditionalGeneration", "seq2seq"),
    ("bart", "BartForConditionalGeneration", "seq2seq"),
    ("mbart", "MBartForConditionalGeneration", "seq2seq"),
    ("marian", "MarianMTModel", "seq2seq"),
    ("whisper", "WhisperForConditionalGeneration", "whisper"),
    ("vit", "ViTModel", "vision"), ("swin", "SwinModel", "vision"),
    ("clip", "CLIPModel", "pair"), ("siglip", "SiglipModel", "pair"),
]
SLICE: list[tuple[str, str, str]] = [(t, c, "causal") for t, c in CAUSAL] + OTHERS
_CHUNK = 8  # families per scenario (a process each: they run side by side)

# ---- normalisation ---------------------------------------------------------------------------
HIDDEN = "#"
_RATES = frozenset(f"attnscope.{k}" for k in (
    "tflops", "tokens_per_s", "core_tflops", "roofline.achieved_tflops",
    "roofline.achieved_gbps", "roofline.fraction", "graph.attention_share",
    "kernel.top_names", "kernel.top"))
_TEXTS = frozenset(("attnscope.summary",))
_PATHS = frozenset(("attnscope.profile.path", "exception.stacktrace"))
# the machine's, the process's and the environment's (span and resource attributes; versions
# that decide the spans are checked instead: versions()); service.instance.id is random
_MACHINE = ("process.pid", "process.creation.time", "process.command_args",
            "process.executable.", "process.runtime.version", "host.", "service.instance.id",
            "telemetry.sdk.version")
# a number (not a digit inside a word: fp32, bf16, q_proj2) and a prefixed unit after it
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d+(?:\.\d+)?(?:e[-+]?\d+)?"
                     r"(?:( ?)(?:[kMGTPµmn]|[KMG]i)?(FLOP/s|FLOP|B/s|B|s)\b)?")


def _hidden(value: Any) -> Any:
    return [HIDDEN] * len(value) if isinstance(value, (list, tuple)) else HIDDEN


def _figures_hidden(text: str) -> str:
    return _NUMBER.sub(lambda m: HIDDEN + (m[1] or "") + (m[2] or ""), text)


def normalised(key: str, value: Any) -> Any:
    """``value`` of attribute ``key`` as the dump writes it (see the module docstring)."""
    if isinstance(value, tuple):
        value = list(value)
    if key.endswith("_ns") or key.startswith(_MACHINE) or key.startswith("attnscope.memory.") \
            or key in _RATES or key in _PATHS:
        return _hidden(value)
    if key in _TEXTS:
        return [_figures_hidden(v) for v in value] if isinstance(value, list) \
            else _figures_hidden(value)
    return value


def _attributes(attrs: Any) -> dict[str, Any]:
    raw = dict(attrs or {})
    # core_tflops (FLOPs over core_ns) is left out when the profile measured the core at 0 ns,
    # which the CPU profiler's microsecond clock does for a small core now and then: written as
    # there whenever its FLOPs and core_ns are (its value is normalised anyway)
    if raw.get("attnscope.core_ns") == 0 and isinstance(raw.get("attnscope.flops"), int):
        raw.setdefault("attnscope.core_tflops", 0.0)
    return {k: normalised(k, v) for k, v in sorted(raw.items())}


def records(scenario: str, spans: list[Any]) -> list[dict[str, Any]]:
    """The spans of one scenario as the dump writes them, sorted."""
    by_id = {s.context.span_id: s for s in spans}

    def path(span_id: int | None) -> list[str]:
        out: list[str] = []
        seen: set[int] = set()
        while span_id is not None and span_id not in seen:
            seen.add(span_id)
            parent = by_id.get(span_id)
            if parent is None:
                out.append("<not exported>")
                break
            out.append(parent.name)
            span_id = parent.parent.span_id if parent.parent is not None else None
        return out[::-1]

    rows = []
    for s in spans:
        rows.append({
            "scenario": scenario, "parents": path(s.parent.span_id if s.parent else None),
            "name": s.name, "kind": s.kind.name, "status": s.status.status_code.name,
            "status_description": s.status.description,
            "scope": s.instrumentation_scope.name if s.instrumentation_scope else None,
            "attributes": _attributes(s.attributes),
            "events": [{"name": e.name, "attributes": _attributes(e.attributes)}
                       for e in s.events],
            "links": [{"to": path(link.context.span_id), "attributes": _attributes(
                link.attributes)} for link in s.links],
        })
    return sorted(rows, key=lambda r: (r["parents"], r["name"], json.dumps(r, sort_keys=True)))


# ---- scenarios (each runs in its own process: see child()) ------------------------------------
SETTINGS: dict[str, Any] = {
    "sample_rate": 1.0, "warmup_calls": 0, "overhead_budget": 1.0, "profile_rate": 0.0,
    "slow_call_quantile": 1.0, "live_trigger": False, "metrics": False, "run_id": "span-dump",
    "seed": 0, "service_name": "span-dump"}


@contextmanager
def exported(**settings: Any) -> Iterator[list[Any]]:
    """attnscope's own pipeline into memory; ``spans`` is filled when the block ends."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    import attnscope

    memory = InMemorySpanExporter()
    attnscope.configure(**{**SETTINGS, **settings, "exporter": memory})
    spans: list[Any] = []
    try:
        yield spans
    finally:
        attnscope.shutdown(timeout_s=60.0)
        spans.extend(memory.get_finished_spans())


def _qkv(b: int, h: int, hk: int, sq: int, skv: int, d: int) -> tuple[Any, Any, Any]:
    import torch

    return torch.randn(b, h, sq, d), torch.randn(b, hk, skv, d), torch.randn(b, hk, skv, d)


def _attend() -> Callable[..., Any]:
    import torch.nn.functional as F

    import attnscope

    @attnscope.trace
    def attend(q: Any, k: Any, v: Any, mask: Any = None, causal: bool = False,
               gqa: bool = False) -> Any:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                              enable_gqa=gqa)
    return attend


def _sdpa_calls(attend: Callable[..., Any]) -> None:
    """Plain, bool- and float-masked, causal (square and decode-like), GQA."""
    import torch

    q, k, v = _qkv(2, 4, 4, 8, 8, 16)
    attend(q, k, v)
    keep = torch.ones(2, 1, 8, 8, dtype=torch.bool).tril()
    keep[1, :, :, :3] = False
    keep[1, :, :, 3] = True
    attend(q, k, v, mask=keep)
    attend(q, k, v, mask=torch.zeros(2, 1, 8, 8).masked_fill(~keep, float("-inf")))
    attend(q, k, v, causal=True)
    q1, k1, v1 = _qkv(1, 2, 2, 3, 12, 8)
    attend(q1, k1, v1, causal=True)
    qg, kg, vg = _qkv(1, 8, 2, 6, 6, 8)
    attend(qg, kg, vg, gqa=True)
    attend(qg, kg.repeat_interleave(4, 1), vg.repeat_interleave(4, 1), causal=True)


def scenario_trace() -> list[Any]:
    import torch

    import attnscope

    attend = _attend()
    named = attnscope.trace(name="custom-name", attributes={"team": "x", "n": 3})(
        lambda q: torch.nn.functional.scaled_dot_product_attention(q, q, q))

    @attnscope.trace
    def fails(q: Any) -> Any:
        raise ValueError("the user's error")

    with exported() as spans:
        _sdpa_calls(attend)
        named(torch.randn(1, 2, 4, 8))
        try:
            fails(torch.randn(1, 2, 4, 8))
        except ValueError:
            pass
        with attnscope.sampling(force=False):
            attend(*_qkv(1, 1, 1, 2, 2, 4))  # suppressed: no span
    return spans


def scenario_roofline() -> list[Any]:
    attend = _attend()
    with exported(device_peaks={"tflops": 0.05, "gbps": 20.0}) as spans:
        _sdpa_calls(attend)
    return spans


def scenario_span() -> list[Any]:
    import torch

    import attnscope

    attend = _attend()
    with exported() as spans:
        with attnscope.span("outer", tokens=16, attributes={"stage": "encode", "k": [1, 2]}) \
                as outer:
            outer.set(extra="set inside", ratio=0.5)
            with attnscope.span("inner", sample=True):
                attend(*_qkv(1, 2, 2, 4, 4, 8))
            with attnscope.span("never", sample=False):
                attend(*_qkv(1, 2, 2, 4, 4, 8))
            attend(*_qkv(2, 2, 2, 4, 4, 8), causal=True)
        try:
            with attnscope.span("raises"):
                raise KeyError("inside a span")
        except KeyError:
            pass
        with attnscope.span("tokens-object", tokens=torch.tensor(3)):
            pass
    return spans


def scenario_step() -> list[Any]:
    import attnscope

    attend = _attend()
    with exported() as spans:
        for n in range(3):
            attnscope.step(n)
            attend(*_qkv(1, 2, 2, 4, 4, 8))
            attend(*_qkv(1, 2, 2, 4, 4, 8), causal=True)
        with attnscope.step(7):
            attend(*_qkv(1, 2, 2, 4, 4, 8))
        attnscope.step(None)
        attend(*_qkv(1, 2, 2, 4, 4, 8))
    return spans


def scenario_capture_spans() -> list[Any]:
    """The testing helper's path: the application's own TracerProvider."""
    import attnscope
    from attnscope.testing import capture_spans

    attend = _attend()
    with capture_spans(run_id="span-dump", slow_call_quantile=1.0, live_trigger=False,
                       metrics=False) as spans:
        attend(*_qkv(1, 2, 2, 4, 4, 8))
        attnscope.step(3)
        attend(*_qkv(1, 2, 2, 4, 4, 8), causal=True)
        attnscope.step(4)
        attend(*_qkv(1, 2, 2, 4, 4, 8))
        attnscope.step(None)
        attend(*_qkv(1, 2, 2, 4, 4, 8))
    return spans


def _sweep() -> Any:
    spec = importlib.util.spec_from_file_location("span_dump_arch_sweep", SUPPORT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _family(sweep: Any, model_type: str, class_name: str, kind: str,
            spans: list[Any]) -> None:
    """One family as tests/test_arch_sweep.py runs it (plain, padded, greedy generate), with
    ``trace_model=True``: its model forward, decoder layer and generate spans too."""
    import torch

    import attnscope

    try:
        model = sweep.build(model_type, class_name)
    except Exception as err:  # the architecture, not attnscope: recorded, not fatal
        spans.append(f"{model_type}: does not build: {type(err).__name__}")
        return
    attnscope.instrument(model, trace_model=True)
    runs: list[tuple[str, Callable[[], Any]]] = [
        (f"padded={p}", lambda p=p: model(**sweep.inputs_for(kind, model, p)))
        for p in ((False, True) if kind in ("causal", "encoder", "seq2seq", "pair") else (False,))]
    if kind == "causal":
        prompt = sweep.inputs_for(kind, model, False)["input_ids"][:1]
        runs.append(("generate", lambda: model.generate(
            prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=3, min_new_tokens=3,
            do_sample=False)))
    try:
        for label, run in runs:
            with attnscope.span(f"{model_type} {label}", sample=True), sweep.quiet(), \
                    torch.no_grad():
                try:
                    run()
                except Exception as err:
                    spans.append(f"{model_type} {label}: raised {type(err).__name__}")
    finally:
        attnscope.uninstrument(model)


def scenario_models(part: int) -> list[Any]:
    sweep = _sweep()
    spans: list[Any] = []
    with exported() as exported_spans:
        for model_type, class_name, kind in SLICE[part * _CHUNK:(part + 1) * _CHUNK]:
            _family(sweep, model_type, class_name, kind, spans)
    return spans + exported_spans


def _llama(sweep: Any) -> Any:
    return sweep.build("llama", "LlamaForCausalLM", impl="sdpa")


def scenario_batch() -> list[Any]:
    """batch(rows=...) around a padded forward and a generate: request spans per row."""
    import torch

    import attnscope

    sweep = _sweep()
    model = attnscope.instrument(_llama(sweep), trace_model=True)
    inputs = sweep.inputs_for("causal", model, True)
    with exported() as spans, torch.no_grad(), sweep.quiet():
        with attnscope.batch(["request-a", "request-b"]):
            model(**inputs)
        with attnscope.batch(["request-c", None]):
            model.generate(**inputs, max_new_tokens=3, min_new_tokens=3, do_sample=False)
        with attnscope.batch([]):  # misuse: logged, not apportioned
            model(**inputs)
    return spans


def scenario_generate() -> list[Any]:
    """generate() of a left-padded batch of two, greedy and beam search, sdpa and eager, with
    and without the model's own spans."""
    import torch

    import attnscope

    sweep = _sweep()
    with exported() as spans, torch.no_grad(), sweep.quiet():
        for impl, whole in (("sdpa", False), ("sdpa", True), ("eager", False), ("eager", True)):
            model = attnscope.instrument(sweep.build("llama", "LlamaForCausalLM", impl=impl),
                                         name_prefix=f"{impl}-{whole}", trace_model=whole)
            inputs = sweep.inputs_for("causal", model, True)
            model.generate(**inputs, max_new_tokens=4, min_new_tokens=4, do_sample=False)
            model.generate(**inputs, max_new_tokens=2, min_new_tokens=2, num_beams=2,
                           do_sample=False)
            attnscope.uninstrument(model)
    return spans


def scenario_profile() -> list[Any]:
    """The profile tier: every call profiled, kernel/op child spans; inner calls profiled_by."""
    import torch

    sweep = _sweep()
    attend = _attend()
    model = _llama(sweep)
    import attnscope

    attnscope.instrument(model, trace_model=True)
    with exported(profile_rate=1.0, profile_max_per_minute=float("inf")) as spans:
        _sdpa_calls(attend)
        with torch.no_grad(), sweep.quiet():
            model(**sweep.inputs_for("causal", model, False))
    return spans


SCENARIOS: dict[str, Callable[[], list[Any]]] = {
    "trace": scenario_trace, "roofline": scenario_roofline, "span": scenario_span,
    "step": scenario_step, "capture_spans": scenario_capture_spans, "batch": scenario_batch,
    "generate": scenario_generate, "profile": scenario_profile,
    **{f"models-{i}": (lambda i=i: scenario_models(i))
       for i in range((len(SLICE) + _CHUNK - 1) // _CHUNK)},
}


def child(name: str) -> dict[str, Any]:
    """Run one scenario in this (fresh) process: its records and resource."""
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    import attnscope

    got = SCENARIOS[name]()
    notes = sorted(s for s in got if isinstance(s, str))
    spans = [s for s in got if not isinstance(s, str)]
    resources = {json.dumps(_attributes(s.resource.attributes), sort_keys=True)
                 for s in spans}
    stats = attnscope.stats()
    return {"records": records(name, spans), "notes": notes,
            "resources": [json.loads(r) for r in sorted(resources)],
            "stats_keys": sorted(stats)}


# ---- the parent ------------------------------------------------------------------------------
def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
               TOKENIZERS_PARALLELISM="false", TRANSFORMERS_VERBOSITY="error")
    return env


def run_scenario(name: str) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", name],
                          env=_environment(), capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"scenario {name} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.splitlines()[-1]))


def versions() -> dict[str, str]:
    code = ("import json, importlib.metadata as m; print(json.dumps({p: m.version(p) for p in "
            "('torch', 'transformers')}))")
    out = subprocess.run([sys.executable, "-c", code], env=_environment(), capture_output=True,
                         text=True, check=True).stdout
    return dict(json.loads(out))


def dump(names: list[str], jobs: int) -> dict[str, Any]:
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        results = dict(zip(names, pool.map(run_scenario, names), strict=True))
    return {"versions": versions(), "scenarios": {n: results[n] for n in sorted(results)}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help="the JSON file to write (default: stdout)")
    parser.add_argument("--only", nargs="*", choices=sorted(SCENARIOS), help="these scenarios")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="scenarios run side by side (default: one per core)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child), sort_keys=True))
        return 0
    text = json.dumps(dump(args.only or sorted(SCENARIOS), max(1, args.jobs)), indent=1,
                      sort_keys=True, ensure_ascii=False) + "\n"
    if args.out:
        Path(args.out).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
