"""attnscope's overhead on a real model forward, default configuration, paired A/B.

A transformers Llama built from a config (no weights downloaded): 4 layers, hidden 256, 8 heads,
sequence 256, CPU. Two copies with the same weights — A plain, B instrumented with
`attnscope.instrument()` and the default sampling settings — run alternately; each pair gives one
B/A ratio. The table shows the median and mean ratio and a bootstrap 95% interval of the median.

Target (issue: production sampling): median overhead <= 0.5%.

Run: python benchmarks/bench_model.py [--pairs 300]
"""

from __future__ import annotations

import argparse
import copy
import platform
import random
import statistics
import time
from collections.abc import Sequence
from typing import Any

import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import attnscope


class Discard(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


def build_model() -> Any:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=1000, max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=256)
    args = parser.parse_args(argv)

    plain = build_model()
    traced = copy.deepcopy(plain)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard()))
    attnscope.configure(tracer_provider=provider)  # everything else: the defaults
    attnscope.instrument(traced)
    ids = torch.randint(0, 1000, (1, args.seq_len))

    def run(model: Any) -> int:
        t = time.perf_counter_ns()
        model(input_ids=ids)
        return time.perf_counter_ns() - t

    with torch.inference_mode():
        for _ in range(5):
            run(plain)
            run(traced)
        ratios, a_ns, b_ns = [], [], []
        for i in range(args.pairs):
            # alternate the order so drift and caches favour neither side
            if i % 2:
                a, b = run(plain), run(traced)
            else:
                b, a = run(traced), run(plain)
            a_ns.append(a)
            b_ns.append(b)
            ratios.append(b / a)
    attnscope.flush(timeout_s=10)
    stats = attnscope.stats()
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(1000))
    med = statistics.median(ratios)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, "
          f"pairs={args.pairs}, seq_len={args.seq_len}")
    print(f"{'':28} {'median':>10} {'mean':>10}")
    print(f"{'plain forward (ms)':28} {statistics.median(a_ns) / 1e6:10.3f} {statistics.mean(a_ns) / 1e6:10.3f}")
    print(f"{'instrumented forward (ms)':28} {statistics.median(b_ns) / 1e6:10.3f} "
          f"{statistics.mean(b_ns) / 1e6:10.3f}")
    print(f"{'paired ratio B/A':28} {med:10.4f} {statistics.mean(ratios):10.4f}")
    print(f"bootstrap 95% interval of the median ratio: [{boots[25]:.4f}, {boots[975]:.4f}]")
    print(f"overhead (median ratio - 1): {100 * (med - 1):+.2f}%   (target <= +0.5%)")
    print(f"attnscope: sampled={stats.get('sampled')} profiled={stats.get('profiled')} granted={stats.get('profile_granted')} "
          f"emitted={stats.get('emitted')} effective_rate={stats.get('effective_sample_rate'):.4f}")
    attnscope.shutdown()
    return {"median_ratio": med}


if __name__ == "__main__":
    main()
