"""The examples run as shipped (the README and docs point newcomers at them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.mark.parametrize(
    "script,expect,stream",
    [
        # the console exporter writes spans to stderr, never the program's stdout
        ("trace_attention.py", '"name": "my_attention"', "stderr"),
        ("trace_model_blocks.py", "'sampled':", "stdout"),
        ("instrument_transformers.py", "decode", "stdout"),
    ],
)
def test_example_runs(script: str, expect: str, stream: str) -> None:
    pytest.importorskip("transformers") if script.startswith("instrument") else None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    done = subprocess.run([sys.executable, str(EXAMPLES / script)], capture_output=True, text=True,
                          timeout=300, env=env, cwd=EXAMPLES.parent)
    assert done.returncode == 0, done.stderr[-2000:]
    assert expect in getattr(done, stream)
