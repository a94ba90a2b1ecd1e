"""Every attribute name attnscope emits, with its type and unit: what docs/attributes.md states.

Span, link and resource attributes, and the metric instruments with their units. A renamed
attribute silently breaks every reader (``attnscope report``/``diff``, dashboards, the PromQL in
the docs), so the names live here once and tests/test_schema.py holds docs/attributes.md to them.
Imports nothing from attnscope: the calling side, the worker, the exporters and the CLI all read it.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PREFIX", "Attribute", "Metric", "ATTRIBUTES", "METRICS", "attribute"]

PREFIX = "attnscope."
_GEN_AI = "gen_ai."


@dataclass(frozen=True, slots=True)
class Attribute:
    """One attribute: ``name`` as emitted, ``key`` without the ``attnscope.`` prefix (what the
    worker's results use), the type as docs/attributes.md writes it, and its unit (UCUM, as
    OpenTelemetry writes units; "" for none)."""

    name: str
    type: str
    unit: str
    brief: str

    @property
    def key(self) -> str:
        return self.name.removeprefix(PREFIX)


@dataclass(frozen=True, slots=True)
class Metric:
    """One metric instrument attnscope's meter creates (docs/exporting.md#metrics)."""

    name: str
    unit: str
    brief: str


def attribute(key: str, type_: str, unit: str, brief: str) -> Attribute:
    """An attribute named ``attnscope.<key>`` (``gen_ai.*`` names are OpenTelemetry's own)."""
    return Attribute(key if key.startswith(_GEN_AI) else PREFIX + key, type_, unit, brief)


_NS, _BY, _TOKEN = "ns", "By", "{token}"

# ---- every sampled call
TIER = attribute("tier", "string", "",
                 "timing or profile (inside a profiled call: timing, see profiled_by)")
SAMPLE_RATE = attribute("sample_rate", "float", "1", "the probability that produced the span")
RECOMPUTE = attribute("recompute", "bool", "",
                      "the call ran inside a backward pass: a forward recomputed by activation "
                      "checkpointing")
WALL_NS = attribute("wall_ns", "int", _NS, "host wall time of the call")
HOST_RSS_BYTES = attribute("memory.host_rss_bytes", "int", _BY, "process resident set size")
TOKENS = attribute("tokens", "int", _TOKEN, "query tokens processed, padding excluded")
# OpenTelemetry's own name, set on a call site by capture and instrument
CODE_FUNCTION_NAME = Attribute("code.function.name", "string", "", "the traced function")
SUMMARY = attribute("summary", "string", "",
                    "the span's figures for a person to read, in units (the exact ones stay)")

# ---- attention inputs (derived by the worker)
DEVICE = attribute("device", "string", "", "the inputs' device")
AUTOCAST_DTYPE = attribute("autocast_dtype", "string", "",
                           "torch.autocast's dtype for the call's device, when it was on: the "
                           "dtype float32 inputs' matmuls and SDPA ran in")
DTYPE = attribute("dtype", "string", "", "the inputs' dtype")
BATCH_SIZE = attribute("batch_size", "int", "", "B")
NUM_HEADS = attribute("num_heads", "int", "", "query heads")
NUM_KV_HEADS = attribute("num_kv_heads", "int", "", "key/value heads the call received")
KV_REPEATED_FROM = attribute("kv_repeated_from", "int", "",
                             "the enclosing layer's num_kv_heads, K/V repeated from them")
HEAD_DIM = attribute("head_dim", "int", "", "D")
SEQ_LEN_Q = attribute("seq_len_q", "int", _TOKEN, "query length")
SEQ_LEN_KV = attribute("seq_len_kv", "int", _TOKEN, "key/value length")
CAUSAL = attribute("causal", "bool", "", "whether the attention is causal")
FLOPS = attribute("flops", "int", "{FLOP}", "attention FLOPs (QKᵀ and PV)")
BYTES = attribute("bytes", "int", _BY,
                  "least bytes the attention core moves: Q, K, V, mask read once, O written")
KV_BYTES_READ = attribute("kv_bytes_read", "int", _BY,
                          "decode: the K and V bytes read, the whole cache, padding excluded")
ARITHMETIC_INTENSITY = attribute("arithmetic_intensity", "float", "{FLOP}/By",
                                 "flops over bytes: where the call sits on a roofline")
