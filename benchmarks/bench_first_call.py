"""The first sampled call of a process against the later ones, in fresh processes.

The first sampled call starts attnscope's worker. The worker's side (the OpenTelemetry SDK, the
exporters, the profile parser: what they cost to import is in docs/benchmarks.md, "The first
sampled call") must load on the worker's own thread, never on the call. Each run is a fresh
interpreter that imports torch, warms the traced body up with plain calls, then makes
``--calls`` sampled calls and reports, in ms:

  first         the first sampled call (it starts the worker)
  later         the median of the later sampled calls (the steady state)
  extra         first - later: what the first call costs more, whatever the body
  next max      the slowest of calls 2..20: calls made while the worker's thread still imports
                compete with it for the GIL (the interpreter's switch interval is 5 ms)

Modes: ``env`` configures through ATTNSCOPE_* only (the first sampled call starts everything);
``configure`` calls ``attnscope.configure()`` right before the first call (it starts loading the
worker side in the background); ``configure+setup`` leaves 0.5 s of the program's own set-up
between ``configure()`` and the first call, as a service does before its first request.

Goal: first / later within 2x. Runs against any attnscope on the path (PYTHONPATH=... to measure
another checkout the same way).

``--generate N`` (issue 37 goal 1): a model's first ``generate()`` instead, at production defaults
(``attnscope.configure(exporter="none")`` then ``attnscope.instrument(model)``, every sampling
setting at its default), next to the same model not instrumented, each in fresh processes, the two
kinds interleaved. The model is a transformers Llama built from a config (``--model tiny``: 4
layers, hidden 256; ``--model issue37``: 16 layers, hidden 2048, 16 / 8 KV heads, bf16 on CUDA,
batch 8, 128-token prompt), ``generate()`` of N new tokens, ``--generates`` calls per process.
``--warm K`` plain ``generate()`` calls run before ``configure()``: torch's own first-use cost
(several times a later call on CPU, with or without attnscope) stays out of what is compared;
``--warm 0`` shows it. Modes: ``plain``, ``instrumented`` (configure and instrument right before
the first call), ``instrumented+setup`` (0.5 s of the program's own set-up in between) and
``configured-first`` (a service's usual order: ``configure()`` before the model is built and moved
to its device, ``instrument()`` after; on CUDA the profiler's warm-up then waits in torch's queue
for CUDA's start-up; the ``--warm`` generates are instrumented).
Goal: the first instrumented ``generate()`` within 1.2x of a later one. ``--device cuda`` stops
with a message when this torch has no CUDA.

Run: python benchmarks/bench_first_call.py [--runs 5] [--calls 300] [--exporter otlp]
                                           [--shape 2,8,256,64]
     python benchmarks/bench_first_call.py --generate 32 [--runs 5] [--generates 6] [--warm 2]
                                           [--model tiny|issue37] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from typing import Any

CHILD = textwrap.dedent("""
    import json, os, statistics, sys, time
    import torch
    torch.set_num_threads(1)
    q = torch.randn(*map(int, sys.argv[3].split(",")))
    def body(q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v)
    for _ in range(50):
        body(q, q, q)
    import attnscope
    mode, calls = sys.argv[1], int(sys.argv[2])
    if mode != "env":
        attnscope.configure(sample_rate=1.0, warmup_calls=0, profile_rate=0.0,
                            overhead_budget=1.0)
    if mode == "configure+setup":
        time.sleep(0.5)
    traced = attnscope.trace(body)
    ts = []
    for _ in range(calls):
        t = time.perf_counter()
        traced(q, q, q)
        ts.append(time.perf_counter() - t)
    ok = attnscope.stats()["captured"] == calls
    print(json.dumps({"first": ts[0] * 1e3, "later": statistics.median(ts[1:]) * 1e3,
                      "next_max": max(ts[1:20]) * 1e3, "all_sampled": ok}))
    sys.stdout.flush()
    os._exit(0)  # no exit flush: only the calls are measured
