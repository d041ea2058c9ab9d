"""`pyllamaspec info`: version, llama.cpp commit, patches, backends, devices."""

from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    p = sub.add_parser("info", help="version, llama.cpp commit, patches, backends, devices",
                       description="What this installation is and what it can use here.")
    p.add_argument("--json", action="store_true", help="print one JSON object (default: a table)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..buildinfo import format_info, info

    d = info()
    print(json.dumps(d, indent=2) if args.json else format_info(d))
    return 0
