"""``attnscope compare`` once its arguments are parsed: a :class:`Spec` from them, each
implementation prepared and checked against the float64 reference, the calls planned within the
budget and measured in interleaved rounds, the table or JSON printed, the exit code."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import logging
import math
import sys
import time
from collections.abc import Iterator
from typing import Any

import torch

from .._errors import CLIError
from . import _measure as measure
from ._impls import Impl, build, load_user, resolve, static_reason
from ._plan import Plan, blocks, plan
from ._render import Row, render_json, render_table
from ._stats import figures

__all__ = ["run", "run_compare", "compare", "Outcome", "parse_spec", "exit_code"]

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
    kv = _count(args.kv_heads, "--kv-heads", "H", h)
    if h % kv:
        raise CLIError(f"--kv-heads {kv} does not divide the {h} query heads")
    device = _device(str(args.device))
    dtype_name = str(args.dtype).lower()
    if dtype_name == "auto":
        dtype_name = "bf16" if device.type == "cuda" else "fp32"
    if dtype_name not in _DTYPES:
        raise CLIError(f"--dtype: {args.dtype!r} is not one of fp32, bf16, fp16")
    keys = _count(getattr(args, "kv_len", "S"), "--kv-len", "S", s)
    causal = bool(args.causal) and s > 1  # one query at the end of its keys sees them all
    if causal and keys != s:
        # SDPA's is_causal aligns top-left when S differs from the keys; a chunk of a prompt
        # on a cache would need the bottom-right mask passed to every implementation
        raise CLIError(f"--causal with S={s} queries on --kv-len {keys} keys is not supported: "
                       "causal needs S equal to the keys, or S=1 (a decode step)")
    return measure.Spec(b, h, kv, s, d, _DTYPES[dtype_name], device, causal,
                        args.runs, args.warmup, args.profile_runs, args.seed,
                        float(args.budget) or None, kv_len=None if keys == s else keys)


def _count(value: Any, option: str, letter: str, default: int) -> int:
    """A count option's value, ``letter`` (H, S) standing for ``default``; at least 1."""
    text = str(value).strip()
    try:
        count = default if text.upper() == letter else int(text)
    except ValueError:
        raise CLIError(f"{option}: {text!r} is not an integer") from None
    if count <= 0:
        raise CLIError(f"{option} must be at least 1, got {count}")
    return count


def run(args: Any) -> int:
    """The command: its exit code."""
    if getattr(args, "from_trace", None):
        return _run_from_trace(args)
    spec = parse_spec(args)
    names = resolve(list(getattr(args, "impl", [])))
    users = {name: load_user(name) for name, _ in names if ":" in name}  # bad ones fail first
    with _own_choice_unsaid():
        done = compare(spec, names, users, progress=not args.no_progress)
    if args.json:
        render_json(done.spec, done.rows, sys.stdout, done.plan)
    else:
        render_table(done.spec, done.rows, sys.stdout, done.plan)
    return exit_code(done.rows)


