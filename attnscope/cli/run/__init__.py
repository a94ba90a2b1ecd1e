"""``attnscope run [options] -- python app.py args...``: capture a program without changing it.

The program runs as a child process whose ``PYTHONPATH`` starts with ``_bootstrap/`` (its
``sitecustomize.py`` sets attnscope up once torch is imported, in every Python process of the
program) and whose environment carries the settings (``ATTNSCOPE_*``, the output directory).
Its stdin, stdout and stderr are the CLI's own, untouched; SIGTERM and SIGHUP are passed on, and
SIGINT too unless the terminal already sent it to the program (Ctrl-C reaches the whole
foreground process group). When it has exited, the report goes to **stderr** (the program's
stdout stays the program's alone, for pipelines), and the CLI ends as the program did: with its
exit code, or, killed by signal N, by the same signal (a shell loop stops at a Ctrl-C, a
supervisor sees the signal; :func:`attnscope.cli.main` called from Python returns 128 + N instead).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from ... import _safe_files
from ..._config import check_rate, from_env
from .._errors import CLIError
from . import _output as output
from . import _status

__all__ = ["Ended", "register", "run"]

_BOOTSTRAP = str(Path(__file__).with_name("_bootstrap"))
_PYTHON = re.compile(r"^python(\d+(\.\d+)*)?(\.exe)?$")
# bare names that mean the interpreter running attnscope (a path or another version is kept)
_THIS_PYTHON = ("python", "python3", f"python{sys.version_info[0]}.{sys.version_info[1]}")
_TAKES_VALUE = ("-W", "-X", "--check-hash-based-pycs")
_FORWARDED = ("SIGINT", "SIGTERM", "SIGHUP")
_USAGE = ("attnscope run [options] -- python app.py [args...]\n"
          "       attnscope run --repeat N [options] -- python a.py [args...] "
          "[--alternate -- python b.py [args...]]")


class _RunDefault(float):
    """A flag's default, told apart from the same value given on the command line: a default
    gives way to the ``ATTNSCOPE_*`` variable of the same setting (a setting the user gave)."""


# flag -> the environment variable the child reads it from
_SETTINGS = {"sample_rate": "ATTNSCOPE_SAMPLE_RATE", "profile_rate": "ATTNSCOPE_PROFILE_RATE",
             "overhead_budget": "ATTNSCOPE_OVERHEAD_BUDGET",
             "warmup_calls": "ATTNSCOPE_WARMUP_CALLS"}


def _rate(name: str, *, zero: bool = True) -> Any:
    def parse(text: str) -> float:
        try:
            value = check_rate(name, float(text))
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix("attnscope: ")) from None
        if not zero and value == 0.0:
            raise argparse.ArgumentTypeError(f"{name} must be > 0, got {text}")
        return value

    return parse


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text!r}")
    return int(text)


def _runs(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return int(text)


class _IntDefault(int):
    """:class:`_RunDefault` for a count."""


@dataclasses.dataclass(frozen=True)
class Ended:
    """How the program ended."""

    code: int  # its exit code as a shell reports it (killed by signal N: 128 + N)
    interrupted: bool  # a SIGINT reached attnscope meanwhile (a Ctrl-C)
    signal: int | None = None  # the signal that killed it
    # what its processes reported at exit (cli/run/_status.py)
    reports: list[dict[str, Any]] = dataclasses.field(default_factory=list)


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope run`` to the command line."""
    p = sub.add_parser(
        "run", formatter_class=formatter, usage=_USAGE,
        help="run a Python program with attnscope capturing its attention calls",
        description="Run a program with attnscope configured from the command line: "
                    "F.scaled_dot_product_attention traced, every transformers model and "
                    "nn.MultiheadAttention model it builds instrumented, no change to its code.\n"
                    "At exit: DIR/traces.jaeger.json, DIR/traces.otlp.jsonl (other processes "
                    "of the program: traces.rank<N>.* / traces.pid<PID>.*) and the report, on "
                    "stderr. The program's exit code, stdout and stderr pass through unchanged."
                    "\n\nWith --repeat N: N runs, one process each, into DIR/run-1 ... "
                    "DIR/run-N (each what a plain run writes with --no-report), one line per run "
                    "on stderr and no report. With a second command after --alternate --, the "
                    "runs of the two alternate (a/run-1, b/run-1, a/run-2, ...) into DIR/a/run-K "
                    "and DIR/b/run-K; compare them with `attnscope diff DIR/a DIR/b`. A run that "
                    "fails stops the repeat: its trace files are removed, the runs before it "
                    "kept, and the exit code is the program's (Ctrl-C: 130).")
    p.add_argument("--sample-rate", type=_rate("sample_rate"), default=_RunDefault(1.0),
                   metavar="RATE", help="fraction of attention calls traced (an experiment: all "
                   "of them); without the flag, $ATTNSCOPE_SAMPLE_RATE when set")
    p.add_argument("--profile-rate", type=_rate("profile_rate"), default=_RunDefault(0.05),
                   metavar="RATE", help="fraction of traced calls run under torch.profiler "
                   "(kernels, backend); without the flag, $ATTNSCOPE_PROFILE_RATE when set")
    p.add_argument("--overhead-budget", type=_rate("overhead_budget", zero=False),
                   default=_RunDefault(1.0), metavar="FRACTION",
                   help="attnscope's own time kept under this fraction of the traced calls' time "
                   "by sampling less; 1 means no budget; without the flag, "
                   "$ATTNSCOPE_OVERHEAD_BUDGET when set")
    p.add_argument("--warmup-calls", type=_count, default=_IntDefault(0), metavar="N",
                   help="calls at each call site before sampling starts; without the flag, "
                   "$ATTNSCOPE_WARMUP_CALLS when set")
    p.add_argument("-o", "--out", default="attnscope-out", metavar="DIR",
                   help="directory for the trace files and report.html (created if missing; "
                        "trace files of an earlier run there are replaced; with --repeat, the "
                        "run-K directories of an earlier repeat too)")
    p.add_argument("--repeat", type=_runs, default=argparse.SUPPRESS, metavar="N",
                   help="run the program N times, into DIR/run-1 ... DIR/run-N; with "
                        "`--alternate -- COMMAND` after the program, a second command whose "
                        "runs alternate with the first's, into DIR/a/run-K and DIR/b/run-K")
    p.add_argument("--no-report", action="store_true",
                   help="only say which files were written (no terminal or HTML report)")
    # (not dest="command": that is the subcommand's name, which error lines start with)
    p.add_argument("program", nargs=argparse.REMAINDER, metavar="-- PROGRAM [ARGS...]",
                   help="the program and its arguments, after --")
    p.set_defaults(func=run)
    # bad input is one line on stderr, not the usage as well
    setattr(p, "error",  # noqa: B010  (mypy: a method is not assignable)
            lambda message: p.exit(2, f"attnscope run: error: {message}\n"))