""")

MODES = ("env", "configure", "configure+setup")

GENERATE_CHILD = textwrap.dedent("""
    import json, os, statistics, sys, time
    import torch
    torch.set_num_threads(1)
    mode, spec = sys.argv[1], json.loads(sys.argv[2])
    from transformers import LlamaConfig, LlamaForCausalLM
    layers, hidden, inter, heads, kv, vocab = spec["model"]
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                      max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    device = spec["device"]
    if mode == "configured-first":  # a service's order: attnscope first, then the model's device
        import attnscope
        attnscope.configure(exporter="none")
    model = LlamaForCausalLM(cfg).eval().to(getattr(torch, spec["dtype"])).to(device)
    if mode == "configured-first":
        attnscope.instrument(model)
    ids = torch.randint(0, vocab, (spec["batch"], spec["prompt"]), device=device)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    def generate():
        sync()
        t = time.perf_counter()
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=spec["new"], min_new_tokens=spec["new"],
                           do_sample=False, pad_token_id=0)
        sync()
        return time.perf_counter() - t
    for _ in range(spec["warm"]):
        generate()
    if mode in ("instrumented", "instrumented+setup"):
        import attnscope
        attnscope.configure(exporter="none")  # production defaults otherwise
        attnscope.instrument(model)
        if mode == "instrumented+setup":
            time.sleep(0.5)
    ts = [generate() for _ in range(spec["generates"])]
    out = {"first": ts[0] * 1e3, "later": statistics.median(ts[1:]) * 1e3}
    if mode != "plain":
        s = attnscope.stats()
        out["sampled"] = s.get("sampled", 0)
        out["profiled"] = s.get("profiled", 0)
    print(json.dumps(out))
    sys.stdout.flush()
    os._exit(0)  # no exit flush: only the calls are measured
