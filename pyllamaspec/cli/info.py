"""`pyllamaspec info`: version, llama.cpp commit, patches, backends, devices."""

from __future__ import annotations

import argparse
import json


def register(sub) -> None:
    p = sub.add_parser("info", help="version, llama.cpp commit, patches, backends, devices",
                       description="What this installation is and what it can use here.")
    p.add_argument("--json", action="store_true", help="print one JSON object (default: a table)")
    p.add_argument("--rpc", default=None, metavar="HOST:PORT[,...]",
                   help="also connect to these rpc-servers and list their devices (default: none)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from ..buildinfo import format_info, info

    if args.rpc is not None:
        from ..rpc import add_servers

        add_servers(args.rpc)
    d = info()
    print(json.dumps(d, indent=2) if args.json else format_info(d))
    return 0
