"""README.md's copy-paste lines say what happens on a fresh machine (issue 38 §1)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _bash_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_the_two_lines_are_there_and_ci_runs_the_test_line_verbatim() -> None:
    blocks = _bash_blocks(README)
    demo = [b for b in blocks if b.endswith("attnscope demo")]
    tests = [b for b in blocks if b.endswith("python -m pytest -n auto --dist loadfile")]
    assert len(demo) == 1 and len(tests) == 1, blocks
    assert tests[0] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_torch_line_says_which_build_a_fresh_machine_gets() -> None:
    # a fresh machine gets the registry's build with ~3 GB of CUDA libraries, not a CPU wheel
    assert "picks the CPU wheel" not in README
    assert "https://download.pytorch.org/whl/cpu" in README
    assert "CUDA libraries" in README
