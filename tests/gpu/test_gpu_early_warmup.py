"""The profiler's CUDA warm-up, queued by ``configure()`` before CUDA is up, starts when the
program brings CUDA up, not at its first sampled call (issue 37 goal 1; the wiring's CPU tests:
tests/test_warm_up_early.py).

In a fresh process: no test before it may have initialised CUDA.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

_PROGRAM = textwrap.dedent("""
    import json, time
    import torch
    import attnscope
    from attnscope._runtime import runtime

    attnscope.configure(exporter="none")  # the profile tier on, as by default
    queued = runtime.profiler.cuda_init_queued and not torch.cuda.is_initialized()
    t0 = time.monotonic()
    torch.zeros(1, device="cuda")  # the program brings CUDA up: the queued call starts the helper
    up_s = time.monotonic() - t0
    helper = runtime.profiler.warming
    started = helper is not None and helper.name == "attnscope-profiler-warmup"
    while not runtime.profiler.warm_cuda and time.monotonic() - t0 < 120:
        time.sleep(0.01)
    print(json.dumps({"queued": queued, "started": started, "warm_cuda": runtime.profiler.warm_cuda,
                      "cuda_up_s": up_s, "warm_after_s": time.monotonic() - t0,
                      "broken": runtime.profiler.broken}))
""")


def test_the_cuda_warm_up_starts_when_the_program_brings_cuda_up() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print(found)  # how long CUDA's start-up and the warm-up took, for the notes
    assert found["queued"] and found["started"], found
    assert found["warm_cuda"] and not found["broken"], found