def _run_from_trace(args: Any) -> int:
    """``--from``: a comparison per shape of the trace, the most time first (``--top``)."""
    from ._from_trace import trace_shapes

    path = str(args.from_trace)
    shapes, unusable = trace_shapes(path)
    if not shapes:
        raise CLIError(f"--from {path}: no attention call with a shape compare can rebuild "
                       f"({unusable} without lengths, heads, head dim or a float dtype)")
    names = resolve(list(getattr(args, "impl", [])))
    users = {name: load_user(name) for name, _ in names if ":" in name}
    chosen = shapes[:args.top]
    docs: list[dict[str, Any]] = []
    code = 0
    for i, shape in enumerate(chosen, 1):
        line = (f"shape {i} of {len(chosen)} from {path}: {shape.describe()} · {shape.calls} "
                f"calls, {shape.share:.0%} of its attention time"
                + ("; what their masks hide (padding, a window, requests packed apart) is "
                   "not rebuilt: dense inputs" if shape.masked else ""))
        one = argparse.Namespace(**vars(args))
        one.shape = f"{shape.batch},{shape.heads},{shape.seq_q},{shape.head_dim}"
        one.kv_len, one.kv_heads, one.causal = str(shape.seq_kv), str(shape.kv_heads), shape.causal
        if str(args.dtype).lower() == "auto":
            one.dtype = shape.dtype
        try:
            spec = parse_spec(one)
        except CLIError as exc:
            print(f"{line}: not compared ({exc})", file=sys.stderr if args.json else sys.stdout)
            code = 1
            continue
        with _own_choice_unsaid():
            done = compare(spec, names, users, progress=not args.no_progress)
        if args.json:
            text = io.StringIO()
            render_json(done.spec, done.rows, text, done.plan)
            docs.append({"trace_shape": dataclasses.asdict(shape), **json.loads(text.getvalue())})
        else:
            print(line, file=sys.stdout)
            render_table(done.spec, done.rows, sys.stdout, done.plan)
            print(file=sys.stdout)
        code = max(code, exit_code(done.rows))
    if args.json:
        json.dump({"from": path, "shapes_in_trace": len(shapes),
                   "calls_without_a_shape": unusable, "comparisons": docs}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    return code


class _OwnChoice(logging.Filter):
    """Drops attnscope's fallback WARNING about the ``math`` row: that row runs SDPA's math
    kernel inside an ``sdpa_kernel`` context on purpose, and its table line says which backend
    ran. Any other fallback (a user's function, another row) is still said."""

    _PREFIX = measure.SPAN_PREFIX + "math "

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        return not (text.startswith(self._PREFIX) and "excluded by an sdpa_kernel context" in text)


@contextlib.contextmanager
def _own_choice_unsaid() -> Iterator[None]:
    logger, own = logging.getLogger("attnscope"), _OwnChoice()
    logger.addFilter(own)
    try:
        yield
    finally:
        logger.removeFilter(own)


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
        return build(name, spec.shape, spec.kv_heads, spec.device, spec.causal, spec.keys)
    except Exception as exc:  # torch without a piece this one needs
        return Row(name, "unavailable", f"{type(exc).__name__}: {exc}"[:300])


@dataclasses.dataclass
class Outcome:
    """A comparison: the spec with the calls the plan made, one row per implementation."""

    spec: measure.Spec
    rows: list[Row]
    plan: Plan


def run_compare(spec: measure.Spec, names: list[tuple[str, bool]], users: dict[str, Impl],
                progress: bool) -> list[Row]:
    """Run every implementation; one :class:`Row` each, in the order of ``names``."""
    return compare(spec, names, users, progress).rows


def compare(spec: measure.Spec, names: list[tuple[str, bool]], users: dict[str, Impl],
            progress: bool) -> Outcome:
    """Probe each implementation, plan the calls within the budget, warm up, time them in
    interleaved rounds, profile them; ``progress``: a line on stderr at each step."""
    say = _Progress(progress)
    torch.manual_seed(spec.seed)
    inputs = measure.make_inputs(spec)
    ref = measure.reference(*inputs, causal=spec.causal)
    say("the float64 reference is ready")
    rows: list[Row] = []
    live: list[tuple[Row, Impl, float]] = []  # ran: its row, the implementation, s a call
    with measure.session(spec.device) as memory:
        for name, requested in names:
            prepared = _prepare(name, requested, users, spec)
            if isinstance(prepared, Row):
                rows.append(prepared)
                say(f"{name}: {prepared.status}: {prepared.reason}")
                continue
            row, impl, seconds = _probe(prepared, inputs, ref, measure.TOLERANCE[spec.dtype],
                                        spec)
            rows.append(row)
            if impl is None:
                say(f"{row.name}: {row.status}: {row.reason}")
                continue
            say(f"{row.name}: runs here, {'within' if row.status == 'ok' else 'beyond'} the "
                f"tolerance (first call {_seconds(seconds)})")
            live.append((row, impl, seconds))
        live = [_first_warmup(entry, inputs, spec, say) for entry in live]
        ran = [row for row, _, _ in live]
        live = [entry for entry in live if entry[0].status != "failed"]
        made = plan(spec.runs, spec.warmup, [s for _, _, s in live], spec.budget_s)
        if live:
            if made.cut:
                say(made.describe())
            say(f"{_calls(made.runs, 'timed call')} of each of {len(live)} in "
                f"{_calls(made.rounds, 'round')}, {_calls(made.warmup, 'warm-up call')} first")
            _measure_all(live, inputs, spec, made, say)
    spans = list(memory.get_finished_spans())
    for row in rows:
        if not any(row is r for r in ran):
            continue
        row.figures = figures(spans, measure.SPAN_PREFIX + row.name)
        if row.status != "failed" and row.figures.calls < made.runs:
            row.notes.append(f"attnscope recorded {row.figures.calls} of the {made.runs} timed "
                             "calls (its log on stderr says why)")
    say("done")
    return Outcome(dataclasses.replace(spec, runs=made.runs, warmup=made.warmup), rows, made)


def _probe(impl: Impl, inputs: tuple[torch.Tensor, ...], ref: torch.Tensor, tolerance: float,
           spec: measure.Spec) -> tuple[Row, Impl | None, float]:
    """The probe call's row, the implementation to time (None: it does not run) and the seconds
    the call took."""
    start = time.perf_counter()
    found = measure.probe(impl, inputs, spec)
    seconds = time.perf_counter() - start
    impl = found.impl
    if found.output is None:
        reason = "; ".join([str(found.error)] + found.warnings[:2])
        return Row(impl.name, "failed" if impl.user else "unavailable", reason, impl.notes,
                   user=impl.user), None, seconds
    abs_err, rel_err = measure.errors(found.output, ref)
    row = Row(impl.name, "ok", None, impl.notes, user=impl.user, max_abs_error=abs_err,
              max_rel_error=rel_err)
    if not math.isfinite(abs_err):
        row.status, row.reason = "inaccurate", "the output has NaN or infinite values"
    elif abs_err > tolerance:
        row.status = "inaccurate"
        dtype = str(spec.dtype).removeprefix("torch.")
        row.reason = f"max abs error {abs_err:.3g} beyond the {tolerance:g} allowed for {dtype}"
    return row, impl, seconds


def _first_warmup(entry: tuple[Row, Impl, float], inputs: tuple[torch.Tensor, ...],
                  spec: measure.Spec, say: _Progress) -> tuple[Row, Impl, float]:
    """The first warm-up call, whose time (a compiled one's first call is the probe) plans
    the rest; without warm-up, the probe's time."""
    row, impl, seconds = entry
    if spec.warmup:
        error, seconds = measure.warm(impl, inputs, spec, 1)
        if error is not None:
            row.status, row.reason = "failed", error
    say(f"{row.name}: " + (f"failed: {row.reason}" if row.status == "failed"
                           else f"about {_seconds(seconds)} a call"))
    return row, impl, seconds


def _measure_all(live: list[tuple[Row, Impl, float]], inputs: tuple[torch.Tensor, ...],
                 spec: measure.Spec, made: Plan, say: _Progress) -> None:
    """The rest of the warm-up, the timed rounds (every other one in reverse order, so that no
    implementation always follows the same one) and the profiled calls; a call that raises marks
    its row failed and leaves it out of the rest."""
    def fail(row: Row, error: str | None) -> None:
        if error is not None:
            row.status, row.reason = "failed", error
            say(f"{row.name}: failed: {error}")

    for row, impl, _ in live:
        if made.warmup > 1:
            fail(row, measure.warm(impl, inputs, spec, made.warmup - 1)[0])
    sizes = blocks(made.runs, made.rounds)
    for round_no, calls in enumerate(sizes):
        for row, impl, _ in (live if round_no % 2 == 0 else live[::-1]):
            if row.status != "failed":
                fail(row, measure.timed(impl, inputs, spec, round_no, calls))
        say(f"round {round_no + 1} of {len(sizes)} timed")
    for row, impl, _ in live:
        if row.status != "failed" and spec.profile_runs:
            fail(row, measure.profiled(impl, inputs, spec, spec.profile_runs))
            say(f"{row.name}: {_calls(spec.profile_runs, 'profiled call')}")


class _Progress:
    """One line on stderr per step, terminal or not (a pipe or a CI log sees the run move)."""

    def __init__(self, show: bool) -> None:
        self.show, self.started = show, time.monotonic()

    def __call__(self, text: str) -> None:
        if self.show:
            elapsed = time.monotonic() - self.started
            print(f"attnscope compare [{elapsed:5.1f} s]: {text}", file=sys.stderr, flush=True)


def _seconds(value: float) -> str:
    if not math.isfinite(value):
        return "?"
    return f"{value:.3g} s" if value < 100 else f"{value:.0f} s"


def _calls(count: int, what: str) -> str:
    return f"{count} {what}" + ("" if count == 1 else "s")
