"""``attnscope compare``: the attention implementations of this machine on the user's shapes.

Each implementation (``_impls``) runs on the same inputs under attnscope (``_compare_measure``);
the figures come from attnscope's spans (``_compare_stats``) and are printed as a table or JSON
(``_compare_render``). Exit code: 0 when every implementation that ran is within the tolerance,
1 when one is not or raised (or none ran), 2 for bad input.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable, NoReturn

import torch

from . import _compare_measure as measure
from ._compare_render import Row, render_json, render_table
from ._compare_stats import figures
from ._errors import CLIError, positive_int
from ._impls import Impl, build, load_user, resolve, static_reason

__all__ = ["register", "run_compare", "parse_spec", "exit_code"]

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
_UNFUSED = ("naive", "math")  # they hold the S×S scores (a few copies)


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope compare`` to the command line."""
    p = sub.add_parser(
        "compare", formatter_class=formatter,
        help="time the attention implementations of this machine on your shapes",
        description="Run every attention implementation available here on the same inputs under "
                    "attnscope: naive matmul-softmax-matmul, SDPA math/flash/efficient/cuDNN "
                    "(torch.nn.attention.sdpa_kernel), flex_attention, and your own as "
                    "module:function (called as fn(q, k, v, is_causal=...), k/v with --kv-heads "
                    "heads). Reports p50/p95/p99, TFLOP/s, ops or kernels per call, the backend "
                    "that ran, the memory peak, and the error against a float64 reference.\n\n"
                    "Exit code: 0 all within tolerance, 1 one beyond it or failed, 2 bad input.")
    p.add_argument("--shape", default="1,8,1024,64", metavar="B,H,S,D",
                   help="batch, query heads, sequence length, head dim")
    p.add_argument("--kv-heads", default="H", metavar="N",
                   help="key/value heads (fewer than H: GQA/MQA)")
    p.add_argument("--dtype", default="auto", help="fp32, bf16 or fp16; auto: bf16 on CUDA, fp32 on CPU")
    p.add_argument("--causal", action="store_true", help="causal attention")
    p.add_argument("--impl", action="append", default=argparse.SUPPRESS, metavar="NAME",
                   help="naive, math, flash, efficient, cudnn, flex or module:function; repeat or "
                        "comma-separate (default: every built-in; flex on CUDA only)")
    p.add_argument("--device", default="auto", help="cpu, cuda, cuda:N; auto: cuda when present")
    p.add_argument("--runs", type=positive_int, default=50, help="timed calls per implementation")
    p.add_argument("--warmup", type=_non_negative, default=5, help="untimed calls before them")
    p.add_argument("--profile-runs", type=_non_negative, default=2,
                   help="profiled calls (backend, ops/kernels, memory) per implementation")
    p.add_argument("--seed", type=int, default=0, help="seed of the random inputs")
    p.add_argument("--json", action="store_true", help="print JSON instead of the table")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.set_defaults(func=_main)
    setattr(p, "error", _one_line_error(p))


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


def _device(text: str) -> torch.device:
    if text == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(text)
    except (RuntimeError, ValueError):
        raise CLIError(f"--device: {text!r} is not a device (cpu, cuda, cuda:N)") from None
    if device.type not in ("cpu", "cuda"):
        raise CLIError(f"--device: {device.type} is not supported (cpu or cuda)")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CLIError("--device: CUDA is not available here")
    return device


def parse_spec(args: Any) -> measure.Spec:
    """The parsed arguments → a :class:`Spec`; bad values are a :class:`CLIError`."""
    parts = [p.strip() for p in str(args.shape).split(",")]
    if len(parts) != 4:
        raise CLIError(f"--shape wants 4 sizes B,H,S,D, got {len(parts)}: {args.shape!r}")
    try:
        b, h, s, d = (int(p) for p in parts)
    except ValueError:
        raise CLIError(f"--shape: {args.shape!r} is not 4 integers B,H,S,D") from None
    if min(b, h, s, d) <= 0:
        raise CLIError(f"--shape: every size must be at least 1, got {args.shape!r}")
    kv_text = str(args.kv_heads).strip()
    try:
        kv = h if kv_text.upper() == "H" else int(kv_text)
    except ValueError:
        raise CLIError(f"--kv-heads: {kv_text!r} is not an integer") from None
    if kv <= 0:
        raise CLIError(f"--kv-heads must be at least 1, got {kv}")
    if h % kv:
        raise CLIError(f"--kv-heads {kv} does not divide the {h} query heads")
    device = _device(str(args.device))
    dtype_name = str(args.dtype).lower()
    if dtype_name == "auto":
        dtype_name = "bf16" if device.type == "cuda" else "fp32"
    if dtype_name not in _DTYPES:
        raise CLIError(f"--dtype: {args.dtype!r} is not one of fp32, bf16, fp16")
    return measure.Spec(b, h, kv, s, d, _DTYPES[dtype_name], device, bool(args.causal),
                        args.runs, args.warmup, args.profile_runs, args.seed)


