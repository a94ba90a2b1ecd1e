"""Every span attribute of a fixed set of runs is what tests/golden/span_attributes.json says.

``scripts/span_dump.py`` runs the scenarios (trace, span, step, batch, generate, the profile tier,
instrument on the CI model slice) in fresh processes against this tree and writes what each span
carries, its measured figures normalised; the golden was made from the code before issue 39's
redesign, so a difference is a change of behaviour. Regenerate it (only for a change meant to
alter spans) with the command in the script's docstring.
"""

from __future__ import annotations

import difflib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from .support.helpers import load_script

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "span_dump.py"
GOLDEN = ROOT / "tests" / "golden" / "span_attributes.json"


def _script() -> Any:
    return load_script(SCRIPT, "span_dump")


def test_measured_figures_are_normalised_and_the_rest_kept() -> None:
    dump = _script()
    assert dump.normalised("attnscope.summary",
                           "12.3 µs wall · 4.61 kFLOP · 1.2 GFLOP/s · eager · decode 1 tok · "
                           "q[2,4,1,8] k[2,2,9,8] fp32 · RSS 417 MiB") == (
        "# s wall · # FLOP · # FLOP/s · eager · decode # tok · q[#,#,#,#] k[#,#,#,#] fp32 · "
        "RSS # B")
    assert dump.normalised("attnscope.summary", "850 ns wall") == \
        dump.normalised("attnscope.summary", "1.02 s wall")
    for key in ("attnscope.wall_ns", "attnscope.tflops", "attnscope.memory.host_rss_bytes",
                "attnscope.roofline.fraction", "process.pid", "host.name"):
        assert dump.normalised(key, 12) == "#"
    assert dump.normalised("attnscope.kernel.top_ns", (3, 2)) == ["#", "#"]
    for key, value in (("attnscope.flops", 9216), ("attnscope.kernel.input_shapes", "[2,8]"),
                       ("attnscope.backend", "flash"), ("attnscope.kernel.count", 19),
                       ("attnscope.arithmetic_intensity", 1.6)):
        assert dump.normalised(key, value) == value


def test_the_model_slice_is_the_sweeps() -> None:
    pytest.importorskip("transformers")
    from tests.test_arch_sweep import NAMED

    dump = _script()
    assert [(t, c, k) for t, c, k in dump.SLICE] == \
        [(c.model_type, c.class_name, c.kind) for c in NAMED if not c.features]


def _diff(want: dict[str, Any], got: dict[str, Any], limit: int = 300) -> str:
    """Per scenario, a unified diff of the two dumps' JSON (at most ``limit`` lines)."""
    lines: list[str] = []
    for name in sorted(set(want["scenarios"]) | set(got["scenarios"])):
        a = json.dumps(want["scenarios"].get(name), indent=1, sort_keys=True,
                       ensure_ascii=False).splitlines()
        b = json.dumps(got["scenarios"].get(name), indent=1, sort_keys=True,
                       ensure_ascii=False).splitlines()
        lines += difflib.unified_diff(a, b, f"golden {name}", f"this tree {name}", n=6,
                                      lineterm="")
    cut = len(lines) - limit
    return "\n".join(lines[:limit]) + (f"\n... {cut} more lines" if cut > 0 else "")


@pytest.mark.slow
def test_every_span_attribute_is_as_the_golden_says(tmp_path: Path) -> None:
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    dump = _script()
    if dump.versions() != want["versions"]:  # other releases run other ops and models
        pytest.skip(f"the golden was made with {want['versions']}, this is {dump.versions()}")
    out = tmp_path / "spans.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], env=env,
                          capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(out.read_text(encoding="utf-8"))
    assert got == want, "spans differ from tests/golden/span_attributes.json:\n" + \
        _diff(want, got)
