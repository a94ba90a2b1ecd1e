"""OTLP request encoding per span: the OpenTelemetry SDK's encoder and attnscope's, side by side.

The spans are attnscope's own: a tiny Llama's ``generate()`` (4 layers, 32 new tokens from a
16-token prompt, every attention call traced), kept by an in-memory exporter. Each round encodes
the same batches (512 spans, the batch processor's default export batch) with each encoder in
turn, the order swapped every round, and serializes the request, as an exporter does: the SDK's
``encode_spans(spans).SerializePartialToString()``, and attnscope's ``encode_request(spans)``
(its bytes parsed into the same message) serialized the same way. Thread CPU per span, median of
the rounds; the two requests are checked equal first.

This is the export thread's work: done while holding the GIL, so with every call traced it is
time the application's threads wait for (``bench_model.py --exporter otlp-http`` shows it there).

Run: python benchmarks/bench_encode.py [--rounds 15]
"""

from __future__ import annotations

import argparse
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

import attnscope
from attnscope._export import otlp_exporters

sys.path.insert(0, str(Path(__file__).parent))
from bench_model import build_model  # noqa: E402

BATCH = 512


class Keep(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[Any] = []

    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


def spans_of_generate(calls: int) -> list[Any]:
    keep = Keep()
    attnscope.configure(exporter=keep, sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                        profile_rate=0.0, metrics=False, queue_size=1 << 16)
    model = build_model()
    attnscope.instrument(model)
    ids = torch.randint(0, 1000, (1, 16))
    with torch.inference_mode():
        while len(keep.spans) < calls:
            model.generate(ids, max_new_tokens=32, min_new_tokens=32, do_sample=False,
                           pad_token_id=0)
            attnscope.flush(timeout_s=10)
    attnscope.shutdown()
    return keep.spans[:calls]


def timed(encode: Callable[[Sequence[Any]], bytes], batches: list[list[Any]]) -> float:
    """Thread CPU per span, µs."""
    t = time.thread_time_ns()
    for batch in batches:
        encode(batch)
    return (time.thread_time_ns() - t) / sum(map(len, batches)) / 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--batches", type=int, default=4, help="batches of 512 spans a round")
    args = parser.parse_args(argv)
    spans = spans_of_generate(BATCH * args.batches)
    batches = [spans[i:i + BATCH] for i in range(0, len(spans), BATCH)]

    def sdk(batch: Sequence[Any]) -> bytes:
        return bytes(encode_spans(batch).SerializePartialToString())

    def ours(batch: Sequence[Any]) -> bytes:
        return bytes(otlp_exporters.encode_request(batch).SerializePartialToString())

    assert otlp_exporters.encoder() is not None, "attnscope's encoder is not in use here"
    assert all(sdk(b) == ours(b) for b in batches), "the two encoders' requests differ"
    times: dict[str, list[float]] = {"sdk": [], "attnscope": []}
    for r in range(args.rounds):
        order = (("sdk", sdk), ("attnscope", ours)) if r % 2 else (("attnscope", ours),
                                                                   ("sdk", sdk))
        for name, encode in order:
            times[name].append(timed(encode, batches))
    sdk_us, ours_us = statistics.median(times["sdk"]), statistics.median(times["attnscope"])
    attrs = statistics.median(len(s.attributes) for s in spans)
    size = statistics.mean(len(sdk(b)) for b in batches) / BATCH
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, torch "
          f"{torch.__version__}, {len(spans)} spans ({attrs:.0f} attributes, {size:.0f} bytes "
          f"each on the wire), {args.rounds} rounds")
    print(f"{'encoder':12} {'µs a span':>10} {'fastest':>10}")
    print(f"{'SDK':12} {sdk_us:10.1f} {min(times['sdk']):10.1f}")
    print(f"{'attnscope':12} {ours_us:10.1f} {min(times['attnscope']):10.1f}")
    print(f"attnscope / SDK: {ours_us / sdk_us:.3f}; a batch of {BATCH} spans takes "
          f"{sdk_us * BATCH / 1e3:.1f} ms (SDK) / {ours_us * BATCH / 1e3:.1f} ms (attnscope) of "
          "the export thread's CPU, mostly holding the GIL")


if __name__ == "__main__":
    main()