TFLOPS = attribute("tflops", "float", "TFLOP/s",
                   "flops over the call's own time: device_ns when measured, else wall_ns")
TOKENS_PER_S = attribute("tokens_per_s", "float", "{token}/s", "tokens over the call's time")
SLIDING_WINDOW = attribute("sliding_window", "int", _TOKEN, "the band's width of a windowed mask")
KV_CACHE_LEN = attribute("kv_cache_len", "int", _TOKEN, "tokens cached before the call")
PHASE = attribute("phase", "string", "", "prefill or decode")
EXACT = attribute("exact", "bool", "", "false: a figure could not be established exactly")
INEXACT_REASON = attribute("inexact_reason", "string", "",
                           "why not: mask_not_kept, mask_unread, cache_unread, layer_narrows")
INPUT_TOKENS = attribute("gen_ai.usage.input_tokens", "int", _TOKEN, "prompt tokens")
OUTPUT_TOKENS = attribute("gen_ai.usage.output_tokens", "int", _TOKEN, "generated tokens")
REQUEST_ATTENTION_DURATION = Metric(PREFIX + "request.attention.duration", "s",
                                    "Estimated attention time per request of a batch() block "
                                    "(all calls, scaled from the sampled ones)")
# OpenTelemetry GenAI semantic conventions (docs/attributes.md#genai-semantic-conventions): the
# operation on generate() spans, the model's name on model-level spans where its config has one
OPERATION_NAME = attribute("gen_ai.operation.name", "string", "", "text_completion on generate()")
REQUEST_MODEL = attribute("gen_ai.request.model", "string", "",
                          "the model's name or path, as its config gives it")
# gen_ai.operation.name of a generate() call: the convention's value for a text completion
TEXT_COMPLETION = "text_completion"

# ---- model instrumentation (a call site's own attributes)
MODULE = attribute("module", "string", "", "module path")
MODULE_CLASS = attribute("module_class", "string", "", "the module's class")
MODEL = attribute("model", "string", "",
                  "the model's name (name_prefix, else its class), on a model whose module paths "
                  "another instrumented model of the process has")
MODEL_INSTANCE = attribute("model.instance", "int", "",
                           "with it: its number among the models instrumented in the process")
LAYER_INDEX = attribute("layer_index", "int", "", "the layer's index in its path")
FUSED = attribute("fused", "string", "", "attention+feed_forward: one fused kernel ran the layer")
IMPLEMENTATION = attribute("implementation", "string", "",
                           "the attention implementation the module's config names (sdpa, eager)")
IMPLEMENTATION_RAN = attribute("implementation.ran", "string", "",
                               "profiled: the implementation the call's ops show ran (sdpa, "
                               "eager, flex, flash_attn)")

# ---- device time and memory
DEVICE_NS = attribute("device_ns", "int", _NS, "GPU time between two CUDA events")
PEAK_BYTES = attribute("memory.peak_bytes", "int", _BY, "allocator peak during the call")
DELTA_BYTES = attribute("memory.delta_bytes", "int", _BY, "allocated after minus before")
HOST_PEAK_BYTES = attribute("memory.host_peak_bytes", "int", _BY, "host peak (profiled CUDA call)")

# ---- profiled calls
KERNEL_COUNT = attribute("kernel.count", "int", "", "kernels (CUDA) or ATen ops (CPU) of the call")
KERNEL_TOTAL_NS = attribute("kernel.total_ns", "int", _NS, "their summed time")
KERNEL_TOP_NAMES = attribute("kernel.top_names", "string[]", "", "the 5 with the most time")
KERNEL_TOP_NS = attribute("kernel.top_ns", "int[]", _NS, "their times")
KERNEL_TOP = attribute("kernel.top", "string[]", "", "the same 5 as \"name: time\"")
PROFILED_BY = attribute("profiled_by", "string", "",
                        "enclosing: timed inside a profiled call, its ops from that profile; "
                        "nested: holds a profiled call")
KERNEL_FOLDED = attribute("kernel.folded", "int", "", "ops folded into the span's own time")
BACKEND = attribute("backend", "string", "", "the attention backend that ran")
# Silent fallback (_derive/fallback.py): set on SDPA calls whose backend is known.
BACKEND_FALLBACK = attribute("backend.fallback", "bool", "",
                             "math ran while a fused backend was eligible, or none was")
