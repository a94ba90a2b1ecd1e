"""The first sampled call of a process against the later ones, in fresh processes.

The first sampled call starts attnscope's worker. The worker's side (the OpenTelemetry SDK, the
exporters, the profile parser: ~100 ms of imports) must load on the worker's own thread, never on
the call. Each run is a fresh interpreter that imports torch, warms the traced body up with plain
calls, then makes ``--calls`` sampled calls and reports, in ms:

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

Run: python benchmarks/bench_first_call.py [--runs 5] [--calls 300] [--exporter otlp]
                                           [--shape 2,8,256,64]
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


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--exporter", default="otlp", choices=("otlp", "none", "jaeger-json"))
    # SDPA's q, k and v shape: the default takes ~1.5 ms on a CPU core, like bench_profile's
    parser.add_argument("--shape", default="2,8,256,64")
    args = parser.parse_args(argv)
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
