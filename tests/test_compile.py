"""torch.compile over traced code: no crash, no recompiles; compiled calls pass through."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import json, sys
    import torch
    if sys.argv[1] == "dynamo-first":
        import torch._dynamo  # the program imported Dynamo before attnscope decorated anything
    import attnscope
    from attnscope.testing import capture_spans

    @attnscope.trace
    def attention(q):
        return torch.softmax(q @ q.transpose(-1, -2), -1) @ q

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(8, 8)

        @attnscope.trace
        def attn(self, x):
            return attention(x)

        def forward(self, x):
            return self.attn(self.proj(x))

    block = Block()
    x = torch.randn(4, 8)
    with capture_spans() as spans:
        eager = block(x)
        compiled = torch.compile(block, fullgraph=True)
        for _ in range(20):
            out = compiled(x)
        block(x)
    from torch._dynamo.utils import counters
    print(json.dumps({
        "graphs": counters["stats"]["unique_graphs"],
        "unimplemented": len(counters["unimplemented"]),
        "close": bool(torch.allclose(out, eager)),
        "spans": sorted(s.name.rsplit(".", 1)[-1] for s in spans),
    }))
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("order", ["attnscope-first", "dynamo-first"])
def test_compiled_traced_methods_and_functions(order: str) -> None:
    done = subprocess.run([sys.executable, "-c", SCRIPT, order], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["graphs"] == 1 and result["unimplemented"] == 0, result
    assert result["close"]
    # Two eager forwards are traced (method + nested function each); compiled calls pass through.
    assert result["spans"] == ["attention", "attention", "attn", "attn"]


def test_a_function_traced_after_dynamo_loaded_compiles_without_recompiles() -> None:
    import torch
    import torch._dynamo

    import attnscope

    traced = attnscope.trace(name="late")(lambda x: x * 2)

    def model(x: torch.Tensor) -> torch.Tensor:
        return traced(x) + 1

    torch._dynamo.reset()
    counts: list[int] = []
    compiled = torch.compile(model, backend=lambda gm, inputs: (counts.append(1), gm)[1],
                             fullgraph=True)
    x = torch.ones(3)
    for _ in range(5):
        assert torch.equal(compiled(x), x * 2 + 1)
    assert len(counts) == 1
