"""`pyllamaspec quantize`: requantize a GGUF (tools.quantize)."""

from __future__ import annotations

import argparse
import sys

from ..progress import Progress
from ..tools.quantize import FTYPES, quantize


def register(sub) -> None:
    p = sub.add_parser("quantize", help="requantize a GGUF (e.g. a drafter to Q4_0)",
                       description="Requantize a GGUF through upstream's quantizer into a new file; a drafter's "
                                   "selector and Markov-head tensors stay at F16. The input is never touched.")
    p.add_argument("input", help="GGUF to read")
    p.add_argument("output", help="GGUF to write")
    p.add_argument("--type", default="Q4_0", help=f"one of {', '.join(FTYPES)} (default: %(default)s)")
    p.add_argument("--allow-requantize", action="store_true",
                   help="allow an already-quantized input (default: refused)")
    p.add_argument("-t", "--threads", type=int, default=0, help="quantizer threads; 0: all cores (default: 0)")
    p.add_argument("--force", action="store_true", help="replace an existing output file (default: refused)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print(f"quantizing {args.input} -> {args.output} ({args.type.upper()})", file=sys.stderr)
    with Progress("quantizing", unit="tensors") as bar:
        r = quantize(args.input, args.output, args.type, threads=args.threads,
                     allow_requantize=args.allow_requantize, force=args.force,
                     progress=lambda done, total: bar.update(done, total))
        bar.update(bar.total or 0)
    mib = 2 ** 20
    print(f"{r['bytes_in'] / mib:.1f} MiB -> {r['bytes_out'] / mib:.1f} MiB "
          f"({r['bytes_out'] / r['bytes_in']:.2f}x) in {r['seconds']:.1f} s", file=sys.stderr)
    return 0
