"""attnscope's overhead on a real model forward, default configuration, paired A/B.

A transformers Llama built from a config (no weights downloaded): 4 layers, hidden 256, 8 heads,
sequence 256, CPU. Two copies with the same weights — A plain, B instrumented with
`attnscope.instrument()` and the default sampling settings — run alternately; each pair gives one
B/A ratio. The table shows the median and mean ratio and a bootstrap 95% interval of the median.

Target (issue: production sampling): median overhead <= 0.5%.

``--generate 32 --every-call``: the debugging-session case instead — ``generate()`` of 32 new
tokens from a 16-token prompt with every attention call traced (sample rate 1, no warm-up, no
overhead budget, no profile tier). Target: median ratio <= 1.10. ``--metrics on`` records the
span metrics too (an in-memory meter provider; off by default there), so the table can hold both.
``--calling-thread-only`` drops captures at the hand-off, so the ratio shows the calling thread's
own cost without the worker's; ``--no-spans`` lets the worker take each capture as usual and build
nothing from it (its wake-ups, queue and GIL hand-overs without the span work: what the ratio
would be if building a span were free). Each run also prints where attnscope's time went: the
calling thread's CPU time per traced call (instrumented minus plain, medians of the pairs) and the
worker thread's CPU time per capture it finished, over the timed pairs (on 2 cores the worker's
time is mostly time the application waits for: it holds the GIL while it builds spans).

``--padded``: the batch left-padded (row i starts with i * prompt / (2 * batch) pad tokens, with
an attention mask; a batch of 4 unless ``--batch`` says otherwise), as a batched server's is:
every attention call then carries a mask, which a sampled call's span reads. Each run prints the
realised sample rate over the timed pairs (sampled attention calls / attention calls, counted by
hooks on the plain copy's attention modules in an untimed run) next to the configured and the
effective rate: with the defaults, the overhead budget must not thin the sample on a padded batch.

``--busy-thread``: a second Python thread runs all along, holding the GIL a fifth of the time in
~100 µs slices (a server's request parsing, tokenizer, metrics; one that never slept stalled
plain ``generate()`` itself for seconds, the GIL's convoy, which no overhead compares with).
The run prints for how much of the timed pairs the overhead budget kept the sample rate's scale,
and the profile rate's, below 1: waits for the GIL inside attnscope's own steps count as its
cost, and must not thin the sample.

``--breakdown RUNS``: after the timed pairs, RUNS more instrumented runs with each step of the
calling thread's path timed in place (``enter``, the decision, ``_open``, the layer's extractor,
the allocator readings, the CUDA event pair, ``leave``, the device-side counts and host copy, the
hand-over): where a traced call's time goes there, on CPU or CUDA (issue 37 goal 4).

``--model issue37 --device cuda``: issue 37's GPU model instead — 16 layers, hidden 2048, 16 heads /
8 KV heads, bf16, SDPA, a batch of 8 with a 128-token prompt, 32 new tokens (``--generate 32`` is
implied). Each timed call ends with ``torch.cuda.synchronize()``. Without CUDA it stops with a
message saying so (``--device cpu`` runs the same model on the CPU, in float32 unless
``--dtype`` says otherwise: slow, for checking the script).

Run: python benchmarks/bench_model.py [--pairs 300]
     python benchmarks/bench_model.py --generate 32 --every-call --pairs 80 [--metrics on]
     python benchmarks/bench_model.py --generate 32 --padded --pairs 300 [--every-call]
     python benchmarks/bench_model.py --model issue37 --device cuda --every-call --pairs 30
     python benchmarks/bench_model.py --generate 32 --every-call --pairs 20 --breakdown 10
"""

from __future__ import annotations

import argparse
import copy
import os
import platform
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

import attnscope


class Discard(SpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_MIN_CALLS_A_RUN = 20  # sampled calls a run below which the calling thread's share is not shown

# (layers, hidden, intermediate, heads, KV heads, vocab): the CPU default, and issue 37's GPU model
# (its intermediate size and vocabulary are not given there: a Llama 3.2 1B's MLP, a 32k vocab)
MODELS = {"tiny": (4, 256, 512, 8, 4, 1000), "issue37": (16, 2048, 8192, 16, 8, 32000)}
VOCAB = {name: spec[5] for name, spec in MODELS.items()}


def build_model(name: str = "tiny", device: str = "cpu", dtype: Any = None) -> Any:
    """A Llama from a config (random weights, nothing downloaded), SDPA attention, in eval mode."""
    from transformers import LlamaConfig, LlamaForCausalLM

    layers, hidden, inter, heads, kv, vocab = MODELS[name]
    cfg = LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=kv, vocab_size=vocab,
                      max_position_embeddings=512)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    if dtype is not None:
        model = model.to(dtype)
    return model.to(device)


