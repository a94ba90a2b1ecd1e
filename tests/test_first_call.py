"""The first sampled call of a process hands its capture over and returns: the worker side (the
OpenTelemetry SDK, the exporters, the profile parser) is imported and built on the worker's own
thread, never on the calling thread (issue 20 §1). Each case is a fresh interpreter, which records
every import and the thread that made it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

_CHILD = """
import json, sys, threading
import torch
imports = []
class Recorder:
    def find_spec(self, name, path=None, target=None):
        imports.append((threading.current_thread().name, name))
        return None
sys.meta_path.insert(0, Recorder())
import attnscope
{setup}
@attnscope.trace
def attention(q):
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)
q = torch.randn(1, 2, 16, 8)
attention(q)  # warm-up, not sampled (warmup_calls=1)
before = len(imports)
attention(q)  # the first sampled call
during = [name for thread, name in imports[before:] if thread == "MainThread"]
flushed = attnscope.flush(timeout_s=60)
stats = attnscope.stats()
worker_side = sorted({{thread for thread, name in imports
                      if name in ("attnscope._worker.engine", "opentelemetry.sdk.trace")}})
print(json.dumps({{"during": during, "flushed": flushed, "emitted": stats["emitted"],
                  "captured": stats["captured"], "worker_side_by": worker_side,
                  "worker_thread": [t.name for t in threading.enumerate()
                                    if t.name.startswith("attnscope-worker")]}}))
"""

_WORKER_SIDE = ("attnscope._worker.engine", "attnscope._export", "opentelemetry.sdk", "grpc",
                "psutil")


def _run(setup: str) -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ATTNSCOPE_"))}
    env.update(ATTNSCOPE_SAMPLE_RATE="1", ATTNSCOPE_WARMUP_CALLS="1",
               ATTNSCOPE_PROFILE_RATE="0", ATTNSCOPE_EXPORTER="none")
    code = _CHILD.format(setup=textwrap.dedent(setup))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=180, env=env, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.parametrize("setup", [
    "",  # configured through the environment only: the first sampled call starts the worker
    "attnscope.configure(sample_rate=1.0)",  # configure() starts loading it in the background
    # configure() right before a fork-free program's first call, worker side still loading
    "attnscope.configure(sample_rate=1.0); import time; time.sleep(0.3)",
], ids=["env-only", "configure", "configure-then-setup"])
def test_first_sampled_call_imports_nothing_on_the_calling_thread(setup: str) -> None:
    result = _run(setup)
    assert result["during"] == [], f"the first sampled call imported {result['during']}"
    assert result["worker_side_by"] == ["attnscope-worker"]
    assert result["flushed"] is True
    assert result["captured"] == result["emitted"] == 1


def test_configure_imports_nothing_of_the_worker_side_on_the_calling_thread() -> None:
    result = _run(f"""
        _n = len(imports)
        attnscope.configure(sample_rate=1.0)
        _mine = [m for t, m in imports[_n:] if t == "MainThread" and m.startswith({_WORKER_SIDE!r})]
        assert not _mine, _mine
    """)
    assert result["captured"] == result["emitted"] == 1


def test_the_worker_runs_on_the_thread_configure_started() -> None:
    """One worker thread in all: the first worker takes the thread configure() started."""
    result = _run("""
        attnscope.configure(sample_rate=1.0)
        _spare = [t for t in threading.enumerate() if t.name == "attnscope-worker"]
        assert len(_spare) == 1, _spare
    """)
    assert result["worker_thread"] == ["attnscope-worker"]


_FORK_DURING_START = """
import os, sys, time
import torch
torch.set_num_threads(1)  # a child forked after OpenMP's pool ran would hang in torch, not here
import attnscope
attnscope.configure(sample_rate=1.0, warmup_calls=0, profile_rate=0.0, exporter="none")
@attnscope.trace
def attention(q):
    return torch.nn.functional.scaled_dot_product_attention(q, q, q)
q = torch.randn(1, 2, 16, 8)
pids = []
for i in range(4):  # while configure()'s thread imports, then while the first worker builds
    if i == 2:
        attention(q)
    pid = os.fork()
    if pid == 0:
        attention(q)
        ok = attnscope.flush(timeout_s=30) and attnscope.stats()["emitted"] == 1
        os._exit(0 if ok else 3)
    pids.append(pid)
deadline = time.monotonic() + 60
codes = []
for pid in pids:
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            codes.append(os.waitstatus_to_exitcode(status))
            break
        if time.monotonic() > deadline:
            codes.append("hung")
            os.kill(pid, 9)
            break
        time.sleep(0.05)
print(codes, attnscope.flush(timeout_s=30), attnscope.stats()["emitted"])
"""


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_fork_while_the_worker_side_loads_is_safe() -> None:
    """A child forked while configure()'s thread imports (or the first worker builds) neither
    hangs on a half-taken import lock nor loses its own spans; the parent's are all there."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ATTNSCOPE_"))}
    out = subprocess.run([sys.executable, "-c", _FORK_DURING_START], capture_output=True,
                         text=True, timeout=180, env=env, cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == "[0, 0, 0, 0] True 1", out.stdout + out.stderr