def _main(args: Any) -> int:
    spec = parse_spec(args)
    names = resolve(list(getattr(args, "impl", [])))
    users = {name: load_user(name) for name, _ in names if ":" in name}  # bad ones fail first
    show = not args.no_progress and sys.stderr.isatty()
    rows = run_compare(spec, names, users, show)
    if args.json:
        render_json(spec, rows, sys.stdout)
    else:
        render_table(spec, rows, sys.stdout)
    return exit_code(rows)


def exit_code(rows: list[Row]) -> int:
    """1 when an implementation failed or is beyond the tolerance, or none ran; else 0."""
    ran = [r for r in rows if r.status in ("ok", "inaccurate", "failed")]
    return 1 if not ran or any(r.status != "ok" for r in ran) else 0


def _prepare(name: str, requested: bool, users: dict[str, Impl], spec: measure.Spec) -> Row | Impl:
    """The implementation to run, or the row saying why it does not run here."""
    if name in users:
        return users[name]
    verdict = static_reason(name, spec.device.type, requested)
    if verdict is not None:
        return Row(name, verdict[0], verdict[1])
    if name in _UNFUSED:
        need, free = 3 * measure.scores_bytes(spec), measure.free_bytes(spec.device)
        if need > free:
            return Row(name, "unavailable", f"holds the S×S scores: about {need / 2**30:.1f} GiB, "
                                            f"{free / 2**30:.1f} GiB free on {spec.device}")
    try:
        return build(name, spec.shape, spec.kv_heads, spec.device, spec.causal)
    except Exception as exc:  # torch without a piece this one needs
        return Row(name, "unavailable", f"{type(exc).__name__}: {exc}"[:300])


def run_compare(spec: measure.Spec, names: list[tuple[str, bool]], users: dict[str, Impl],
                progress: bool) -> list[Row]:
    """Run every implementation; one :class:`Row` each, in the order of ``names``."""
    torch.manual_seed(spec.seed)
    inputs = measure.make_inputs(spec)
    ref = measure.reference(*inputs, causal=spec.causal)
    tolerance = measure.TOLERANCE[spec.dtype]
    rows: list[Row] = []
    measured: list[tuple[Row, Impl]] = []
    calls = 1 + spec.warmup + spec.runs + spec.profile_runs
    with _progress(progress) as bar, measure.session(spec.device) as memory:
        for name, requested in names:
            prepared = _prepare(name, requested, users, spec)
            if isinstance(prepared, Row):
                rows.append(prepared)
                continue
            task = bar.add_task(name, total=calls) if bar is not None else None
            advance = _advancer(bar, task)
            row = _run_one(prepared, inputs, ref, tolerance, spec, advance)
            rows.append(row)
            if row.status != "unavailable":
                measured.append((row, prepared))
    spans = list(memory.get_finished_spans())
    for row, impl in measured:
        row.figures = figures(spans, measure.SPAN_PREFIX + impl.name)
        if row.status != "failed" and row.figures.calls < spec.runs:
            row.notes.append(f"attnscope recorded {row.figures.calls} of the {spec.runs} timed "
                             "calls (its log on stderr says why)")
    return rows


def _run_one(impl: Impl, inputs: tuple[torch.Tensor, ...], ref: torch.Tensor, tolerance: float,
             spec: measure.Spec, advance: Callable[[], None]) -> Row:
    found = measure.probe(impl, inputs, spec)
    advance()
    impl = found.impl
    if found.output is None:
        reason = "; ".join([str(found.error)] + found.warnings[:2])
        return Row(impl.name, "failed" if impl.user else "unavailable", reason, impl.notes,
                   user=impl.user)
    abs_err, rel_err = measure.errors(found.output, ref)
    row = Row(impl.name, "ok", None, impl.notes, user=impl.user, max_abs_error=abs_err,
              max_rel_error=rel_err)
    if not math.isfinite(abs_err):
        row.status, row.reason = "inaccurate", "the output has NaN or infinite values"
    elif abs_err > tolerance:
        row.status = "inaccurate"
        dtype = str(spec.dtype).removeprefix("torch.")
        row.reason = f"max abs error {abs_err:.3g} beyond the {tolerance:g} allowed for {dtype}"
    error = measure.measure(impl, inputs, spec, advance)
    if error is not None:
        row.status, row.reason = "failed", error
    return row


@contextmanager
def _progress(show: bool) -> Iterator[Any]:
    if not show:
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description:>12}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
        yield bar


def _advancer(bar: Any, task: Any) -> Callable[[], None]:
    if bar is None:
        return lambda: None
    return lambda: bar.advance(task)
