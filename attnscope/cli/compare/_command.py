"""``attnscope compare`` once its arguments are parsed: a :class:`Spec` from them, each
implementation prepared, checked against the float64 reference and measured, the table or JSON
printed, the exit code."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .._errors import CLIError
from ..render.console import console as make_console
from . import _measure as measure
from ._impls import Impl, build, load_user, resolve, static_reason
from ._render import Row, render_json, render_table
from ._stats import figures

__all__ = ["run", "run_compare", "parse_spec", "exit_code"]

_DTYPES = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16,
           "bfloat16": torch.bfloat16, "fp16": torch.float16, "float16": torch.float16}
_UNFUSED = ("naive", "math")  # they hold the S×S scores (a few copies)


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


def run(args: Any) -> int:
    """The command: its exit code."""
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
    with Progress(TextColumn("{task.description:>12}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=make_console(sys.stderr), transient=True) as bar:
        yield bar


def _advancer(bar: Any, task: Any) -> Callable[[], None]:
    if bar is None:
        return lambda: None
    return lambda: bar.advance(task)
