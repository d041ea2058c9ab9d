"""`pyllamaspec synth`: synthetic GGUF models for tests and benchmarks (tools.synth)."""

from __future__ import annotations

import argparse

from ..errors import ConfigError
from ..tools.synth import PRESETS, write_target


def register(sub) -> None:
    p = sub.add_parser("synth", help="write synthetic GGUF models (random weights, real shapes) for tests and "
                                     "benchmarks",
                       description="Write a model of a real architecture and shape with seeded random weights; "
                                   "with --perturb-seed, a noisy copy of it that drafts for it (a draft model).")
    p.add_argument("out", help="output GGUF path")
    p.add_argument("--preset", choices=sorted(PRESETS), default="tiny-qwen3",
                   help="architecture and shape (default: %(default)s)")
    p.add_argument("--seed", type=int, default=1, help="seed of the weights (default: %(default)s)")
    p.add_argument("--stddev", type=float, default=0.1, help="standard deviation of the weights (default: %(default)s)")
    p.add_argument("--perturb-seed", type=int, default=0,
                   help="non-zero: a noisy copy of the seed's model, i.e. a draft model (default: %(default)s)")
    p.add_argument("--perturb-stddev", type=float, default=0.01,
                   help="standard deviation of that noise (default: %(default)s)")
    p.add_argument("--f16", action="store_true", help="write F16 weights (default: F32)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.perturb_seed and args.perturb_stddev <= 0:
        raise ConfigError("--perturb-stddev must be > 0 with --perturb-seed")
    path = write_target(args.out, PRESETS[args.preset], seed=args.seed, stddev=args.stddev,
                        perturb_seed=args.perturb_seed, perturb_stddev=args.perturb_stddev, f16=args.f16)
    print(path)
    return 0