class Busy:
    """A Python thread holding the GIL a fifth of the time (``--busy-thread``), which also
    watches the overhead budget's two scales every ~10 ms of its own clock while
    :meth:`measure` is on."""

    def __init__(self) -> None:
        from attnscope._runtime import runtime

        self._sampler = runtime.sampler
        self._measuring = False
        self._done = threading.Event()
        self.watched = self.below = self.profile_below = 0.0
        self.lowest = 1.0
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def measure(self) -> None:
        self._measuring = True

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def share_below(self, profile: bool = False) -> float:
        return (self.profile_below if profile else self.below) / max(self.watched, 1e-9)

    def _spin(self) -> None:
        last = time.perf_counter()
        while not self._done.is_set():
            sum(i * i for i in range(2_000))  # pure Python: holds the GIL (~100 µs)
            time.sleep(0.0004)  # a fifth of the time: a thread that never slept stalled plain
            # generate() itself for seconds (the GIL's convoy), which no overhead compares with
            now = time.perf_counter()
            if now - last < 0.01:
                continue
            if self._measuring:
                budget = self._sampler.budget
                self.watched += now - last
                self.below += (now - last) * (budget.scale < 1.0)
                self.profile_below += (now - last) * (budget.profile_scale < 1.0)
                self.lowest = min(self.lowest, budget.scale)
            last = now


def left_padded(ids: Any) -> Any:
    """An attention mask leaving row i's first i * prompt / (2 * batch) tokens out (pad id 0)."""
    batch, length = ids.shape
    mask = torch.ones_like(ids)
    for row in range(batch):
        pad = row * length // (2 * batch)
        mask[row, :pad] = 0
        ids[row, :pad] = 0
    return mask


def attention_calls(model: Any, run: Any) -> int:
    """The attention modules' calls in one ``run()`` of the plain model, counted by hooks that
    are removed before the timed pairs."""
    count = [0]

    def seen(*_: Any) -> None:
        count[0] += 1

    hooks = [m.register_forward_pre_hook(seen) for m in model.modules()
             if type(m).__name__.endswith("Attention")]
    try:
        run()
    finally:
        for hook in hooks:
            hook.remove()
    return count[0]


def check_device(device: str) -> None:
    """Stop with a clear message when ``device`` is CUDA and this torch has none."""
    if device == "cuda" and not torch.cuda.is_available():
        raise SystemExit(f"--device cuda: CUDA is not available to this torch ({torch.__version__}"
                         f", built for CUDA {torch.version.cuda or 'no'}); run it on a GPU machine "
                         f"or use --device cpu")


