"""attnscope's overhead on a real model forward, default configuration, paired A/B.

A transformers Llama built from a config (no weights downloaded): 4 layers, hidden 256, 8 heads,
sequence 256, CPU. Two copies with the same weights — A plain, B instrumented with
`attnscope.instrument()` and the default sampling settings — run alternately; each pair gives one
B/A ratio. The table shows the median and mean ratio and a bootstrap 95% interval of the median.

Target (issue: production sampling): median overhead <= 0.5%.

``--generate 32 --every-call``: the debugging-session case instead — ``generate()`` of 32 new
tokens from a 16-token prompt with every attention call traced (sample rate 1, no warm-up, no
overhead budget, no profile tier). Target: median ratio <= 1.10. ``--calling-thread-only`` drops
captures at the hand-off, so the ratio shows the calling thread's own cost without the worker's.

Run: python benchmarks/bench_model.py [--pairs 300]
     python benchmarks/bench_model.py --generate 32 --every-call --pairs 80
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

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                      num_attention_heads=8, num_key_value_heads=4, vocab_size=1000,
                      max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).eval()


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=256,
                        help="prompt length (16 with --generate)")
    parser.add_argument("--generate", type=int, default=0, help="new tokens per generate() call")
    parser.add_argument("--every-call", action="store_true", help="trace every attention call")
    parser.add_argument("--calling-thread-only", action="store_true",
                        help="drop captures at the hand-off (no worker work)")
    parser.add_argument("--app-provider", action="store_true",
                        help="give attnscope the application's TracerProvider "
                             "instead of an exporter")
    args = parser.parse_args(argv)

    plain = build_model()
    traced = copy.deepcopy(plain)
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 16))
    # The usual set-up: attnscope's own provider and exporter; or the application's provider.
    destination: dict[str, Any] = (
        {"tracer_provider": provider} if args.app_provider else {"exporter": Discard()})
    if args.every_call:
        attnscope.configure(sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                            profile_rate=0.0, metrics=False, queue_size=1 << 16, **destination)
    else:
        attnscope.configure(**destination)  # everything else: the defaults
    if args.calling_thread_only:
        from attnscope import _state

        _state.submit = lambda cap: True  # type: ignore[assignment]
    attnscope.instrument(traced)
    seq_len = 16 if args.generate and args.seq_len == 256 else args.seq_len
    ids = torch.randint(0, 1000, (1, seq_len))

    def run(model: Any) -> int:
        t = time.perf_counter_ns()
        if args.generate:
            model.generate(ids, max_new_tokens=args.generate, min_new_tokens=args.generate,
                           do_sample=False, pad_token_id=0)
        else:
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
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, "
          f"pairs={args.pairs}, seq_len={seq_len}, generate={args.generate}, "
          f"every_call={args.every_call}, calling_thread_only={args.calling_thread_only}")
    print(f"{'':28} {'median':>10} {'mean':>10}")
    what = "generate" if args.generate else "forward"
    print(f"{'plain ' + what + ' (ms)':28} {statistics.median(a_ns) / 1e6:10.3f} "
          f"{statistics.mean(a_ns) / 1e6:10.3f}")
    print(f"{'instrumented ' + what + ' (ms)':28} {statistics.median(b_ns) / 1e6:10.3f} "
          f"{statistics.mean(b_ns) / 1e6:10.3f}")
    print(f"{'paired ratio B/A':28} {med:10.4f} {statistics.mean(ratios):10.4f}")
    print(f"bootstrap 95% interval of the median ratio: [{boots[25]:.4f}, {boots[975]:.4f}]")
    target = "ratio <= 1.10" if args.every_call else "overhead <= +0.5%"
    print(f"overhead (median ratio - 1): {100 * (med - 1):+.2f}%   (target: {target})")
    print(f"attnscope: sampled={stats.get('sampled')} profiled={stats.get('profiled')} "
          f"granted={stats.get('profile_granted')} "
          f"emitted={stats.get('emitted')} effective_rate={stats.get('effective_sample_rate'):.4f}")
    attnscope.shutdown()
    return {"median_ratio": med}


if __name__ == "__main__":
    main()
