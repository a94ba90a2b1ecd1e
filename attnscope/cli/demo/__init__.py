"""``attnscope demo``: a tiny attention model traced end to end, no backend needed (the parser
here; the model and the run in ``_run``)."""

from __future__ import annotations

import sys
from typing import Any

from .._errors import positive_int

__all__ = ["register"]


def register(sub: Any, formatter: Any) -> None:
    """Add ``attnscope demo`` to the command line."""
    parser = sub.add_parser(
        "demo", formatter_class=formatter,
        help="trace a small built-in model on the CPU and print what attnscope saw",
        description="Trace a small built-in model (4 attention layers) with two attention "
                    "implementations on the CPU, no backend needed, and print what attnscope saw.")
    parser.add_argument("--steps", type=positive_int, default=20,
                        help="forward passes per implementation")
    parser.add_argument("--seq-len", type=positive_int, default=256, help="tokens per sequence")
    parser.add_argument("--jaeger-json", default="attnscope-demo-trace.json",
                        help="also write the spans here for Jaeger's Upload tab ('' to skip)")
    parser.add_argument("--html", metavar="PATH", default=None,
                        help="also write the `attnscope report` of the spans as an HTML page")
    parser.set_defaults(func=_main)


def _main(args: Any) -> int:
    # torch, the model and the library load when the command runs, not for `demo --help`
    from ._run import run_demo

    return run_demo(steps=args.steps, seq_len=args.seq_len, jaeger_json=args.jaeger_json or None,
                    html=args.html, out=sys.stdout)
