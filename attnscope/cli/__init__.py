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

__all__ = ["main", "CLIError"]

# the order in which `attnscope --help` lists them
_COMMANDS = ("demo", "run", "report", "diff", "compare", "trigger")


class _Formatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults shown in every --help, descriptions kept as written."""


def build_parser() -> argparse.ArgumentParser:
    """The full parser: one subcommand per module in ``_COMMANDS``."""
    parser = argparse.ArgumentParser(
        prog="attnscope", formatter_class=_Formatter,
        description="See what the attention layers of your PyTorch models cost.\n\n"
                    "Capture with `attnscope run -- python app.py` (or `attnscope demo`), then "
                    "read the trace files with `report`, `diff` and `compare`.")
    parser.add_argument("--version", action="version", version=f"attnscope {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in _COMMANDS:
        module = importlib.import_module(f"._{name}", __name__)
        module.register(sub, _Formatter)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run one command; returns its exit code. Bad input: one line on stderr and exit 2."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except CLIError as exc:
        print(f"attnscope {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"attnscope {args.command}: interrupted", file=sys.stderr)
        return 130
    return code
