"""The ``attnscope`` command line."""

from __future__ import annotations

import argparse
import sys

__all__ = ["main"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="attnscope", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="trace a small built-in model on the CPU and print what attnscope saw")
    demo.add_argument("--steps", type=int, default=20, help="forward passes per implementation")
    demo.add_argument("--seq-len", type=int, default=256)
    demo.add_argument("--jaeger-json", default="attnscope-demo-trace.json",
                      help="also write the spans here for Jaeger's Upload tab ('' to skip)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from ._demo import run_demo

        return run_demo(steps=args.steps, seq_len=args.seq_len, jaeger_json=args.jaeger_json or None,
                        out=sys.stdout)
    return 2