BACKEND_EXPECTED = attribute("backend.expected", "string", "",
                             "the best backend the inputs allowed (empty: none)")
BACKEND_REASON = attribute("backend.reason", "string", "",
                           "why: torch's eligibility words, at most 240 characters")
LAUNCH_OVERHEAD_NS = attribute("launch_overhead_ns", "int", _NS, "CPU window without GPU work")
PROFILE_PATH = attribute("profile.path", "string", "", "the call's Chrome trace")
CORE_NS = attribute("core_ns", "int", _NS, "time of the attention core")
PROJECTION_NS = attribute("projection_ns", "int", _NS, "time of the projections")
CORE_TFLOPS = attribute("core_tflops", "float", "TFLOP/s",
                        "flops over core_ns, the attention core's time in the profile")
HOST_SYNCS = attribute("host_syncs", "int", "", "host waits in the call")
HOST_SYNC_OPS = attribute("host_sync_ops", "string[]", "", "the names behind host_syncs")
MEMCPY_NS = attribute("memcpy_ns", "int", _NS, "copy time")
DEVICE_IDLE_NS = attribute("device_idle_ns", "int", _NS, "gaps between device activities")

# ---- operator child spans
KERNEL_KIND = attribute("kernel.kind", "string", "", "cpu_op, cuda_kernel, memcpy, memset, other")
KERNEL_DEVICE = attribute("kernel.device", "string", "", "where the op ran")
KERNEL_SELF_NS = attribute("kernel.self_ns", "int", _NS, "own time, children excluded")
KERNEL_INNER = attribute("kernel.inner", "string[]", "", "ops it wrapped, merged into it")
KERNEL_INPUT_SHAPES = attribute("kernel.input_shapes", "string", "", "the op's input shapes")

# ---- slow calls and triggers (docs/live.md)
SLOW = attribute("slow", "bool", "", "beyond slow_call_quantile of the site's estimate")
SLOW_QUANTILE = attribute("slow_quantile", "float", "1", "the quantile it was beyond")
TRIGGER = attribute("trigger", "string", "", "why the call was profiled: on_demand, slow_call")
EXTRA = attribute("extra", "bool", "",
                  "the sampler had not chosen it (profiled after a slow call): no weight in "
                  "estimates of all calls")
LINK = attribute("link", "string", "", "on a span link: slow_call or batched_call")

# ---- step spans (docs/live.md) and the resource
STEP = attribute("step", "int", "", "the step number")
RANK = attribute("rank", "int", "", "the process's rank")
WORLD_SIZE = attribute("world_size", "int", "", "the job's ranks")
RUN_ID = attribute("run_id", "string", "", "the id the ranks of one job share")
HOST_NAME = Attribute("host.name", "string", "", "the rank's host (OpenTelemetry's name)")
VERSION = attribute("version", "string", "", "attnscope's version (resource)")
TORCH_VERSION = attribute("torch.version", "string", "", "torch's version (resource)")
DEVICE_NAME = attribute("device.name", "string", "", "the CUDA device's name (resource)")
TRANSFORMERS_VERSION = attribute("transformers.version", "string", "",
                                 "transformers' version, when the program imported it (resource)")
COMMAND_ARGS = Attribute("process.command_args", "string[]", "",
                         "the interpreter and its script or -m module; the whole command line, "
                         "bounded, with record_command_args (resource)")
PROCESS_START = Attribute("process.creation.time", "string", "",
                          "when the process started, ISO 8601 UTC (resource)")
HOST_ARCH = Attribute("host.arch", "string", "", "the host's architecture (resource)")
CPU_NAME = Attribute("host.cpu.model.name", "string", "", "the CPU's model name (resource)")
CONFIG_SAMPLE_RATE = attribute("config.sample_rate", "float", "1",
                               "sample rate in force when the span was written (resource)")
CONFIG_PROFILE_RATE = attribute("config.profile_rate", "float", "1",
                                "profile rate in force when the span was written (resource)")
CONFIG_OVERHEAD_BUDGET = attribute("config.overhead_budget", "float", "1",
                                   "overhead budget in force when the span was written (resource)")
CONFIG_WARMUP_CALLS = attribute("config.warmup_calls", "int", "",
                                "warm-up calls per site in force when the span was written "
                                "(resource)")