def main(argv: list[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=300)
    parser.add_argument("--seq-len", type=int, default=256,
                        help="prompt length (16 with --generate)")
    parser.add_argument("--generate", type=int, default=0, help="new tokens per generate() call")
    parser.add_argument("--every-call", action="store_true", help="trace every attention call")
    parser.add_argument("--calling-thread-only", action="store_true",
                        help="drop captures at the hand-off (no worker work)")
    parser.add_argument("--no-spans", action="store_true",
                        help="the worker takes each capture and builds no span from it")
    parser.add_argument("--app-provider", action="store_true",
                        help="give attnscope the application's TracerProvider "
                             "instead of an exporter")
    parser.add_argument("--metrics", choices=("on", "off"), default=None,
                        help="span metrics to an in-memory meter provider (default: off with "
                             "--every-call, the configured default otherwise)")
    parser.add_argument("--exporter", choices=("discard", "otlp-http", "otlp-grpc",
                                               "jaeger-json", "otlp-json"),
                        default="discard",
                        help="where spans go: a discarding exporter (default), attnscope's "
                             "OTLP exporter to a local receiver that discards them "
                             "(benchmarks/otlp_sink.py, its own process), or one of its file "
                             "exporters to a temporary directory: encoding and writing counted")
    parser.add_argument("--sdk-encoding", action="store_true",
                        help="with an OTLP exporter: requests encoded by the OpenTelemetry SDK's "
                             "encoder instead of attnscope's; with otlp-json, lines made the "
                             "reference way (the SDK's encoder, protobuf's JSON mapping)")
    parser.add_argument("--model", choices=tuple(MODELS), default="tiny")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="default: bfloat16 for --model issue37 on CUDA, else float32")
    parser.add_argument("--batch", type=int, default=None,
                        help="prompts per call (default 1; 8 for --model issue37; 4 --padded)")
    parser.add_argument("--breakdown", type=int, default=0, metavar="RUNS",
                        help="after the timed pairs, RUNS more instrumented runs with each step "
                             "of the calling thread's path timed in place (medians per step)")
    parser.add_argument("--busy-thread", action="store_true",
                        help="a second Python thread busy all along (a server's request parsing, "
                             "tokenizer, metrics): it holds the GIL between the model's calls; "
                             "prints the time-weighted share of the run the overhead budget's "
                             "sample-rate scale was below 1")
    parser.add_argument("--padded", action="store_true",
                        help="left-pad the batch as a batched server does: row i starts with "
                             "i * prompt / (2 * batch) pad tokens, masked out by an attention "
                             "mask, so every attention call carries a mask")
    args = parser.parse_args(argv)
    check_device(args.device)
    issue = args.model == "issue37"
    if issue and not args.generate:
        args.generate = 32
    dtype_name = args.dtype or ("bfloat16" if issue and args.device == "cuda" else "float32")
    batch = args.batch or (8 if issue else 4 if args.padded else 1)
    if args.padded and batch < 2:
        parser.error("--padded needs a batch of 2 or more")

    plain = build_model(args.model, args.device, getattr(torch, dtype_name))
    traced = copy.deepcopy(plain)
    provider = TracerProvider()
    if args.app_provider:  # else its idle export thread would be the one _export_cpu reads
        provider.add_span_processor(BatchSpanProcessor(Discard(), max_queue_size=1 << 16))
    # The usual set-up: attnscope's own provider and exporter; or the application's provider.
    sink = _start_sink(args) if args.exporter.startswith("otlp-") and \
        args.exporter != "otlp-json" else None
    if args.sdk_encoding:
        from attnscope._export import otlp_exporters, otlp_json

        otlp_exporters.encoder = lambda: None  # type: ignore[assignment]
        otlp_json._fast = lambda: None  # type: ignore[assignment]
    files = tempfile.TemporaryDirectory(prefix="bench_model.")
    exporter: Any = args.exporter if sink is not None else Discard()
    if args.exporter.endswith("-json"):
        exporter = f"{args.exporter}:{files.name}/spans.json"
    destination: dict[str, Any] = (
        {"tracer_provider": provider} if args.app_provider else {"exporter": exporter})
    if args.metrics is not None:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        destination["metrics"] = args.metrics == "on"
        if args.metrics == "on":
            destination["meter_provider"] = MeterProvider(metric_readers=[InMemoryMetricReader()])
    if args.every_call:
        destination.setdefault("metrics", False)
        attnscope.configure(sample_rate=1.0, warmup_calls=0, overhead_budget=1.0,
                            profile_rate=0.0, queue_size=1 << 16, **destination)
    else:
        attnscope.configure(**destination)  # everything else: the defaults
    if args.no_spans:
        from attnscope._worker.engine import Engine

        Engine.finish = lambda self, cap, *_: cap.expand()  # type: ignore[method-assign]
    if args.calling_thread_only:
        from attnscope._runtime import runtime

        runtime.worker.submit = lambda cap: True  # type: ignore[method-assign]
    attnscope.instrument(traced)
    if args.seq_len != 256:
        seq_len = args.seq_len
    else:
        seq_len = 128 if issue else 16 if args.generate else 256
    ids = torch.randint(1, VOCAB[args.model], (batch, seq_len), device=args.device)
    inputs: dict[str, Any] = {"input_ids": ids}
    if args.padded:
        inputs["attention_mask"] = left_padded(ids)
    sync = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    cpu_ns: dict[Any, list[int]] = {plain: [], traced: []}

    def run(model: Any) -> int:
        sync()
        t, cpu = time.perf_counter_ns(), time.thread_time_ns()
        if args.generate:
            model.generate(**inputs, max_new_tokens=args.generate, min_new_tokens=args.generate,
                           do_sample=False, pad_token_id=0)
        else:
            model(**inputs)
        sync()
        cpu_ns[model].append(time.thread_time_ns() - cpu)
        return time.perf_counter_ns() - t

    busy = Busy() if args.busy_thread else None
    with torch.inference_mode():
        for _ in range(5):
            run(plain)
            run(traced)
        calls_per_run = attention_calls(plain, lambda: run(plain))
        attnscope.flush(timeout_s=10)
        for times in cpu_ns.values():
            times.clear()
        worker_before, sampled_before = _worker_cpu(), attnscope.stats().get("sampled") or 0
        export_before, exported_before = _export_cpu(), attnscope.stats().get("exported") or 0
        ratios, a_ns, b_ns = [], [], []
        if busy is not None:
            busy.measure()
        for i in range(args.pairs):
            # alternate the order so drift and caches favour neither side
            if i % 2:
                a, b = run(plain), run(traced)
            else:
                b, a = run(traced), run(plain)
            a_ns.append(a)
            b_ns.append(b)
            ratios.append(b / a)
    if busy is not None:
        busy.stop()
    attnscope.flush(timeout_s=10)
    worker_after, export_after = _worker_cpu(), _export_cpu()
    stats = attnscope.stats()
    rng = random.Random(0)
    boots = sorted(statistics.median(rng.choices(ratios, k=len(ratios))) for _ in range(1000))
    med = statistics.median(ratios)
    print(f"machine: {platform.machine()}, Python {platform.python_version()}, "
          f"torch {torch.__version__}, "
          f"pairs={args.pairs}, model={args.model} ({dtype_name}, batch {batch}) on "
          f"{args.device}, seq_len={seq_len}, generate={args.generate}, "
          f"every_call={args.every_call}, metrics={args.metrics or 'default'}, "
          f"calling_thread_only={args.calling_thread_only}, no_spans={args.no_spans}, "
          f"exporter={args.exporter}"
          f"{' (the SDK encoding)' if args.sdk_encoding else ''}")
    print(f"{'':28} {'median':>10} {'mean':>10}")
    what = "generate" if args.generate else "forward"
    print(f"{'plain ' + what + ' (ms)':28} {statistics.median(a_ns) / 1e6:10.3f} "
          f"{statistics.mean(a_ns) / 1e6:10.3f}")
    print(f"{'instrumented ' + what + ' (ms)':28} {statistics.median(b_ns) / 1e6:10.3f} "
          f"{statistics.mean(b_ns) / 1e6:10.3f}")
    print(f"{'paired ratio B/A':28} {med:10.4f} {statistics.mean(ratios):10.4f}")
    print(f"bootstrap 95% interval of the median ratio: [{boots[25]:.4f}, {boots[975]:.4f}]")
    tail = [_quantile(b_ns, q) / _quantile(a_ns, q) for q in (0.9, 0.99)]
    print(f"tails, instrumented / plain {what}: p90 {tail[0]:.4f}, p99 {tail[1]:.4f}, "
          f"mean {statistics.mean(b_ns) / statistics.mean(a_ns):.4f}")
    target = "ratio <= 1.10" if args.every_call else "overhead <= +0.5%"
    print(f"overhead (median ratio - 1): {100 * (med - 1):+.2f}%   (target: {target})")
    calls = ((stats.get("sampled") or 0) - sampled_before) / args.pairs  # per generate()
    if calls:
        per_call = statistics.median(cpu_ns[traced]) - statistics.median(cpu_ns[plain])
        worker = "no worker"
        if worker_before is not None and worker_after is not None:
            captures = worker_after[1] - worker_before[1]
            worker_us = (worker_after[0] - worker_before[0]) / max(1, captures) / 1e3
            worker = f"worker {worker_us:.1f} µs a capture ({captures} finished)"
        # a run's CPU time varies by more than a millisecond: a difference of medians over one
        # or two sampled calls a run (the defaults) printed -2,500 to +4,100 µs a call
        calling = (f"calling thread {per_call / calls / 1e3:.1f} µs (instrumented - plain, "
                   f"medians of {calls:.0f} calls a run)" if calls >= _MIN_CALLS_A_RUN else
                   f"calling thread not resolved ({calls:.1f} sampled calls a run, under "
                   f"{_MIN_CALLS_A_RUN}: the runs' own CPU spread is larger)")
        print(f"CPU per traced call: {calling}, {worker}")
    exported = (stats.get("exported") or 0) - exported_before
    if export_before is not None and export_after is not None and exported:
        print(f"export thread CPU: {(export_after - export_before) / exported / 1e3:.1f} µs a "
              f"span ({exported} exported)")
    sampled = (stats.get("sampled") or 0) - sampled_before
    print(f"realised sample rate over the timed pairs: {sampled / (calls_per_run * args.pairs):.4f}"
          f" ({sampled} of {calls_per_run * args.pairs} attention calls; configured "
          f"{stats.get('sample_rate')}, effective at the end {stats.get('effective_sample_rate')}"
          f", overhead ratio {stats.get('overhead_ratio')})")
    if busy is not None:
        print(f"busy thread: the sample rate's scale was below 1 for {busy.share_below():.1%} of "
              f"the timed pairs (lowest {busy.lowest:.3g}); the profile rate's for "
              f"{busy.share_below(profile=True):.1%}")
    print(f"attnscope: sampled={stats.get('sampled')} profiled={stats.get('profiled')} "
          f"granted={stats.get('profile_granted')} "
          f"emitted={stats.get('emitted')} effective_rate={stats.get('effective_sample_rate'):.4f}")
    if args.breakdown:
        with torch.inference_mode():
            breakdown(lambda: run(traced), args.breakdown)
    attnscope.shutdown()
    files.cleanup()
    if sink is not None:
        sink.send_signal(signal.SIGTERM)
        received = sink.communicate(timeout=30)[0].strip().splitlines()
        print(f"receiver ({args.exporter}): {received[-1] if received else 'said nothing'}")
    return {"median_ratio": med}