""")

GENERATE_MODES = ("plain", "instrumented", "instrumented+setup", "configured-first")
# (layers, hidden, intermediate, heads, KV heads, vocab): as benchmarks/bench_model.py's MODELS
GENERATE_MODELS = {"tiny": (4, 256, 512, 8, 4, 1000), "issue37": (16, 2048, 8192, 16, 8, 32000)}


def run_child(mode: str, calls: int, shape: str, exporter: str,
              out_dir: str) -> dict[str, float]:
    env = dict(os.environ, ATTNSCOPE_SAMPLE_RATE="1", ATTNSCOPE_WARMUP_CALLS="0",
               ATTNSCOPE_PROFILE_RATE="0", ATTNSCOPE_OVERHEAD_BUDGET="1",
               # otlp: the default exporter, to a port where nothing listens (gRPC loads)
               OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:9")
    env["ATTNSCOPE_EXPORTER"] = (f"jaeger-json:{out_dir}/t.json" if exporter == "jaeger-json"
                                 else exporter)
    # cwd: a folder with no attnscope in it (python -c puts the cwd first on the path)
    out = subprocess.run([sys.executable, "-c", CHILD, mode, str(calls), shape], check=False,
                         env=env, cwd=out_dir, capture_output=True, text=True, timeout=300)
    if out.returncode != 0:
        raise SystemExit(f"child failed ({mode}):\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def run_generate_child(mode: str, spec: dict[str, Any], out_dir: str) -> dict[str, float]:
    env = dict(os.environ, OMP_NUM_THREADS="1")
    for name in list(env):  # production defaults: nothing from the environment
        if name.startswith("ATTNSCOPE_"):
            del env[name]
    out = subprocess.run([sys.executable, "-c", GENERATE_CHILD, mode, json.dumps(spec)],
                         check=False, env=env, cwd=out_dir, capture_output=True, text=True,
                         timeout=1800)
    if out.returncode != 0:
        raise SystemExit(f"child failed ({mode}):\n{out.stderr}")
    result: dict[str, float] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def main_generate(args: argparse.Namespace) -> dict[str, float]:
    """A model's first generate(), instrumented at production defaults and plain."""
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise SystemExit(f"--device cuda: CUDA is not available to this torch "
                             f"({torch.__version__}); run it on a GPU machine or use --device cpu")
    issue = args.model == "issue37"
    spec = {"model": GENERATE_MODELS[args.model], "device": args.device,
            "dtype": "bfloat16" if issue and args.device == "cuda" else "float32",
            "batch": 8 if issue else 1, "prompt": 128 if issue else 16, "new": args.generate,
            "warm": args.warm, "generates": args.generates}
    rows: dict[str, list[dict[str, float]]] = {m: [] for m in GENERATE_MODES}
    with tempfile.TemporaryDirectory() as out_dir:
        for _ in range(args.runs):  # interleaved: each mode sees the machine alike
            for mode in GENERATE_MODES:
                rows[mode].append(run_generate_child(mode, spec, out_dir))
    import attnscope  # only to name what is measured

    print(f"attnscope {attnscope.__version__} from {os.path.dirname(attnscope.__file__)}; "
          f"model {args.model} {spec['dtype']} on {args.device}, batch {spec['batch']}, "
          f"prompt {spec['prompt']}, {args.generate} new tokens; {args.warm} plain generate() "
          f"before configure() (configured-first: instrumented ones after it); {args.runs} "
          f"fresh processes per mode, {args.generates} "
          f"generate() each; production defaults (configure(exporter='none')); load average "
          f"{os.getloadavg()[0]:.1f}. Medians over processes, ms:")
    print(f"{'mode':20} {'first':>9} {'later':>9} {'first/later':>12} {'min':>6} {'max':>6}"
          f"   first ÷ plain first")
    plain_first = statistics.median(r["first"] for r in rows["plain"])
    ratios = {}
    for mode, results in rows.items():
        first = statistics.median(r["first"] for r in results)
        later = statistics.median(r["later"] for r in results)
        each = [r["first"] / r["later"] for r in results]
        ratios[mode] = statistics.median(each)
        print(f"{mode:20} {first:9.1f} {later:9.1f} {ratios[mode]:12.2f} {min(each):6.2f} "
              f"{max(each):6.2f}   {first / plain_first:.2f}")
    sampled = [r.get("sampled", 0) for r in rows["instrumented"]]
    profiled = [r.get("profiled", 0) for r in rows["instrumented"]]
    print(f"\ninstrumented processes: sampled {sampled}, profiled {profiled}")
    print("goal: instrumented first / later <= 1.2 (plain's is the machine's own)")
    return ratios


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--exporter", default="otlp", choices=("otlp", "none", "jaeger-json"))
    # SDPA's q, k and v shape: the default is bench_profile's (its time: docs/benchmarks.md)
    parser.add_argument("--shape", default="2,8,256,64")
    parser.add_argument("--generate", type=int, default=0,
                        help="new tokens: measure a model's first generate() instead")
    parser.add_argument("--generates", type=int, default=6, help="generate() calls per process")
    parser.add_argument("--warm", type=int, default=2,
                        help="plain generate() calls before configure() (torch's own warm-up)")
    parser.add_argument("--model", choices=tuple(GENERATE_MODELS), default="tiny")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args(argv)
    if args.generate:
        return main_generate(args)
    import attnscope  # only to name what is measured

    rows: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
    with tempfile.TemporaryDirectory() as out_dir:
        for _ in range(args.runs):  # modes interleaved: each sees the machine alike
            for mode in MODES:
                rows[mode].append(run_child(mode, args.calls, args.shape, args.exporter, out_dir))
    print(f"attnscope {attnscope.__version__} from {os.path.dirname(attnscope.__file__)}, "
          f"exporter={args.exporter}, {args.runs} fresh processes per mode, "
          f"{args.calls} sampled calls each, SDPA on {args.shape} (medians over processes, ms)")
    print(f"{'mode':18} {'first':>9} {'later':>9} {'extra':>9} {'first/later':>12} "
          f"{'next max':>9}   first (each process)")
    ratios = {}
    for mode, results in rows.items():
        first = statistics.median(r["first"] for r in results)
        later = statistics.median(r["later"] for r in results)
        nxt = statistics.median(r["next_max"] for r in results)
        ratios[mode] = first / later
        each = ", ".join(f"{r['first']:.2f}" for r in results)
        print(f"{mode:18} {first:9.3f} {later:9.3f} {first - later:9.3f} {first / later:12.2f} "
              f"{nxt:9.3f}   {each}")
        if not all(r["all_sampled"] for r in results):
            print(f"  ({mode}: not every call was captured)")
    print("\ngoal: first / later <= 2")
    return ratios


if __name__ == "__main__":
    main()
