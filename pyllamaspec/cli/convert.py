"""`pyllamaspec convert`: a DFlash / DFlash2 drafter checkpoint to a dflash GGUF (tools.convert)."""

from __future__ import annotations

import argparse

from ..progress import Progress
from ..tools.convert import OUTTYPES, convert_dflash


def register(sub) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "convert",
        help="convert a DFlash/DFlash2 drafter checkpoint to a dflash GGUF",
        description="Convert a DFlash / DFlash2 drafter checkpoint (safetensors) into a GGUF that llama.cpp "
        "loads as arch 'dflash', with the tokenizer of TARGET. Pairing is validated before anything is written.",
    )
    p.add_argument("drafter_dir", help="DFlash/DFlash2 drafter checkpoint directory (config.json + *.safetensors)")
    p.add_argument("--target", required=True,
                   help="the target: its GGUF, or its Hugging Face model directory (config.json + tokenizer.json); "
                        "tokenizer and pairing come from it")
    p.add_argument("-o", "--output", "--out", dest="out", required=True, help="output GGUF path")
    p.add_argument("--outtype", choices=OUTTYPES, default="bf16",
                   help="weight type of the 2-D tensors (default: %(default)s)")
    p.add_argument("--force", action="store_true", help="overwrite OUT if it exists (default: refused)")
    p.add_argument("--source-repo", default=None,
                   help="HF repo id the drafter came from, for provenance (default: from the cache path or config)")
    p.add_argument("--source-revision", default=None,
                   help="HF revision (commit) the drafter came from, for provenance (default: from the cache path)")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress output (default: progress on a terminal)")
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    bar = Progress("converting", unit="tensors", enabled=not args.quiet)

    def progress(i: int, n: int, name: str) -> None:
        bar.update(i, n, note=name)

    with bar:  # a failure ends the progress line before the error is printed
        out = convert_dflash(args.drafter_dir, args.target, args.out, outtype=args.outtype, force=args.force,
                             source_repo=args.source_repo, source_revision=args.source_revision, progress=progress)
    if not args.quiet:
        print(f"wrote {out} ({out.stat().st_size / 2**20:.1f} MiB)")
    return 0
