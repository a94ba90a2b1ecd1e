"""Trace the attention blocks of a small PyTorch model (nn.Module.forward with hidden states).

Run: python examples/trace_model_blocks.py
"""

import torch
import torch.nn.functional as F

import attnscope


class SelfAttention(torch.nn.Module):
    def __init__(self, hidden: int = 256, num_heads: int = 8) -> None:
        super().__init__()
        self.num_heads = num_heads  # attnscope reads head counts from the module
        self.is_causal = True
        self.qkv = torch.nn.Linear(hidden, 3 * hidden)
        self.out = torch.nn.Linear(hidden, hidden)

    @attnscope.trace
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, s, h = hidden_states.shape
        q, k, v = self.qkv(hidden_states).view(b, s, 3, self.num_heads, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(y.transpose(1, 2).reshape(b, s, h))


def main() -> None:
    attnscope.configure(exporter="console", sample_rate=0.5, warmup_calls=2)
    model = torch.nn.Sequential(*[SelfAttention() for _ in range(4)]).eval()
    x = torch.randn(2, 64, 256)
    with torch.inference_mode():
        for step in range(5):
            with attnscope.step(step):  # same steps sampled on every rank of a job
                model(x)
    print(attnscope.stats())
    attnscope.shutdown()


if __name__ == "__main__":
    main()
