"""``attnscope run --repeat N [-- A ... --alternate -- B ...]``: runs as the unit of replication.

The calls of one run share its machine state (load, clock frequency, caches, the allocator), so
they are not independent evidence about the next run; a comparison that can tell a program from
itself needs several runs. This writes N of them, one process each, with the same arguments:

- one command: ``DIR/run-1`` ... ``DIR/run-N``, each what ``attnscope run --no-report`` writes
  into its ``--out`` (the trace files of every process of the program);
- two commands (the second after ``--alternate --``): ``DIR/a/run-K`` and ``DIR/b/run-K``, made
  in the order a/run-1, b/run-1, a/run-2, ... so that both see the same machine over time (a
  burst of load, a change of clock, hits both sides instead of one).

A run that fails (the program's exit code is not 0, or it was killed) or a Ctrl-C stops the
repeat: that run's trace files are removed (a repeat directory holds only runs that finished,
so a ``diff`` of it compares like with like), the runs before it are kept, and the exit code
is the program's (130 for a Ctrl-C; killed by signal N, the CLI ends by N). No report is
printed: one run's report at the end would be read as the result of all of them, which is the
mistake runs are here to avoid; the last lines say what to type next.
"""

from __future__ import annotations

import argparse
import re
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from .._errors import CLIError
from ..render import units
from . import _environment, _output_dir, _program, _run_child, _status
from . import _output as output

__all__ = ["SEPARATOR", "repeat", "split_alternate"]

SEPARATOR = ("--alternate", "--")  # between the first command and the second
_RUN = re.compile(r"^run-[1-9]\d*$")
_SIDES = ("a", "b")
_REPORT = "report.html"  # what a plain run writes besides the trace files


@dataclass(frozen=True)
class _Command:
    label: str  # "" (one command), "a" or "b"
    argv: list[str]
    service: str
    given: str  # the command as the user typed it, for the closing lines
    command: list[str]  # the same, whole, for run.json


def split_alternate(command: list[str]) -> tuple[list[str], list[str] | None]:
    """The first command and the second (None without ``--alternate --``): the first such
    pair of tokens separates them (a later one belongs to the second command)."""
    for i in range(len(command) - 1):
        if (command[i], command[i + 1]) == SEPARATOR:
            return command[:i], command[i + 2:]
    return command, None


def repeat(args: argparse.Namespace, command: list[str]) -> int:
    """Make the runs; returns 0, the failed run's exit code, or 130 after a Ctrl-C."""
    first, second = split_alternate(command)
    if not first:
        raise CLIError("no program given before --alternate")
    if second is not None and not second:
        raise CLIError("no program given after --alternate --")
    commands = [_command("", first)] if second is None else [
        _command("a", first), _command("b", second)]
    out = _output_dir(args.out)
    _environment(args, out, commands[0].service)  # bad ATTNSCOPE_* values: before any run
    _clear_previous(out)
    done: list[Path] = []
    for k in range(1, args.repeat + 1):
        for cmd in commands:
            directory = out / cmd.label / f"run-{k}"
            name = f"run {k} of {args.repeat}" + (f" ({cmd.label})" if cmd.label else "")
            try:
                code = _one_run(args, cmd, directory, name)
            except KeyboardInterrupt:  # a Ctrl-C in attnscope's own steps around the run
                code = _failed(directory, name, 130, interrupted=True, took=units.MISSING)
            if code is not None:
                if cmd.label and not any(directory.parent.iterdir()):
                    directory.parent.rmdir()  # b/ of a b that never finished a run
                _stopped(out, done, code)
                return code
            done.append(directory)
    _next_steps(out, commands, args.repeat)
    return 0


def _command(label: str, command: list[str]) -> _Command:
    given = shlex.join(command)
    return _Command(label, *_program(command), given if len(given) <= 80 else given[:79] + "…",
                    list(command))


def _one_run(args: argparse.Namespace, cmd: _Command, directory: Path, name: str) -> int | None:
    """Run once into ``directory``; None when it finished, else the exit code to stop with."""
    directory.mkdir(parents=True, exist_ok=True)
    env = _environment(args, directory, cmd.service)
    start, started = time.monotonic(), time.time_ns()
    ended = _run_child(cmd.argv, env)
    code, interrupted = ended.code, ended.interrupted
    took = units.duration((time.monotonic() - start) * 1e9)
    output.write_run_info(directory, command=cmd.command, argv=cmd.argv, environ=env,
                          started_ns=started, ended_ns=time.time_ns(), exit_code=code)
    if ended.signal is not None:
        args.end_by_signal = ended.signal  # main() ends this process by it, after the report
    if interrupted or code != 0:
        return _failed(directory, name, code, interrupted=interrupted, took=took)
    print(f"attnscope run: {name}: {_captured(directory)} in {_shown(directory)} ({took})",
          file=sys.stderr)
    compiled = _status.compiled_line(ended.reports)
    if compiled and name.startswith("run 1 "):  # once a repeat: each run compiles alike
        print(f"attnscope run: {compiled}", file=sys.stderr)
    return None


