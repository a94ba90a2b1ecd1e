"""No request pays attnscope's set-up (issue 37 goal 1): ``configure()`` returns once its thread
has imported the worker side, so a first request made right after it does not share the GIL with
100 ms and more of imports. The import still runs on attnscope's thread, never the caller's
(tests/test_first_call.py). Each case is a fresh interpreter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_CHILD = textwrap.dedent("""
    import json, sys, threading, time
    importers = {}
    class Recorder:
        def find_spec(self, name, path=None, target=None):
            importers.setdefault(name, threading.current_thread().name)
            return None
    sys.meta_path.insert(0, Recorder())
    import attnscope
    t = time.perf_counter()
    attnscope.configure(exporter="none")
    took = time.perf_counter() - t
    engine = sys.modules.get("attnscope.worker.engine")
    print(json.dumps({"loaded": engine is not None and hasattr(engine, "Engine"),
                      "by": importers.get("attnscope.worker.engine"),
                      "sdk_by": importers.get("opentelemetry.sdk.trace"),
                      "took_s": took}))
""")


def _run() -> dict[str, object]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ATTNSCOPE_"))}
    out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True, text=True,
                         timeout=180, env=dict(env, OMP_NUM_THREADS="1"), cwd=ROOT, check=False)
    assert out.returncode == 0, out.stderr[-2000:]
    result: dict[str, object] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_configure_returns_with_the_worker_side_imported_on_its_own_thread() -> None:
    result = _run()
    assert result["loaded"] is True, result  # before: still importing when configure() returned
    assert result["by"] == "attnscope-worker", result
    assert result["sdk_by"] in ("attnscope-worker", None), result  # never the caller's thread
