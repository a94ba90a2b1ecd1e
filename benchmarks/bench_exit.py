"""Exit time with attnscope's default exporter (OTLP gRPC, localhost:4317) and nothing listening
(issue 38 §1 "exit waits at most 2 s").

Each run: a child (python -c, cwd = the checkout measured) traces 200 SDPA calls at sample rate 1
and writes time.time() to stderr as its main returns; the parent notes when the child has ended.
exit = end - main return. Baseline: the same child with ATTNSCOPE_ENABLED=0. Runs interleave
(baseline, then each checkout); medians and ranges. Usage: bench_exit.py RUNS ROOT [ROOT ...]
"""
from __future__ import annotations

import os
import socket
import statistics
import subprocess
import sys
import time

CHILD = r'''
import sys, time, torch, attnscope
import torch.nn.functional as F
attnscope.instrument_sdpa()
q = torch.randn(1, 2, 16, 8)
for _ in range(200):
    F.scaled_dot_product_attention(q, q, q)
sys.stderr.write(f"MAINEND {time.time()!r}\n"); sys.stderr.flush()
'''

def once(root: str, enabled: bool) -> float:
    with socket.socket() as s:  # the default endpoint must be refusing
        assert s.connect_ex(("127.0.0.1", 4317)) != 0, "something listens on 4317"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    env.update(OMP_NUM_THREADS="1", ATTNSCOPE_ENABLED="1" if enabled else "0",
               ATTNSCOPE_SAMPLE_RATE="1", ATTNSCOPE_WARMUP_CALLS="0")
    p = subprocess.run([sys.executable, "-c", CHILD], cwd=root, env=env, capture_output=True,
                       text=True, timeout=120)
    end = time.time()
    line = [text for text in p.stderr.splitlines() if text.startswith("MAINEND")]
    if not line:
        raise SystemExit(p.stderr)
    return end - float(line[0].split()[1])

def _summary(xs: list[float]) -> str:
    return (f"median {statistics.median(xs):.2f} s, range {min(xs):.2f}-{max(xs):.2f} "
            f"(n={len(xs)})")


def main() -> None:
    runs, roots = int(sys.argv[1]), sys.argv[2:]
    base: list[float] = []
    on: dict[str, list[float]] = {r: [] for r in roots}
    for _ in range(runs):
        base.append(once(roots[0], False))
        for r in roots:
            on[r].append(once(r, True))
    f = _summary
    print(f"exit, attnscope off: {f(base)}")
    for r in roots:
        print(f"exit, attnscope on, nothing listening, {r}: {f(on[r])}")
        print(f"  added over off (paired): {f([a - b for a, b in zip(on[r], base, strict=True)])}")


if __name__ == "__main__":
    main()
