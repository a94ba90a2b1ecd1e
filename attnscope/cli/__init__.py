"""attnscope's command line: capture a program, then read what it captured.

Each command lives in its own module (``_demo``, ``_run``, ``_report``, ``_diff``, ``_compare``)
with ``register(subparsers)``, which adds its parser and sets ``func`` to a function taking the
parsed arguments and returning the exit code. Optional libraries (tables, plots, statistics: the
``cli`` extra) are imported inside those functions.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from .._version import __version__
from ._errors import CLIError

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
}


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in every --help, descriptions kept as written."""


def build_parser(only: str | None = None, *, listing: bool = False) -> argparse.ArgumentParser:
    """The full parser: one subcommand per module in ``_COMMANDS``. ``only``: that command's
    alone; ``listing``: every command by name and help line, none of their modules imported
    (``attnscope --help``). Some command modules import torch: a command that does not need
    them should not wait seconds for it."""
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
            module = importlib.import_module(f"._{name}", __name__)
            module.register(sub, _Formatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. Bad input: one line on stderr and exit 2."""
    given = sys.argv[1:] if argv is None else argv
    # only the command's own module; no command (--help, --version, a typo): the list alone
    command = next((a for a in given if not a.startswith("-")), None)
    if command in _COMMANDS:
        parser = build_parser(command)
    else:
        parser = build_parser(listing=True)
    args = parser.parse_args(given)
    try:
        code: int = args.func(args)
    except CLIError as exc:
        print(f"attnscope {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnscope {args.command}: interrupted", file=sys.stderr)
        return 130
    return code
