"""attnscope's command line: capture a program, then read what it captured.

One package or module per command (``demo``, ``run``, ``report``, ``diff``, ``compare``,
``trigger``, ``calibrate``), each with ``register(subparsers, formatter)``, which adds its parser
and sets ``func`` to a function taking the parsed arguments and returning the exit code. They share
``render`` (units, console, writer, html) and ``traces`` (reading trace files). A command module
is imported only when its command runs, and this package imports neither torch nor the library
(``attnscope/__init__`` binds its names on first use): ``attnscope --help``, ``report``, ``diff``
and ``trigger`` start without torch.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys
from typing import TextIO, cast

from .._version import __version__
from ._errors import CLIError
from ._stdout import Dropping

__all__ = ["CLIError", "main"]

# the order in which `attnscope --help` lists them, with the line it shows for each (the same as
# the command module's own parser says: tests/test_cli_run.py checks that they agree)
_COMMANDS = {
    "demo": "trace a small built-in model on the CPU and print what attnscope saw",
    "run": "run a Python program with attnscope capturing its attention calls",
    "report": "summarise a trace: latency, throughput and kernels per attention layer",
    "diff": "compare two traces: what got faster or slower, beyond noise",
    "compare": "time the attention implementations of this machine on your shapes",
    "trigger": "profile the next sampled calls of a running process (no restart)",
    "calibrate": "measure this machine's peaks for the roofline (matmul and copy), once",
}

# The [cli] extra (pyproject.toml): tables, plots, statistics. The command modules import them
# at their top; main() turns their absence into one line instead of a traceback.
_CLI_EXTRA = frozenset({"rich", "matplotlib", "scipy"})
_NEEDS_EXTRA = "attnscope: this command needs the [cli] extra: pip install 'attnscope[cli]'"


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in every --help, descriptions kept as written."""


def build_parser(only: str | None = None, *, listing: bool = False) -> argparse.ArgumentParser:
    """The full parser: one subcommand per module in ``_COMMANDS``. ``only``: that command's
    alone; ``listing``: every command by name and help line, none of their modules imported
    (``attnscope --help``): some import torch, and a command that does not need it should not
    wait seconds for it."""
    parser = argparse.ArgumentParser(
        prog="attnscope", formatter_class=_Formatter,
        description="See what the attention layers of your PyTorch models cost.\n\n"
                    "Capture with `attnscope run -- python app.py` (or `attnscope demo`), then "
                    "read the trace files with `report`, `diff` and `compare`.")
    parser.add_argument("--version", action="version", version=f"attnscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, line in _COMMANDS.items():
        if listing:
            sub.add_parser(name, help=line)
        elif only is None or name == only:
            module = importlib.import_module(f".{name}", __name__)
            module.register(sub, _Formatter)
    return parser


def _missing_extra(exc: ModuleNotFoundError) -> bool:
    """True when ``exc`` is a library of the [cli] extra not being installed (then the user is
    told the one line ``_NEEDS_EXTRA``; any other missing module is a bug and propagates)."""
    if (exc.name or "").partition(".")[0] not in _CLI_EXTRA:
        return False
    print(_NEEDS_EXTRA, file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. Bad input, or a missing [cli] extra: one line on
    stderr and exit 2. On the command line (``argv`` None), ``attnscope run`` whose program was
    killed by signal N ends by N instead (``cli/_ending.py``); called with ``argv``, 128 + N.
    A command whose output's reader went away (``| head``) does all its work all the same and,
    where it would have exited 0, ends by SIGPIPE (``_stdout.py``)."""
    given = sys.argv[1:] if argv is None else argv
    # only the command's own module; no command (--help, --version, a typo): the list alone
    command = next((a for a in given if not a.startswith("-")), None)
    try:
        parser = build_parser(command) if command in _COMMANDS else build_parser(listing=True)
    except ModuleNotFoundError as exc:
        if _missing_extra(exc):
            return 2
        raise
    args = parser.parse_args(given)
    stdout = sys.stdout
    dropping = Dropping(stdout)
    sys.stdout = cast(TextIO, dropping)
    try:
        code: int = args.func(args)
    except ModuleNotFoundError as exc:
        if _missing_extra(exc):
            return 2
        raise
    except CLIError as exc:
        print(f"attnscope {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnscope {args.command}: interrupted", file=sys.stderr)
        return 130
    finally:
        sys.stdout = stdout
    signum = getattr(args, "end_by_signal", None)
    if signum is None and code == 0 and dropping.gone:  # its output's reader went away
        signum, code = signal.SIGPIPE, 128 + signal.SIGPIPE
    if argv is None and isinstance(signum, int):
        from ._ending import end_by_signal

        end_by_signal(signum)
    return code
