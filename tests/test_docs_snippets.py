"""Every Python snippet of README.md and docs/quickstart.md runs as printed (issue 20 §7).

Each runs in a fresh interpreter, verbatim. What the docs leave to the reader (``model``,
``input_ids``, a checkpoint to load) is given by a prelude of stand-ins: a tiny Llama built from a
config (no download) and its input. ``torch`` and ``attnscope`` are not in the prelude: a snippet
that uses them imports them, or follows one on the same page that does (run first, as a reader
would)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = ("README.md", "docs/quickstart.md")

_PRELUDE = '''
import types as _types

def _tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    import torch as _torch
    _torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                        num_hidden_layers=1, num_attention_heads=2,
                                        num_key_value_heads=1, max_position_embeddings=64))

AutoModelForCausalLM = _types.SimpleNamespace(from_pretrained=lambda *a, **k: _tiny_llama())
'''
# After the snippet: every global name a function it defines would read must exist (a function
# body runs only when called, so "uses torch without importing it" shows nowhere else). A test_*
# function stands for the reader's own test, on the reader's own model.
_CHECK = '''
import builtins as _builtins, dis as _dis
def _globals_read(code):
    for ins in _dis.get_instructions(code):
        if ins.opname == "LOAD_GLOBAL":
            yield ins.argval
    for const in code.co_consts:
        if hasattr(const, "co_code") and not const.co_name.startswith("test_"):
            yield from _globals_read(const)
_missing = sorted({n for n in _globals_read(compile(_SNIPPET, "<snippet>", "exec"))
                   if n not in globals() and not hasattr(_builtins, n)})
assert not _missing, f"the snippet's functions read undefined names: {_missing}"
'''
_STAND_INS = {
    "model": "model = _tiny_llama()\n",
    "input_ids": "import torch as _t; input_ids = _t.randint(0, 64, (1, 8))\n",
}


def _snippets(page: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", (ROOT / page).read_text(), flags=re.S)


def _cases() -> list[tuple[str, int]]:
    return [(page, i) for page in PAGES for i in range(len(_snippets(page)))]


def test_the_pages_have_snippets() -> None:
    assert all(_snippets(page) for page in PAGES)


@pytest.mark.parametrize("page,index", _cases(), ids=lambda v: str(v).replace("/", "_"))
def test_snippet_runs_verbatim(page: str, index: int, tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    snippets = _snippets(page)
    code = snippets[index]
    earlier = "".join(s for s in snippets[:index] if re.search(r"^import ", s, flags=re.M)
                      and "def test_" not in s)
    needs = "".join(v for name, v in _STAND_INS.items()
                    if re.search(rf"\b{name}\b", code) and not re.search(rf"^{name} =", code,
                                                                        flags=re.M))
    imports = "".join(line + "\n" for line in earlier.splitlines()
                      if line.startswith(("import ", "from ")))
    program = _PRELUDE + imports + needs + code + f"\n_SNIPPET = {code!r}\n" + _CHECK
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ATTNSCOPE_", "OTEL_"))}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          timeout=180, env=env, cwd=tmp_path, check=False)
    assert done.returncode == 0, f"{page} snippet {index + 1}:\n{code}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