# ---- the roofline of a call (docs/profiling.md#reading-the-roofline)
ROOFLINE_ACHIEVED_TFLOPS = attribute("roofline.achieved_tflops", "float", "TFLOP/s",
                                     "flops over the roofline's time (time_source)")
ROOFLINE_ACHIEVED_GBPS = attribute("roofline.achieved_gbps", "float", "GB/s",
                                   "bytes over the roofline's time")
ROOFLINE_TIME_SOURCE = attribute("roofline.time_source", "string", "",
                                 "the time divided by: core_ns, device_ns or wall_ns")
ROOFLINE_BOUND = attribute("roofline.bound", "string", "",
                           "memory or compute: intensity below or above the ridge point")
ROOFLINE_FRACTION = attribute("roofline.fraction", "float", "1",
                              "achieved over min(peak flops, intensity × peak bandwidth)")
ROOFLINE_PEAK_TFLOPS = attribute("roofline.peak_tflops", "float", "TFLOP/s", "the peak used")
ROOFLINE_PEAK_GBPS = attribute("roofline.peak_gbps", "float", "GB/s", "the bandwidth used")
ROOFLINE_PEAK_SOURCE = attribute("roofline.peak_source", "string", "",
                                 "where the peaks came from: configured, calibrated or table")

# ---- batch(rows=...): a call's padding, and the attnscope.request span of each request row
# the span's name: the worker emits it (_worker/apportion.py), the CLI reads it (cli/report)
REQUEST_SPAN = "attnscope.request"
PADDING_FRACTION = attribute("padding_fraction", "float", "1",
                             "share of the call's FLOPs spent on padding (inside batch())")
REQUEST_ID = attribute("request.id", "string", "", "the request id the application gave")
REQUEST_BATCH = attribute("request.batch", "int", "", "the batch() block, unique in a process")
REQUEST_BATCH_SIZE = attribute("request.batch_size", "int", "", "rows the block declared")
REQUEST_ROW = attribute("request.row", "int", "", "the request's (first) row in the batch")
REQUEST_SAMPLED_CALLS = attribute("request.sampled_calls", "int", "{call}",
                                  "sampled attention calls split for this request")
REQUEST_CALLS_UNAPPORTIONED = attribute("request.calls_unapportioned", "int", "{call}",
                                        "sampled calls of the block not split by row")
REQUEST_CALLS_LOST = attribute("request.calls_lost", "int", "{call}",
                               "sampled calls of the block that never reached the worker")
REQUEST_TOKENS = attribute("request.tokens", "int", _TOKEN,
                           "real query tokens, summed over the sampled calls")
REQUEST_FLOPS = attribute("request.flops", "int", "{FLOP}",
                          "the row's share of the sampled calls' FLOPs: useful + padding")
REQUEST_USEFUL_FLOPS = attribute("request.useful_flops", "int", "{FLOP}",
                                 "real queries x the keys each attends to")
REQUEST_PADDING_FLOPS = attribute("request.padding_flops", "int", "{FLOP}",
                                  "what the padded shape spends on the row beyond that")
REQUEST_KV_BYTES_READ = attribute("request.kv_bytes_read", "int", _BY,
                                  "decode: the row's share of the K and V bytes read")
REQUEST_ATTENTION_NS = attribute("request.attention_ns", "int", _NS,
                                 "estimated: the row's share of the sampled calls' time")
REQUEST_ALL_FLOPS = attribute("request.all_calls.flops", "int", "{FLOP}",
                              "estimated: flops scaled to all calls (1 / sample rate)")
REQUEST_ALL_ATTENTION_NS = attribute("request.all_calls.attention_ns", "int", _NS,
                                     "estimated: attention_ns scaled to all calls")
REQUEST_PREFILL_CALLS = attribute("request.prefill.calls", "int", "{call}", "prefill calls")
REQUEST_PREFILL_FLOPS = attribute("request.prefill.flops", "int", "{FLOP}", "at prefill")
REQUEST_PREFILL_NS = attribute("request.prefill.attention_ns", "int", _NS,
                               "estimated, at prefill")
