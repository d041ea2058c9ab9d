"""`pyllamaspec download`: fetch models from the Hugging Face Hub, sha256-checked (tools.download)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from ..errors import DownloadError
from ..tools import download as hub

USAGE = """\
    pyllamaspec download REPO [FILE_PATTERN ...] [--revision REV] [--local-dir DIR] [--json]
    pyllamaspec download --alias NAME [FILE_PATTERN ...] [...]
    pyllamaspec download --list-aliases
"""


def register(sub) -> None:
    parser = sub.add_parser(
        "download",
        help="fetch a model from the Hugging Face Hub (sha256-checked)",
        description=hub.__doc__.split("\n\n", 1)[0] + "\n\n" + USAGE + "\n" + hub.__doc__.split("\n\n", 2)[-1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("repo", nargs="?", metavar="REPO", help="hub repo id (owner/name) or an alias")
    parser.add_argument("patterns", nargs="*", metavar="FILE_PATTERN",
                        help="file names or globs to fetch (default: the alias's files, else all files)")
    parser.add_argument("--revision", metavar="REV", help="branch, tag or commit (default: the alias's, else main)")
    parser.add_argument("--alias", metavar="NAME", help="a known model instead of REPO (see --list-aliases)")
    parser.add_argument("--local-dir", metavar="DIR",
                        help="put the files under DIR (default: the Hugging Face cache)")
    parser.add_argument("--json", action="store_true", help="print one JSON object (default: one path a line)")
    parser.add_argument("--list-aliases", action="store_true", help="list the known aliases and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.list_aliases:
        print(format_aliases(args.json))
        return 0
    if args.alias is not None:
        if args.alias not in hub.ALIASES:
            raise DownloadError(f"unknown alias {args.alias!r}; aliases: {', '.join(hub.ALIASES)}")
        # with --alias there is no REPO, so a first positional is already a file pattern
        name, patterns = args.alias, ([args.repo] if args.repo else []) + args.patterns
    elif args.repo is not None:
        name, patterns = args.repo, args.patterns
    else:
        raise DownloadError("give a REPO (owner/name) or --alias NAME; --list-aliases lists the aliases")
    paths = hub.download(name, patterns or None, args.revision, args.local_dir)
    if args.json:
        print(json.dumps({"source": name, "revision": args.revision, "files": [str(p) for p in paths]}, indent=2))
    else:
        print("\n".join(str(p) for p in paths))
    return 0


def format_aliases(as_json: bool) -> str:
    aliases = hub.ALIASES
    if as_json:
        return json.dumps({name: asdict(source) for name, source in aliases.items()}, indent=2)
    width = max(map(len, aliases))
    lines = []
    for name, source in aliases.items():
        files = " ".join(source.patterns) if source.patterns else "all files"
        pinned = f" @ {source.revision[:12]}" if source.revision else ""
        lines.append(f"{name:<{width}}  {source.repo}{pinned}  [{files}]  {source.description}")
    return "\n".join(lines)