def breakdown(run_traced: Any, runs: int) -> None:
    """``--breakdown``: the instrumented copy run ``runs`` more times with each step of the calling
    thread's path timed in place (after the timed pairs: the timers stay out of the ratios).
    Medians per call, wall and thread CPU; each includes its timer's own cost (~0.6 µs in place
    on the CPU) and those of the steps timed inside it."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_first_use as probe

    from attnscope._runtime import runtime

    timings = probe.Timings()
    steps = [*probe.CALLING[:1], probe.DECISION, *probe.CALLING[1:]]
    for path, attr, label in steps:
        timings.wrap(probe.resolve(path), attr, label, main_only=True)
    extract = "    the layer's extractor"
    for site in list(runtime.sampler._sites):
        if site.extractor is not None:
            timings.wrap(site, "extractor", extract, main_only=True)
    for _ in range(runs):
        run_traced()
    print(f"in place, {runs} instrumented runs (median µs per call, wall / thread CPU):")
    for label in [label for _, _, label in steps[:3]] + [extract] + \
            [label for _, _, label in steps[3:]]:
        rows = timings.rows.get(label) or []
        if not rows:
            print(f"  {label:44} not reached")
            continue
        print(f"  {label:44} {len(rows) / runs:6.1f} a run  "
              f"{statistics.median(r[0] for r in rows) / 1e3:8.2f} / "
              f"{statistics.median(r[1] for r in rows) / 1e3:8.2f}")


def _quantile(values: list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _start_sink(args: Any) -> subprocess.Popen[str]:
    """benchmarks/otlp_sink.py on two free ports, the OTLP endpoint pointed at it."""
    ports = []
    for _ in range(2):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    sink = subprocess.Popen([sys.executable, str(Path(__file__).with_name("otlp_sink.py")),
                             *map(str, ports)], stdout=subprocess.PIPE, text=True)
    assert sink.stdout is not None and sink.stdout.readline().strip() == "ready"
    http = args.exporter == "otlp-http"
    os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = (
        f"http://127.0.0.1:{ports[0]}/v1/traces" if http else f"http://127.0.0.1:{ports[1]}")
    return sink


def _export_cpu() -> int | None:
    """CPU time in ns of the batch span processor's export thread (the SDK names it), or None."""
    for thread in threading.enumerate():
        if "BatchSpan" in thread.name or "OtelBatch" in thread.name:
            try:
                return time.clock_gettime_ns(time.pthread_getcpuclockid(thread.ident or 0))
            except (AttributeError, OSError):
                return None
    return None


def _worker_cpu() -> tuple[int, int] | None:
    """(the worker thread's CPU time in ns, captures it finished so far), or None where the
    platform or the worker does not say (its thread is attnscope's private business)."""
    from attnscope._runtime import runtime

    worker = runtime.worker.current
    ident = getattr(getattr(worker, "thread", None), "ident", None)
    try:
        clock = time.pthread_getcpuclockid(ident)  # type: ignore[arg-type]
        return time.clock_gettime_ns(clock), int(getattr(worker, "processed", 0))
    except (AttributeError, OSError, TypeError):
        return None


if __name__ == "__main__":
    main()