REQUEST_DECODE_CALLS = attribute("request.decode.calls", "int", "{call}", "decode calls")
REQUEST_DECODE_FLOPS = attribute("request.decode.flops", "int", "{FLOP}", "at decode")
REQUEST_DECODE_NS = attribute("request.decode.attention_ns", "int", _NS, "estimated, at decode")
REQUEST_EXACT = attribute("request.exact", "bool", "",
                          "false: some call's FLOPs were not exact (an upper bound)")

# ---- a model forward: the step figures serving engines log, and its sampled layers' sums
SUM_NQ2 = attribute("sum_nq2", "int", "",
                    "Σ over batch rows of N_Q² (real query tokens of the row, squared)")
SUM_NQ_NKV = attribute("sum_nq_nkv", "int", "",
                       "Σ over batch rows of N_Q · N_KV (real keys of the row, cache included)")
LAYERS_CALLS = attribute("layers.calls", "int", "{call}",
                         "sampled attention calls of this forward that carry FLOPs")
LAYERS_FLOPS = attribute("layers.flops", "int", "{FLOP}", "their attention FLOPs, summed")
LAYERS_BYTES = attribute("layers.bytes", "int", _BY,
                         "their least bytes, summed (only when every one has them)")

# ---- CUDA graphs: a sampled replay's span, and its captured calls' spans under it
REPLAYED = attribute("replayed", "bool", "",
                     "a call captured into a CUDA graph, timed in a sampled replay of it")
GRAPH_REPLAY = attribute("graph.replay", "int", "{replay}",
                         "replays of this graph launched so far, this one included")
GRAPH_CALLS = attribute("graph.calls", "int", "{call}",
                        "instrumented calls captured into the graph with an event pair")
GRAPH_CALLS_OVER_CAP = attribute("graph.calls_over_cap", "int", "{call}",
                                 "calls captured past the graph's event pairs: untimed, no span")
GRAPH_CALLS_LOST = attribute("graph.calls_lost", "int", "{call}",
                             "captured calls not read in time (a later replay): no span")
GRAPH_ATTENTION_NS = attribute("graph.attention_ns", "int", _NS,
                               "the captured calls' device time in this replay (outermost)")
GRAPH_ATTENTION_SHARE = attribute("graph.attention_share", "float", "1",
                                  "graph.attention_ns over the replay's device_ns")

ATTRIBUTES: tuple[Attribute, ...] = tuple(
    v for v in list(globals().values()) if isinstance(v, Attribute))

# ---- metric instruments
ATTENTION_DURATION = Metric(PREFIX + "attention.duration", "s",
                            "Duration of sampled attention calls (device time when measured)")
ATTENTION_TOKENS = Metric(PREFIX + "attention.tokens", "{token}",
                          "Tokens processed by attention calls (sampled calls / sample rate)")
MEMORY_PEAK = Metric(PREFIX + "memory.peak", "By",
                     "Peak device memory allocated during sampled calls")
SPANS_DROPPED = Metric(PREFIX + "spans.dropped", "{span}",
                       "attnscope spans not delivered, by reason")
PROFILES_SKIPPED = Metric(PREFIX + "profiles.skipped", "{profile}",
                          "Profile-tier captures that fell back to timing, by reason")
INTERNAL_ERRORS = Metric(PREFIX + "internal_errors", "{error}",
                         "Internal errors attnscope caught and logged")
EFFECTIVE_RATE = Metric(PREFIX + "sampling.effective_rate", "1",
                        "Sampling probability in force after the overhead budget, by tier")
OVERHEAD_RATIO = Metric(PREFIX + "overhead.ratio", "1",
                        "attnscope's calling-thread cost / wall time of the calls it wraps")
ROOFLINE_FRACTION_METRIC = Metric(PREFIX + "attention.roofline_fraction", "1",
                                  "Sampled calls' achieved share of their roofline's roof")
BACKEND_FALLBACKS = Metric(PREFIX + "attention.backend_fallbacks", "{call}",
                           "Profiled SDPA calls that ran the math kernel as a fallback")
# OpenTelemetry GenAI semantic conventions' model server metrics, under their own names
TIME_TO_FIRST_TOKEN = Metric(_GEN_AI + "server.time_to_first_token", "s",
                             "Time to generate first token for successful responses")
TIME_PER_OUTPUT_TOKEN = Metric(_GEN_AI + "server.time_per_output_token", "s",
                               "Time per output token generated after the first token for "
                               "successful responses")

METRICS: tuple[Metric, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Metric))
