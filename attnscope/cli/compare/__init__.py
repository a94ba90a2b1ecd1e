"""``attnscope compare``: the attention implementations of this machine on the user's shapes.

Each implementation (``_impls``) runs on the same inputs under attnscope (``_measure``);
the figures come from attnscope's spans (``_stats``) and are printed as a table or JSON
(``_render``). Exit code: 0 when every implementation that ran is within the tolerance,
1 when one is not or raised (or none ran), 2 for bad input. This package holds the parser;
``_command`` the run.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any, NoReturn

from .._errors import positive_int
from ._plan import DEFAULT_BUDGET_S

__all__ = ["register"]


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope compare`` to the command line."""
    p = sub.add_parser(
        "compare", formatter_class=formatter,
        help="time the attention implementations of this machine on your shapes",
        description="Run every attention implementation available here on the same inputs under "
                    "attnscope: naive matmul-softmax-matmul, SDPA math/flash/efficient/cuDNN "
                    "(torch.nn.attention.sdpa_kernel), flex_attention, and your own as "
                    "module:function (called as fn(q, k, v, is_causal=...), k/v with --kv-heads "
                    "heads and --kv-len keys). Reports p50/p95/p99, TFLOP/s, ops or kernels per "
                    "call, the backend that ran, the memory peak, and the error against a "
                    "float64 reference; then which is faster, as a ratio with its interval over "
                    "interleaved rounds, or 'not distinguishable here'.\n\n"
                    "Exit code: 0 all within tolerance, 1 one beyond it or failed, 2 bad input.")
    p.add_argument("--shape", default="1,8,1024,64", metavar="B,H,S,D",
                   help="batch, query heads, sequence length, head dim")
    p.add_argument("--from", dest="from_trace", default=argparse.SUPPRESS, metavar="TRACE",
                   help="compare on the shapes of a trace's attention calls (a trace file, an "
                        "`attnscope run` directory or a --repeat one) instead of --shape: the "
                        "--top ones by their "
                        "time, each with its kv length, heads, causality and (with --dtype auto) "
                        "dtype")
    p.add_argument("--top", type=positive_int, default=3, metavar="N",
                   help="with --from: how many shapes, the most time first")
    p.add_argument("--kv-len", default="S", metavar="N",
                   help="keys and values per sequence, when not S: a decode step is --shape "
                        "B,H,1,D --kv-len N (N keys in the cache, this step's included)")
    p.add_argument("--kv-heads", default="H", metavar="N",
                   help="key/value heads (fewer than H: GQA/MQA)")
    p.add_argument("--dtype", default="auto",
                   help="fp32, bf16 or fp16; auto: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--causal", action="store_true",
                   help="causal attention, aligned bottom-right (the last query sees every key); "
                        "with S=1 it changes nothing and is left out")
    p.add_argument("--impl", action="append", default=argparse.SUPPRESS, metavar="NAME",
                   help="naive, math, flash, efficient, cudnn, flex or module:function; repeat or "
                        "comma-separate (default: every built-in; flex on CUDA only)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N; auto: cuda when present")
    p.add_argument("--runs", type=positive_int, default=50,
                   help="timed calls per implementation, in up to 10 interleaved rounds")
    p.add_argument("--warmup", type=_non_negative, default=5, help="untimed calls before them")
    p.add_argument("--budget", type=_non_negative_seconds, default=DEFAULT_BUDGET_S,
                   metavar="SECONDS",
                   help="the most the warm-up and timed calls of all implementations may take "
                        "together, estimated from one call of each: fewer calls when they would "
                        "take longer (never under 6 timed, 1 warm-up), said in the output; 0: "
                        "no limit")
    p.add_argument("--profile-runs", type=_non_negative, default=2,
                   help="profiled calls (backend, ops/kernels, memory) per implementation")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--no-progress", action="store_true",
                   help="no progress lines on stderr (one per step, terminal or not)")
    p.set_defaults(func=_main)
    setattr(p, "error", _one_line_error(p))  # noqa: B010  (mypy: a method is not assignable)


def _one_line_error(parser: argparse.ArgumentParser) -> Callable[[str], NoReturn]:
    def error(message: str) -> NoReturn:
        parser.exit(2, f"{parser.prog}: error: {message} (see --help)\n")

    return error


def _non_negative(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {value}")
    return value


def _non_negative_seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not value >= 0 or value == float("inf"):  # NaN fails the first test
        raise argparse.ArgumentTypeError(f"must be 0 or more seconds, got {text}")
    return value


def _main(args: Any) -> int:
    # torch and the measuring code load when the command runs, not for `compare --help`
    # (milliseconds instead of the seconds torch's import takes)
    from ._command import run

    return run(args)
