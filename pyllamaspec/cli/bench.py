"""`pyllamaspec bench`: measure speculative decoding against plain decoding, or re-render a recorded run.

The model placement, context/batch/threads and speculative flags are generate's (cli.flags); what the
benchmark does with them is pyllamaspec.bench.command.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from ..bench import command
from ..bench.equivalence import DEFAULT_MARGIN_TOLERANCE
from ..bench.plan import DEFAULT_REPEATS
from ..bench.workloads import CONTENT_CLASSES
from ..config import SessionConfig
from . import flags

_SWITCH = {"on": True, "off": False}
_REASONING = {"on": True, "off": False, "default": None}


def _csv(convert):
    def parse(text: str) -> list:
        try:
            return [convert(item.strip()) for item in text.split(",") if item.strip()]
        except (ValueError, KeyError) as error:
            raise argparse.ArgumentTypeError(f"invalid value in {text!r}: {error}") from None
    return parse


def register(sub) -> argparse.ArgumentParser:
    parser = sub.add_parser(
        "bench", help="benchmark speculative decoding against plain decoding",
        description="Measure decode speed of speculative arms against the plain arm, interleaved, with warm-ups "
                    "discarded, co-tenant detection, an exactness check and a device lock. Every arm decodes "
                    "greedily, so its output can be compared with plain decoding token for token.")
    measure = parser.add_argument_group("what to measure")
    measure.add_argument("-m", "--model", metavar="GGUF", help="target GGUF (default: none; required unless "
                                                                  "--from-json)")
    measure.add_argument("-md", "--spec-draft-model", "--model-draft", action="append", default=[], dest="drafters",
                         metavar="GGUF", help="drafter GGUF; repeat to compare drafters (e.g. quants): each becomes "
                                              "its own arm (default: none)")
    measure.add_argument("--drafter-label", action="append", default=[], dest="drafter_labels", metavar="LABEL",
                         help="label of each -md in order (default: file name)")
    measure.add_argument("--classes", type=_csv(str), default=list(CONTENT_CLASSES), metavar="CLASS[,CLASS...]",
                         help=f"content classes from {', '.join(CONTENT_CLASSES)} (default: all)")
    measure.add_argument("--depth", type=_csv(int), default=[0], metavar="N[,N...]",
                         help="context depths: filler tokens before the prompt (default: 0)")
    measure.add_argument("--repeat", type=int, default=DEFAULT_REPEATS, help="measured rounds (default: %(default)s)")
    measure.add_argument("-n", "--n-predict", type=int, default=128, help="tokens to generate (default: %(default)s)")
    measure.add_argument("-np", "--parallel", type=int, default=1,
                         help="streams per run, decoded together (the prompt and the class's next ones); tok/s "
                              "is their total (default: %(default)s)")
    measure.add_argument("--chat-template", type=_csv(_SWITCH.__getitem__), default=[True], metavar="on|off",
                         help="apply the chat template; a comma list sets it per arm, plain first (default: on)")
    measure.add_argument("--reasoning", type=_csv(_REASONING.__getitem__), default=[None],
                         metavar="on|off|default", help="enable_thinking for the template; a comma list sets it "
                                                        "per arm, plain first (default: default)")
    measure.add_argument("--force-mixed-modes", action="store_true",
                         help="compare arms even though their template/reasoning modes differ (default: refused)")
    measure.add_argument("--breakeven", action="store_true",
                         help="add a forced zero-acceptance twin per speculative arm and compute break-even depths "
                              "(default: off)")
    measure.add_argument("--margin-tolerance", type=float, default=DEFAULT_MARGIN_TOLERANCE,
                         help="top1-top2 logit margin below which a divergence from plain is a tie "
                              "(default: %(default)s)")
    measure.add_argument("--external-speculative-simple", nargs="?", const="auto", metavar="PATH",
                         help="also run upstream's llama-speculative-simple per speculative arm (no PATH: the "
                              "binary packaged in pyllamaspec/bin) (default: off)")
    measure.add_argument("--external-llama-cpp-python", action="store_true",
                         help="also run plain decoding through llama-cpp-python, as a ratio to our plain arm "
                              "(default: off)")
    flags.add_speculative_flags(parser, per_arm=True)
    flags.add_placement_flags(parser)
    flags.add_context_flags(parser, ctx_size_help="context size in tokens (default: just enough for the deepest "
                                                  "prompt and --n-predict, the same for every arm)")
    flags.add_sampling_flags(parser, seed_only=True)
    hygiene = parser.add_argument_group("measurement hygiene")
    hygiene.add_argument("--cotenant", choices=("refuse", "flag"), default="flag",
                         help="other processes on the device/CPUs: refuse to run, or run and mark every figure "
                              "(default: %(default)s)")
    hygiene.add_argument("--cotenant-ignore", action="append", default=[], metavar="NAME",
                         help="process name that is not a co-tenant; repeatable (default: none)")
    hygiene.add_argument("--lock", choices=("wait", "refuse", "none"), default="wait",
                         help="per-device lock: wait for it, refuse if held, or skip (default: %(default)s)")
    hygiene.add_argument("--lock-timeout", type=float, default=900.0,
                         help="seconds to wait for the lock (default: %(default)s)")
    hygiene.add_argument("--lock-device", type=_csv(str), default=None, metavar="NAME[,NAME...]",
                         help="devices to lock (default: the GPUs the build sees, or 'cpu' with -ngl 0)")
    hygiene.add_argument("--cooling-gate", type=float, default=None, metavar="C",
                         help="before every round, wait until the hottest GPU is below C degrees (default: off)")
    hygiene.add_argument("--cooling-max-wait", type=float, default=300.0, metavar="S",
                         help="longest wait for the cooling gate, in seconds (default: %(default)s)")
    output = parser.add_argument_group("output")
    output.add_argument("--json", type=Path, help="write the full record here (default: none)")
    output.add_argument("--md", type=Path, help="write a Markdown report here (default: stdout, if no --json)")
    output.add_argument("--plots", type=Path, metavar="DIR", help="write PNG plots here, needs matplotlib "
                                                                  "(default: none)")
    output.add_argument("--from-json", type=Path, metavar="PATH",
                        help="measure nothing: render --md/--plots from a recorded JSON (default: measure)")
    parser.set_defaults(func=run)
    return parser


def run_options(args: argparse.Namespace) -> command.RunOptions:
    """The shared flag groups as the benchmark's model and session options."""
    target, drafter = flags.model_configs(args)
    sampling = flags.sampling_settings(args)
    return command.RunOptions(target=target, drafter=drafter, session=flags.context_settings(args),
                              speculative=flags.speculative_settings(args),
                              seed=sampling.get("seed", SessionConfig.seed))


def run(args: argparse.Namespace) -> int:
    return command.run(args, run_options(args))
