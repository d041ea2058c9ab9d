"""`pyllamaspec synth`: synthetic GGUF models for tests and benchmarks (tools.synth)."""

from __future__ import annotations

import argparse
import math
import sys
import time

from ..errors import ConfigError
from ..tools.synth import PRESET_TABLE, TYPES, _resolve_type, plan_preset, write_preset


def register(sub) -> None:
    p = sub.add_parser(
        "synth", help="write synthetic GGUF models (random weights, real shapes) for tests and benchmarks",
        description="Write a random-weight GGUF of a real model's shape (a preset), directly in the requested type "
                    "and streamed on every core, so even 27B shapes need little memory and no F32 copy on disk. "
                    "With --drafter, also the drafter that pairs with it. Presets: " + ", ".join(
                        f"{n}{' (+ DFlash' + ('2' if p.drafter.version == 2 else '') + ' drafter)' if p.drafter else ''}"
                        for n, p in PRESET_TABLE.items()))
    p.add_argument("out", help="output GGUF path (the target)")
    p.add_argument("--preset", choices=sorted(PRESET_TABLE), default="tiny-qwen3",
                   help="model shape (default: %(default)s)")
    p.add_argument("--type", choices=TYPES, default=None,
                   help="weight type: f32, f16, q8_0 or q4_0 (norms and 1-D tensors stay F32, the LM head gets "
                        "llama-quantize's choice) (default: f32, 4 bytes a weight: 5.75 GiB for qwen2.5-1.5b; "
                        "f16 halves it, --dry-run prints the sizes)")
    p.add_argument("--f16", action="store_true", help="same as --type f16")
    p.add_argument("--drafter", metavar="OUT", default=None,
                   help="also write the preset's drafter here: its DFlash/DFlash2 drafter, or for presets without "
                        "one the target plus a second noise (a draft model that agrees often)")
    p.add_argument("--n-vocab", type=int, default=None, metavar="N",
                   help="vocabulary size instead of the preset's: a draft model must share its target's (e.g. 152064 "
                        "for a qwen2.5-0.5b drafter of the qwen2.5-7b shape)")
    p.add_argument("--seed", type=int, default=1, help="random seed of the weights (default: %(default)s)")
    p.add_argument("--stddev", type=float, default=None,
                   help="standard deviation of the weights (default: the preset's, 0.1 tiny, 0.02 real-scale)")
    p.add_argument("--perturb-seed", type=int, default=0,
                   help="non-zero: write the target plus a second noise of this seed (a draft model)")
    p.add_argument("--perturb-stddev", type=float, default=0.01,
                   help="standard deviation of the second noise (default: %(default)s)")
    p.add_argument("--threads", type=int, default=0, help="threads generating and quantizing (default 0: every core)")
    p.add_argument("--force", action="store_true", help="overwrite existing output files")
    p.add_argument("--dry-run", action="store_true",
                   help="print the plan (tensors, shapes, types, sizes, layer pattern) and write nothing")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    type = _resolve_type(args.type, args.f16)
    if args.perturb_seed and not args.perturb_stddev > 0:
        raise ConfigError("--perturb-stddev must be > 0 with --perturb-seed")
    if args.stddev is not None and not (math.isfinite(args.stddev) and args.stddev > 0):
        raise ConfigError(f"--stddev must be a finite number > 0, got {args.stddev}")
    if args.dry_run:
        target, drafter = plan_preset(args.preset, type, n_vocab=args.n_vocab)
        print(target.describe(f"target {args.out} ({args.preset})"))
        if PRESET_TABLE[args.preset].source:
            print(f"  sizes from: {PRESET_TABLE[args.preset].source}")
        if args.drafter:
            if drafter is None:
                drafter = target
            print(drafter.describe(f"drafter {args.drafter}"))
        return 0
    t0 = time.perf_counter()
    out, drafter_out = write_preset(args.out, args.preset, drafter_out=args.drafter, type=type, seed=args.seed,
                                    stddev=args.stddev, perturb_seed=args.perturb_seed,
                                    perturb_stddev=args.perturb_stddev, n_threads=args.threads, force=args.force,
                                    n_vocab=args.n_vocab)
    print(out)
    if drafter_out is not None:
        print(drafter_out)
    print(f"pyllamaspec synth: {args.preset} {type} in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    return 0
