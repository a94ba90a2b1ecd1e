"""One line for a real model: trace every attention layer of a transformers model.

Builds a tiny Llama from a config (no download), instruments it, runs a padded batch through
generate() and prints one line per span: the generate() call, each model forward (prefill, then
decode steps) and each attention layer, with tokens, KV length and FLOPs.

Run: python examples/instrument_transformers.py      (needs: pip install 'attnscope[transformers]')
"""

import torch
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from transformers import LlamaConfig, LlamaForCausalLM

import attnscope


def main() -> None:
    spans = InMemorySpanExporter()  # or exporter="otlp" / "jaeger-json:trace.json"
    # Every call, no overhead budget: right for a demo; production keeps the defaults.
    attnscope.configure(
        exporter=spans, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0, profile_rate=0.0
    )

    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        attn_implementation="sdpa",
        pad_token_id=0,
        eos_token_id=None,
        bos_token_id=None,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()

    attnscope.instrument(model, trace_model=True)  # <- the one line

    input_ids = torch.tensor([[5, 6, 7, 8, 9, 10], [0, 0, 0, 7, 8, 9]])  # left-padded batch
    attention_mask = (input_ids != 0).long()
    model.generate(
        input_ids,
        attention_mask=attention_mask,
        max_new_tokens=8,
        min_new_tokens=8,
        do_sample=False,
        pad_token_id=0,
    )
    attnscope.flush()

    print(f"{'span':34} {'phase':8} {'tokens':>6} {'Sq':>3} {'Skv':>4} {'FLOPs':>8}  usage")
    for span in sorted(spans.get_finished_spans(), key=lambda s: (s.start_time, len(s.name))):
        a = span.attributes or {}
        usage = {k.rsplit(".", 1)[-1]: v for k, v in a.items() if k.startswith("gen_ai.usage.")}
        print(
            f"{span.name:34} {a.get('attnscope.phase', ''):8} {a.get('attnscope.tokens', ''):>6} "
            f"{a.get('attnscope.seq_len_q', ''):>3} {a.get('attnscope.seq_len_kv', ''):>4} "
            f"{a.get('attnscope.flops', ''):>8}  {usage or ''}"
        )

    attnscope.uninstrument(model)  # forwards, hooks and weights exactly as before
    attnscope.shutdown()


if __name__ == "__main__":
    main()
