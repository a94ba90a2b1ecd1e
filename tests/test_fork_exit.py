"""A forked child ends as it would without attnscope (issue 35 §1).

Once kineto has run a session, libkineto's exit-time join of a thread the child does not have
hangs a forked child that leaves through ``sys.exit`` (or aborts it). Each case runs in its own
interpreter, bounded: a hang is a failed test, not a stuck suite.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_TIMEOUT_S = 90

_SCRIPT = textwrap.dedent(
    """
    import ctypes, os, sys
    import torch
    VARIANT, OUT = sys.argv[1], sys.argv[2]
    import attnscope
    attnscope.trace  # the first use of a public name loads the library
    if VARIANT == "configure":
        attnscope.configure(exporter="none")
    elif VARIANT == "profile_rate_0_after_import":
        attnscope.configure(exporter="none", profile_rate=0.0)
    elif VARIANT in ("traced_calls", "child_traces"):
        attnscope.configure(exporter="none", sample_rate=1.0, warmup_calls=0,
                            overhead_budget=1.0, profile_rate=1.0)
        f = attnscope.trace(name="parent-work")(lambda x: x @ x)
        for _ in range(20):
            f(torch.ones(8, 8))
        assert attnscope.flush(timeout_s=30)
        assert attnscope.stats()["profiled"] > 0, attnscope.stats()
    sys.stdout.flush()
    pid = os.fork()
    if pid == 0:
        if VARIANT == "child_traces":
            attnscope.configure(exporter=f"otlp-json:{OUT}", sample_rate=1.0, warmup_calls=0,
                                overhead_budget=1.0)
            g = attnscope.trace(name="child-work")(lambda x: x + 1)
            for _ in range(5):
                g(torch.ones(2))
        libc = ctypes.CDLL(None)
        libc.printf(b"c-stdio-line\\n")  # buffered by C stdio (stdout is a pipe)
        print("python-line")
        sys.exit(7)
    _, status = os.waitpid(pid, 0)
    print("child-exit", os.waitstatus_to_exitcode(status))
    """
)

_VARIANTS = ["import_only", "configure", "profile_rate_0_after_import", "env_only",
             "traced_calls", "child_traces"]


@pytest.mark.parametrize("variant", _VARIANTS)
def test_a_forked_child_exits_with_its_status_and_output(variant: str, tmp_path: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # torch's own fork hazard, not ours
    env.pop("ATTNSCOPE_EXPORTER", None)
    if variant == "env_only":
        env.update(ATTNSCOPE_EXPORTER="none", ATTNSCOPE_SAMPLE_RATE="1")
    out = tmp_path / "child.jsonl"
    # its own session: a hung child (the grandchild here) is killed with the parent
    proc = subprocess.Popen([sys.executable, "-c", _SCRIPT, variant, str(out)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the forked child hung ({variant}): {stdout!r} {stderr!r}")
    assert proc.returncode == 0, stderr
    lines = stdout.splitlines()
    assert "child-exit 7" in lines, stdout + stderr
    assert "python-line" in lines and "c-stdio-line" in lines, stdout
    assert "Traceback" not in stderr and "terminate" not in stderr, stderr
    if variant == "child_traces":  # the child's own spans were exported at its exit
        spans = [s for line in out.read_text().splitlines()
                 for r in json.loads(line)["resourceSpans"]
                 for ss in r["scopeSpans"] for s in ss["spans"]]
        assert sum(s["name"] == "child-work" for s in spans) == 5
