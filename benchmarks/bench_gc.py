"""What attnscope adds to the cyclic GC's work: objects moved to its oldest generation.

CPython runs a full collection (every tracked object of the process, all threads paused: 170 ms
on this benchmark's small heap of ~375,000 objects, far more in a service) once the objects moved
into its oldest generation since the last one exceed a quarter of those already there. So every
object attnscope keeps alive across two young collections brings the next full pause closer, for
whichever thread then allocates. This counts them, per capture, side by side with the same program
not instrumented, each mode in a fresh process:

  plain       a transformers Llama built from a config (4 layers, hidden 64), ``generate()``
  defaults    the same, ``configure(exporter=...)`` and ``instrument(model)`` at their defaults
  every       every call traced (sample_rate=1, no warm-up, no budget, no profiler)

and prints, per mode: the captures, the objects moved to the oldest generation (a callback around
each generation-1 collection reads that generation's length; ``--types``: what they were), the
full collections seen and their pauses. Counts, not times: what a full collection then costs
depends on the heap, the figure here is how often one comes. The objects the worker still holds
at the end are not a leak: the worker's window of recent spans is bounded (``BUILT_KEEP``).

Run: python benchmarks/bench_gc.py [--generates 100] [--new-tokens 32] [--exporter none]
                                   [--types 8]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

_CHILD = r"""
import collections, gc, json, sys, time
import torch
mode, generates, new_tokens, exporter, types = sys.argv[1:6]
generates, new_tokens, types = int(generates), int(new_tokens), int(types)
from transformers import LlamaConfig, LlamaForCausalLM
cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)
cfg._attn_implementation = "sdpa"
torch.manual_seed(0)
model = LlamaForCausalLM(cfg).eval()
ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
mask = torch.ones_like(ids)
if mode != "plain":
    import attnscope
    kw = {"exporter": exporter}
    if mode == "every":
        kw.update(sample_rate=1.0, warmup_calls=0, overhead_budget=1.0, profile_rate=0.0)
    attnscope.configure(**kw)
    attnscope.instrument(model)
with torch.inference_mode():
    model.generate(ids, attention_mask=mask, max_new_tokens=4, do_sample=False, pad_token_id=0)
if mode != "plain":
    time.sleep(2.0)  # the worker side loaded in the background: start-up is not what is counted
    attnscope.flush(timeout_s=30)
gc.collect()
state = {}
moved = [0]
kinds = collections.Counter()
pauses = []

def watch(phase, info):
    if info["generation"] == 1:
        if phase == "start":
            state["before"] = len(gc.get_objects(generation=2))
        else:
            objs = gc.get_objects(generation=2)
            k = len(objs) - state["before"]
            moved[0] += k
            if types:
                for o in objs[len(objs) - k:]:
                    kinds[type(o).__module__ + "." + type(o).__qualname__] += 1
            del objs
    elif info["generation"] == 2:
        if phase == "start":
            state["t"] = time.perf_counter()
        else:
            pauses.append((time.perf_counter() - state["t"]) * 1e3)

heap = len(gc.get_objects())
gc.callbacks.append(watch)
t0 = time.perf_counter()
with torch.inference_mode():
    for _ in range(generates):
        model.generate(ids, attention_mask=mask, max_new_tokens=new_tokens, do_sample=False,
                       pad_token_id=0)
elapsed = time.perf_counter() - t0
gc.callbacks.remove(watch)
captured = 0
if mode != "plain":
    attnscope.flush(timeout_s=60)
    captured = attnscope.stats()["captured"]
print(json.dumps({"mode": mode, "heap": heap, "captured": captured, "moved": moved[0],
                  "full": pauses, "elapsed_s": elapsed, "types": kinds.most_common(types)}))
"""


def _run(mode: str, args: argparse.Namespace) -> dict[str, object]:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    done = subprocess.run([sys.executable, "-c", _CHILD, mode, str(args.generates),
                           str(args.new_tokens), args.exporter, str(args.types)],
                          capture_output=True, text=True, env=env, timeout=1800, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{mode} failed:\n{done.stderr[-3000:]}")
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--generates", type=int, default=100)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--exporter", default="none")
    parser.add_argument("--types", type=int, default=0, help="list the N commonest kinds moved")
    args = parser.parse_args()
    rows = [_run(mode, args) for mode in ("plain", "defaults", "every")]
    print(f"{args.generates} generate() of {args.new_tokens} tokens, exporter {args.exporter}")
    print(f"{'mode':9} {'heap':>8} {'captures':>9} {'moved':>7} {'per capture':>12} "
          f"{'full GCs':>9} {'pauses ms':>12} {'elapsed s':>10}")
    for r in rows:
        captured, moved, full = int(r["captured"]), int(r["moved"]), list(r["full"])  # type: ignore[call-overload]
        per = f"{moved / captured:.2f}" if captured else "-"
        pauses = ",".join(f"{p:.0f}" for p in full) or "-"
        print(f"{r['mode']:9} {r['heap']:>8} {captured:>9} {moved:>7} {per:>12} {len(full):>9} "
              f"{pauses:>12} {float(r['elapsed_s']):>10.2f}")  # type: ignore[arg-type]
        for name, count in r["types"]:  # type: ignore[attr-defined]
            print(f"{'':9} {count:>8} {name}")


if __name__ == "__main__":
    main()