def _failed(directory: Path, name: str, code: int, *, interrupted: bool, took: str) -> int:
    """Say which run stopped the repeat and why, remove its trace files; the exit code."""
    _remove_run(directory)
    what = "interrupted" if interrupted else f"failed: the program exited with {code}"
    print(f"attnscope run: {name} {what} ({took}); its trace files are removed",
          file=sys.stderr)
    return 130 if interrupted else code


def _captured(directory: Path) -> str:
    files = output.written(directory)
    if not files:
        return "no spans captured"
    counts = [output.count_spans(p) for p in files if ".jaeger.json" in p.name]
    if counts and all(c is not None for c in counts):
        return f"{sum(c or 0 for c in counts)} spans"
    return f"{len(files)} trace files"


def _stopped(out: Path, done: list[Path], code: int) -> None:
    kept = ", ".join(str(d.relative_to(out)) for d in done) or "none"
    print(f"attnscope run: stopped (exit {code}); runs kept in {_shown(out)}: {kept}",
          file=sys.stderr)


def _next_steps(out: Path, commands: list[_Command], n: int) -> None:
    err = sys.stderr
    runs = "1 run" if n == 1 else f"{n} runs"
    if len(commands) == 1:
        names = "run-1" + ("" if n == 1 else ", run-2" if n == 2 else f" … run-{n}")
        print(f"attnscope run: {runs} of {commands[0].given} in {_shown(out)}: {names}",
              file=err)
        print(f"attnscope run: next: attnscope report {_shown(out / 'run-1')} (one run), or "
              f"attnscope diff {_shown(out)} OTHER (against another --repeat directory)",
              file=err)
        return
    a, b = commands
    print(f"attnscope run: {runs} each, alternating: a = {a.given} in {_shown(out / 'a')}, "
          f"b = {b.given} in {_shown(out / 'b')}", file=err)
    print(f"attnscope run: next: attnscope diff {_shown(out / 'a')} {_shown(out / 'b')}",
          file=err)


def _clear_previous(out: Path) -> None:
    """Replace what an earlier ``run`` or ``run --repeat`` wrote in ``out``, as a plain run
    replaces an earlier run's trace files: those in ``out`` itself and its report, and the
    ``run-K`` directories of ``out``, ``out/a`` and ``out/b`` (all of them, so that a
    ``--repeat 3`` after a ``--repeat 5`` leaves no run-4 behind). A run directory that holds a
    file attnscope did not write is left alone, and the command refused, before anything is
    removed."""
    runs = [d for parent in (out, *(out / s for s in _SIDES)) if parent.is_dir()
            for d in sorted(parent.iterdir()) if _RUN.match(d.name) and d.is_dir()]
    for directory in runs:
        foreign = sorted(p.name for p in directory.iterdir() if not _ours(p))
        if foreign:
            raise CLIError(f"--out {out}: {directory} holds files attnscope did not write "
                           f"({', '.join(foreign[:3])}); move them, or choose another --out")
    output.clear_previous(out)
    (out / _REPORT).unlink(missing_ok=True)
    for directory in runs:
        _remove_run(directory)
    for side in _SIDES:
        if (out / side).is_dir() and not any((out / side).iterdir()):
            (out / side).rmdir()


def _ours(path: Path) -> bool:
    if path.name == _REPORT:
        return path.is_file()
    return (path.is_symlink() or path.is_file()) and output.is_run_file(path.name)


def _remove_run(directory: Path) -> None:
    """A run's trace files, its report, then the directory itself when that left it empty."""
    output.clear_previous(directory)
    (directory / _REPORT).unlink(missing_ok=True)
    try:
        directory.rmdir()
    except OSError:  # something else in it: left as it is
        pass


def _shown(path: Path) -> str:
    """``path`` as the user would type it: relative to the working directory when inside it."""
    try:
        text = str(path.relative_to(Path.cwd()))
    except ValueError:
        text = str(path)
    return shlex.quote(text)
