"""Real trace files for the command-line tests: attnscope run on small real workloads.

Each call of :func:`generate` runs one short Python program in a fresh interpreter (clean
``ATTNSCOPE_*``/``OTEL_*`` environment): a tiny Llama built from a config (no download),
instrumented with ``attnscope.instrument(model, trace_model=True)``, running ``generate()``
(prefill, then decode steps). Every span goes to BOTH file exporters at once, so the two files hold
the same spans, and to a directory laid out as ``attnscope run`` writes it::

    OUT/traces.jaeger.json       Jaeger JSON (exporter "jaeger-json:PATH")
    OUT/traces.otlp.jsonl        OTLP/JSON lines (exporter "otlp-json:PATH")

Nothing here reads the files back; the tests do that themselves (plain ``json``), so what they
check does not depend on attnscope's own loader. Kept stable: other tests import it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["TraceFiles", "generate", "jaeger_spans", "otlp_spans"]

ROOT = Path(__file__).resolve().parents[2]  # the repository

JAEGER_NAME = "traces.jaeger.json"
OTLP_NAME = "traces.otlp.jsonl"

_PROGRAM = """
import sys, torch, transformers, attnscope
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from attnscope.exporters import JaegerJSONFileExporter, OTLPJSONFileExporter

opts = {opts!r}

class Both(SpanExporter):
    def __init__(self, *exporters):
        self.exporters = exporters
    def export(self, spans):
        ok = [e.export(spans) for e in self.exporters]
        return SpanExportResult.SUCCESS if all(r == SpanExportResult.SUCCESS for r in ok) \\
            else SpanExportResult.FAILURE
    def force_flush(self, timeout_millis=30000):
        return all([e.force_flush(timeout_millis) for e in self.exporters])
    def shutdown(self):
        for e in self.exporters:
            e.shutdown()

attnscope.configure(
    exporter=Both(JaegerJSONFileExporter(opts["jaeger"]), OTLPJSONFileExporter(opts["otlp"])),
    service_name=opts["service"], sample_rate=opts["sample_rate"],
    profile_rate=opts["profile_rate"], profile_max_per_minute=6000, warmup_calls=0,
    overhead_budget=1.0, seed=opts["seed"], metrics=False)
# configure()'s seed seeds the draws of declared steps only; this workload declares none, so its
# draws come from the sampler's own generator: seeded here, the same options sample and profile
# the same calls in every run (a call inside a profiled one is never profiled, so unseeded runs
# with no profiled attention call were not rare)
from attnscope._runtime import runtime
runtime.sampler.rng.seed(opts["seed"])
cfg = transformers.LlamaConfig(
    vocab_size=128, hidden_size=opts["hidden"], intermediate_size=2 * opts["hidden"],
    num_hidden_layers=opts["layers"], num_attention_heads=8, num_key_value_heads=2,
    attn_implementation=opts["attn_implementation"], pad_token_id=0, eos_token_id=None,
    bos_token_id=None)
torch.manual_seed(0)
model = transformers.LlamaForCausalLM(cfg).eval()
attnscope.instrument(model, trace_model=True)
ids = torch.randint(1, 128, (opts["batch"], opts["prompt_len"]))
with torch.inference_mode():
    for _ in range(opts["repeats"]):
        with attnscope.span("request", attributes={{"request.kind": "generate"}}):
            model.generate(ids, attention_mask=torch.ones_like(ids),
                           max_new_tokens=opts["new_tokens"], min_new_tokens=opts["new_tokens"],
                           do_sample=False, pad_token_id=0)
attnscope.shutdown(timeout_s=60)
"""


@dataclass(frozen=True)
class TraceFiles:
    """Where one workload's spans were written (both files hold the same spans)."""

    directory: Path  # the two files below, as ``attnscope run`` lays them out
    jaeger: Path
    otlp: Path
    options: dict[str, Any]


def generate(directory: Path, *, attn_implementation: str = "sdpa", layers: int = 2,
             hidden: int = 64, batch: int = 2, prompt_len: int = 24, new_tokens: int = 6,
             repeats: int = 3, sample_rate: float = 1.0, profile_rate: float = 0.1,
             seed: int = 0, service: str = "cli-test", timeout: float = 300.0) -> TraceFiles:
    """Run the workload once and write its spans under ``directory`` (created if needed).

    ``attn_implementation``: transformers' ``"sdpa"`` or ``"eager"`` (eager is the slower one,
    for comparisons). ``profile_rate``: share of sampled calls profiled (operator child spans).
    ``seed``: which calls are sampled and profiled (the same for the same options).
    Raises ``RuntimeError`` with the program's stderr when it fails.
    """
    directory.mkdir(parents=True, exist_ok=True)
    jaeger, otlp = directory / JAEGER_NAME, directory / OTLP_NAME
    opts: dict[str, Any] = dict(
        jaeger=str(jaeger), otlp=str(otlp), attn_implementation=attn_implementation,
        layers=layers, hidden=hidden, batch=batch, prompt_len=prompt_len, new_tokens=new_tokens,
        repeats=repeats, sample_rate=sample_rate, profile_rate=profile_rate, seed=seed,
        service=service)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env["ATTNSCOPE_METRICS"] = "false"
    code = textwrap.dedent(_PROGRAM).format(opts=opts)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=ROOT)
    if done.returncode != 0 or not jaeger.is_file() or not otlp.is_file():
        raise RuntimeError(f"trace workload failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return TraceFiles(directory, jaeger, otlp, opts)


def jaeger_spans(path: Path) -> list[dict[str, Any]]:
    """The spans of a Jaeger JSON file, each with ``tags`` turned into a plain dict."""
    out = []
    for trace in json.loads(path.read_text())["data"]:
        for span in trace["spans"]:
            span = dict(span)
            span["tags"] = {t["key"]: t["value"] for t in span["tags"]}
            out.append(span)
    return out


def otlp_spans(path: Path) -> list[dict[str, Any]]:
    """The spans of an OTLP/JSON-lines file, each with ``attributes`` as a plain dict of the
    protobuf JSON values (``{"intValue": "12"}`` and so on, as written)."""
    out = []
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        for rs in json.loads(line).get("resourceSpans", ()):
            for ss in rs.get("scopeSpans", ()):
                for span in ss.get("spans", ()):
                    span = dict(span)
                    span["attributes"] = {a["key"]: a["value"] for a in span.get("attributes", ())}
                    out.append(span)
    return out