def run(args: argparse.Namespace) -> int:
    """Run the program; returns its exit code once the report is printed."""
    command = list(args.program)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise CLIError("no program given (usage: attnscope run [options] -- python app.py "
                       "[args...])")
    if hasattr(args, "repeat"):
        from ._repeat import repeat

        return repeat(args, command)
    argv, service = _program(command)
    out = _output_dir(args.out)
    env = _environment(args, out, service)
    output.clear_previous(out)
    started = time.time_ns()
    ended = _run_child(argv, env)
    output.write_run_info(out, command=command, argv=argv, environ=env, started_ns=started,
                          ended_ns=time.time_ns(), exit_code=ended.code)
    _report(out, ended, full=not args.no_report)
    if ended.signal is not None:
        args.end_by_signal = ended.signal  # main() ends this process by it, after the report
    return ended.code


def _program(command: list[str]) -> tuple[list[str], str]:
    """The argv to start and a service name; CLIError for a command or script that is not there."""
    if command[0].endswith(".py"):  # a script alone runs under this interpreter
        command = [sys.executable, *command]
    elif command[0] in _THIS_PYTHON:  # attnscope's interpreter: attnscope is importable there
        command = [sys.executable, *command[1:]]
    if shutil.which(command[0]) is None:
        raise CLIError(f"{command[0]}: command not found")
    service = os.path.basename(command[0])
    if _PYTHON.match(os.path.basename(command[0])):
        target = _python_target(command[1:])
        if target is None:
            return command, service
        kind, name = target
        if kind == "script" and not os.path.isfile(name):
            raise CLIError(f"{name}: no such file")
        service = Path(name).stem if kind == "script" else name
    return command, service


def _python_target(args: list[str]) -> tuple[str, str] | None:
    """("script", path) or ("module", name) for ``python [options] TARGET``; None for -c, stdin."""
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == "-m":
            return ("module", args[i + 1]) if i + 1 < len(args) else None
        elif arg.startswith("-m"):
            return "module", arg[2:]
        elif arg.startswith("-c") or arg == "-":
            return None
        elif arg in _TAKES_VALUE:
            skip = True
        elif not arg.startswith("-"):
            return "script", arg
    return None


def _output_dir(text: str) -> Path:
    """The directory, made if missing; CLIError when it cannot be written or another user could
    plant links or replace files in it (their directory, or one every user can write in)."""
    out = Path(text).expanduser().resolve()
    try:
        out.mkdir(parents=True, exist_ok=True)
        _safe_files.check_writable(out)
    except _safe_files.UnsafePath as exc:
        raise CLIError(f"--out {text}: {out} is {exc.strerror}; attnscope writes only where no "
                       "other user can plant links (choose a directory of your own)") from None
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise CLIError(f"--out {text}: cannot write there ({reason})") from None
    return out


def _environment(args: argparse.Namespace, out: Path, service: str) -> dict[str, str]:
    env = dict(os.environ)
    for field, var in _SETTINGS.items():
        value = getattr(args, field)
        given = not isinstance(value, (_RunDefault, _IntDefault))
        if given or not env.get(var, "").strip():  # a flag wins; a default gives way
            env[var] = repr(float(value)) if isinstance(value, float) else str(int(value))
    env.update({
        output.ENV_DIR: str(out),
        output.ENV_PARENT: str(os.getpid()),
        output.ENV_SERVICE: service,
    })
    try:
        from_env(env, strict=True)  # the user's other ATTNSCOPE_* values, checked here, once
    except ValueError as exc:
        raise CLIError(str(exc).removeprefix("attnscope: ")) from None
    previous = env.get("PYTHONPATH", "")
    env["PYTHONPATH"] = _BOOTSTRAP + (os.pathsep + previous if previous else "")
    return env


def _in_foreground() -> bool:
    """True when this process group owns the terminal: a Ctrl-C there reached the program too."""
    for fd in (0, 1, 2):
        try:
            if os.isatty(fd) and os.tcgetpgrp(fd) == os.getpgrp():
                return True
        except OSError:
            continue
    return False


def _run_child(argv: list[str], env: dict[str, str]) -> Ended:
    """Run the program to its end (a Ctrl-C: ``run --repeat`` stops there)."""
    interrupted = []
    channel = _status.Channel()
    try:
        child = subprocess.Popen(argv, env={**env, **channel.env}, pass_fds=channel.pass_fds)
    except OSError as exc:
        channel.reports()
        raise CLIError(f"{argv[0]}: cannot start it ({exc.strerror or exc})") from None
    channel.started()

    def forward(signum: int, frame: Any) -> None:
        if signum == signal.SIGINT:
            interrupted.append(signum)
        if signum == signal.SIGINT and _in_foreground():
            return
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signum)

    previous = {}
    for name in _FORWARDED:
        number = getattr(signal, name, None)
        if number is not None:
            previous[number] = signal.signal(number, forward)
    try:
        code = child.wait()
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
    return Ended(128 - code if code < 0 else code, bool(interrupted),
                 -code if code < 0 else None, channel.reports())


def _report(out: Path, ended: Ended, *, full: bool) -> None:
    """What was written, then the report (on stderr); never changes the exit code."""
    err = sys.stderr
    files = output.written(out)
    if not files:
        print(f"attnscope run: {_nothing_written(out, ended)}", file=err)
        return
    main_jaeger = out / output.JAEGER
    spans = output.count_spans(main_jaeger) if main_jaeger.is_file() else None
    shown = ", ".join(str(p) for p in files[:4]) + (f" and {len(files) - 4} more"
                                                    if len(files) > 4 else "")
    counted = f"{spans} spans" if spans is not None else "trace files"
    print(f"attnscope run: {counted} written: {shown}", file=err)
    compiled = _status.compiled_line(ended.reports)
    if compiled:
        print(f"attnscope run: {compiled}", file=err)
    if full:
        _full_report(out)


def _full_report(out: Path) -> None:
    from .. import build_parser, main

    commands = next((a.choices for a in build_parser()._actions
                     if isinstance(a, argparse._SubParsersAction)), {})
    if "report" not in commands:
        return  # `attnscope report` is not part of this version
    html = out / "report.html"
    try:
        # `attnscope report` says where it wrote the page, in its one line on stderr
        with contextlib.redirect_stdout(sys.stderr):
            # the directory: every process's files (a launcher such as torchrun traces nothing)
            main(["report", str(out), "--html", str(html)])
    except (Exception, SystemExit) as exc:
        print(f"attnscope run: the report failed ({exc!r:.200})", file=sys.stderr)


# what became of sampled calls' spans, as a run's processes report it (docs/sampling.md's counts)
_FATES = (("exported", "spans exported"), ("export_failed", "failed to export"),
          ("export_dropped", "dropped by the export queue"), ("export_in_flight", "in flight"),
          ("dropped_queue_full", "captures dropped (queue full)"),
          ("worker_errors", "lost to worker errors"))


def _nothing_written(out: Path, ended: Ended) -> str:
    """Why a run left no trace file in ``out``, from what the program's processes reported."""
    total = {k: sum(int(r[k]) for r in ended.reports if isinstance(r.get(k), int))
             for k in _status.COUNTS}
    if ended.signal is not None:
        try:
            name = signal.Signals(ended.signal).name
        except ValueError:
            name = f"signal {ended.signal}"
        return (f"no spans written to {out}: the program was killed by {name}, which ends a "
                "process before attnscope's exit flush: whatever it sampled was lost (Ctrl-C, "
                "or a handler of the program's that exits, keeps the spans)")
    if total["sampled"]:
        lost = ", ".join(f"{total[k]} {what}" for k, what in _FATES if total[k])
        return (f"no spans written to {out}: {total['sampled']} attention calls were sampled, "
                f"but no trace file was written ({lost or 'none exported'}; attnscope's "
                "warnings above say why)")
    if ended.reports:
        compiled = _status.compiled_line(ended.reports)
        return (f"no spans captured, nothing written to {out} (no attention call was sampled "
                f"in the {len(ended.reports)} process(es) of the program that imported torch)"
                + (f"; {compiled}" if compiled else ""))
    return (f"no spans captured, nothing written to {out} (no process of the program imported "
            "torch, or none that did exited normally)")
