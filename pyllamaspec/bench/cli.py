"""``pyllamaspec bench``: measure speculative decoding against plain decoding, or re-render a recorded run.

Wired into the main CLI with ``register(subparsers)``; ``run(args)`` returns the exit status (2 on any error,
reported as one line on stderr).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Mapping, Sequence
from importlib.util import find_spec
from pathlib import Path

from pyllamaspec.bench.backends import PyllamaspecBackend
from pyllamaspec.bench.cotenant import DEFAULT_IGNORED_NAMES, CotenantDetector, GpuTelemetry
from pyllamaspec.bench.equivalence import DEFAULT_MARGIN_TOLERANCE
from pyllamaspec.bench.external import LlamaCppPythonBackend, SpeculativeSimpleBackend, packaged_speculative_simple
from pyllamaspec.bench.lock import DeviceLock
from pyllamaspec.bench.plan import (DEFAULT_REPEATS, PLAIN_ARM_NAME, Arm, PromptMode,
                                    check_modes, spec_arm_name)
from pyllamaspec.bench.report import assemble, build_environment, load_json, render_markdown, write_json, write_plots
from pyllamaspec.bench.runner import BenchRunner, BenchSettings
from pyllamaspec.bench.workloads import CONTENT_CLASSES, load_prompt_set
from pyllamaspec.config import DRAFTER_TYPES, SPEC_TYPES
from pyllamaspec.errors import ConfigError, PyllamaspecError
from pyllamaspec.progress import Progress

# A CPU run shares its cores with everything else: more than one runnable task on average beforehand is a tenant.
CPU_RUN_LOAD_THRESHOLD = 1.0

_SWITCH = {"on": True, "off": False}
_REASONING = {"on": True, "off": False, "default": None}


def _csv(convert):
    def parse(text: str) -> list:
        try:
            return [convert(item.strip()) for item in text.split(",") if item.strip()]
        except (ValueError, KeyError) as error:
            raise argparse.ArgumentTypeError(f"invalid value in {text!r}: {error}") from None
    return parse


def register(subparsers) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "bench", help="benchmark speculative decoding against plain decoding",
        description="Measure decode speed of speculative arms against the plain arm, interleaved, with warm-ups "
                    "discarded, co-tenant detection, an exactness check and a device lock.")
    measure = parser.add_argument_group("what to measure")
    measure.add_argument("-m", "--model", help="target GGUF")
    measure.add_argument("-md", "--model-draft", action="append", default=[], dest="drafters", metavar="GGUF",
                         help="drafter GGUF; repeat to compare drafters (e.g. quants): each becomes its own arm")
    measure.add_argument("--drafter-label", action="append", default=[], dest="drafter_labels", metavar="LABEL",
                         help="label of each -md in order (default: file name)")
    measure.add_argument("--spec-type", type=_csv(str), default=[], metavar="TYPE[,TYPE...]",
                         help="one arm per item (join types with '+' to combine them in one arm); the plain arm "
                              "is always included")
    measure.add_argument("--spec-draft-n-max", type=_csv(int), default=[None], metavar="N[,N...]",
                         help="one arm per value and spec type (default: the session default)")
    measure.add_argument("--classes", type=_csv(str), default=list(CONTENT_CLASSES), metavar="CLASS[,CLASS...]",
                         help=f"content classes from {', '.join(CONTENT_CLASSES)} (default: all)")
    measure.add_argument("--depth", type=_csv(int), default=[0], metavar="N[,N...]",
                         help="context depths: filler tokens before the prompt (default: 0)")
    measure.add_argument("--repeat", type=int, default=DEFAULT_REPEATS, help="measured rounds (default: %(default)s)")
    measure.add_argument("--n-predict", type=int, default=128, help="tokens to generate (default: %(default)s)")
    measure.add_argument("--chat-template", type=_csv(_SWITCH.__getitem__), default=[True], metavar="on|off",
                         help="apply the chat template; a comma list sets it per arm (plain first)")
    measure.add_argument("--reasoning", type=_csv(_REASONING.__getitem__), default=[None],
                         metavar="on|off|default", help="enable_thinking for the template; a comma list sets it "
                                                        "per arm (plain first)")
    measure.add_argument("--force-mixed-modes", action="store_true",
                         help="compare arms even though their template/reasoning modes differ")
    measure.add_argument("--breakeven", action="store_true",
                         help="add a forced zero-acceptance twin per speculative arm and compute break-even depths")
    measure.add_argument("--margin-tolerance", type=float, default=DEFAULT_MARGIN_TOLERANCE,
                         help="top1-top2 logit margin below which a divergence from plain is a tie "
                              "(default: %(default)s)")
    measure.add_argument("--external-speculative-simple", nargs="?", const="auto", metavar="PATH",
                         help="also run upstream's llama-speculative-simple per speculative arm (no PATH: the "
                              "binary packaged in pyllamaspec/bin)")
    measure.add_argument("--external-llama-cpp-python", action="store_true",
                         help="also run plain decoding through llama-cpp-python, as a ratio to our plain arm")
    runtime = parser.add_argument_group("runtime")
    runtime.add_argument("--threads", type=int, default=None)
    runtime.add_argument("-ngl", "--n-gpu-layers", type=int, default=-1, dest="n_gpu_layers")
    runtime.add_argument("--n-ctx", type=int, default=None, help="context size (default: just enough)")
    runtime.add_argument("-np", "--parallel", type=int, default=1,
                         help="streams per run, decoded together (the prompt and the class's next ones); tok/s "
                              "is their total (default: %(default)s)")
    runtime.add_argument("--seed", type=int, default=0)
    hygiene = parser.add_argument_group("measurement hygiene")
    hygiene.add_argument("--cotenant", choices=("refuse", "flag"), default="flag",
                         help="other processes on the device/CPUs: refuse to run, or run and mark every figure "
                              "(default: %(default)s)")
    hygiene.add_argument("--cotenant-ignore", action="append", default=[], metavar="NAME",
                         help="process name that is not a co-tenant (repeatable)")
    hygiene.add_argument("--lock", choices=("wait", "refuse", "none"), default="wait",
                         help="per-device lock: wait for it, refuse if held, or skip (default: %(default)s)")
    hygiene.add_argument("--lock-timeout", type=float, default=900.0, help="seconds to wait for the lock")
    hygiene.add_argument("--lock-device", type=_csv(str), default=None, metavar="NAME[,NAME...]",
                         help="devices to lock (default: the GPUs the build sees, or 'cpu' with -ngl 0)")
    hygiene.add_argument("--cooling-gate", type=float, default=None, metavar="C",
                         help="before every round, wait until the hottest GPU is below C degrees")
    hygiene.add_argument("--cooling-max-wait", type=float, default=300.0, metavar="S")
    output = parser.add_argument_group("output")
    output.add_argument("--json", type=Path, help="write the full record here")
    output.add_argument("--md", type=Path, help="write a Markdown report here (default: stdout, if no --json)")
    output.add_argument("--plots", type=Path, metavar="DIR", help="write PNG plots here (needs matplotlib)")
    output.add_argument("--from-json", type=Path, metavar="PATH",
                        help="measure nothing: render --md/--plots from a recorded JSON")
    parser.set_defaults(func=run)
    return parser


def _per_arm(values: Sequence, n_arms: int, option: str) -> list:
    if len(values) == 1:
        return list(values) * n_arms
    if len(values) != n_arms:
        raise ConfigError(f"{option} takes one value or one per arm ({n_arms}: plain first), got {len(values)}")
    return list(values)


def drafter_labels(drafters: Sequence[str], labels: Sequence[str]) -> list[str]:
    if labels and len(labels) != len(drafters):
        raise ConfigError(f"--drafter-label was given {len(labels)} times for {len(drafters)} -md files")
    chosen = list(labels) or [Path(path).stem for path in drafters]
    if len(set(chosen)) != len(chosen):
        raise ConfigError(f"drafter labels must be distinct, got {chosen}; use --drafter-label")
    return chosen


def build_arms(args: argparse.Namespace) -> list[Arm]:
    """Plain, one session arm per (spec type, n_max, drafter), then forced-reject twins and external arms."""
    labels = drafter_labels(args.drafters, args.drafter_labels)
    combos = []
    for item in args.spec_type:
        types = tuple(item.split("+"))
        unknown = [name for name in types if name not in SPEC_TYPES or name == "none"]
        if unknown:
            raise ConfigError(f"unknown spec type {unknown[0]!r} (the plain arm is always included); choose from "
                              f"{', '.join(SPEC_TYPES[1:])}")
        needs_drafter = any(name in DRAFTER_TYPES for name in types)
        if needs_drafter and not labels:
            raise ConfigError(f"spec type {item} needs a drafter model: give -md GGUF")
        for n_max in args.spec_draft_n_max:
            if n_max is not None and n_max < 1:
                raise ConfigError(f"--spec-draft-n-max must be at least 1, got {n_max}")
            combos += [(types, n_max, label) for label in (labels if needs_drafter else [None])]
    modes = [PromptMode(chat, reasoning) for chat, reasoning in zip(
        _per_arm(args.chat_template, 1 + len(combos), "--chat-template"),
        _per_arm(args.reasoning, 1 + len(combos), "--reasoning"), strict=True)]
    arms = [Arm(PLAIN_ARM_NAME, mode=modes[0])]
    spec_arms = [Arm(spec_arm_name(types, n_max, label), types, n_max, label, mode=mode)
                 for (types, n_max, label), mode in zip(combos, modes[1:], strict=True)]
    arms += spec_arms
    if args.breakeven:
        arms += [Arm(f"{arm.name}/forced-reject", arm.spec_types, arm.n_max, arm.drafter, force_reject=True,
                     mode=arm.mode, compare_to=arm.name) for arm in spec_arms]
    if args.external_speculative_simple:
        arms += [Arm(f"upstream:{arm.name}", arm.spec_types, arm.n_max, arm.drafter, kind="speculative-simple",
                     mode=arm.mode, compare_to=arm.name) for arm in spec_arms]
    if args.external_llama_cpp_python:
        arms.append(Arm("llama-cpp-python", kind="llama-cpp-python", mode=modes[0], compare_to=PLAIN_ARM_NAME))
    names = [arm.name for arm in arms]
    duplicates = sorted({name for name in names if names.count(name) > 1})
    if duplicates:
        raise ConfigError(f"arm {duplicates[0]} is listed twice")
    return arms


def validate(args: argparse.Namespace) -> None:
    if not args.model:
        raise ConfigError("give the target model with -m GGUF (or --from-json to re-render a recorded run)")
    for path in [args.model, *args.drafters]:
        if not Path(path).is_file():
            raise ConfigError(f"model file {path} does not exist")
    unknown = [name for name in args.classes if name not in CONTENT_CLASSES]
    if unknown or not args.classes:
        raise ConfigError(f"--classes takes {', '.join(CONTENT_CLASSES)}; got {', '.join(args.classes) or 'none'}")
    if any(depth < 0 for depth in args.depth) or not args.depth:
        raise ConfigError(f"--depth takes non-negative token counts, got {args.depth}")
    if args.repeat < 1 or args.n_predict < 2:
        raise ConfigError("--repeat must be at least 1 and --n-predict at least 2")
    if args.parallel < 1:
        raise ConfigError(f"--parallel must be at least 1, got {args.parallel}")
    if args.parallel > 1 and (args.external_speculative_simple or args.external_llama_cpp_python):
        raise ConfigError("external arms run one stream at a time; --parallel cannot be combined with them")


def lock_devices(build_info: Mapping, n_gpu_layers: int) -> list[str]:
    """The devices a run occupies: every GPU the build sees (models are split across them), or the CPU."""
    if n_gpu_layers == 0:
        return ["cpu"]
    gpus = [device["name"] for device in build_info.get("devices") or [] if device.get("type") in ("gpu", "igpu")]
    return gpus or ["cpu"]


def _external_backends(args: argparse.Namespace, drafter_paths: Mapping[str, str]) -> dict:
    backends = {}
    common = {"n_gpu_layers": args.n_gpu_layers, "n_threads": args.threads, "seed": args.seed}
    if args.external_speculative_simple:
        binary = (packaged_speculative_simple() if args.external_speculative_simple == "auto"
                  else Path(args.external_speculative_simple))
        if binary is None or not os.access(binary, os.X_OK):
            raise ConfigError(f"llama-speculative-simple not found ({binary or 'not packaged in pyllamaspec/bin'}); "
                              f"give its path to --external-speculative-simple")
        backends["speculative-simple"] = SpeculativeSimpleBackend(binary, args.model, drafter_paths, **common)
    if args.external_llama_cpp_python:
        if find_spec("llama_cpp") is None:
            raise ConfigError("--external-llama-cpp-python: llama-cpp-python is not installed")
        backends["llama-cpp-python"] = LlamaCppPythonBackend(args.model, **common)
    return backends


def _recorded_params(args: argparse.Namespace, arms: Sequence[Arm]) -> dict:
    return {"n_predict": args.n_predict, "repeats": args.repeat, "classes": args.classes, "depths": args.depth,
            "threads": args.threads, "n_gpu_layers": args.n_gpu_layers, "seed": args.seed,
            "n_ctx_requested": args.n_ctx, "margin_tolerance": args.margin_tolerance, "parallel": args.parallel,
            "cooling_gate_c": args.cooling_gate, "arms": [arm.name for arm in arms]}


def _measure(args: argparse.Namespace) -> dict:
    validate(args)
    arms = build_arms(args)
    check_modes(arms, args.force_mixed_modes)  # fail before waiting for a lock; the runner checks again
    prompts = {content_class: load_prompt_set(content_class) for content_class in args.classes}
    drafter_paths = dict(zip(drafter_labels(args.drafters, args.drafter_labels), args.drafters, strict=True))
    session = PyllamaspecBackend(args.model, drafter_paths, n_gpu_layers=args.n_gpu_layers, n_threads=args.threads,
                                 seed=args.seed)
    backends = {"session": session, **_external_backends(args, drafter_paths)}
    build_info = session.describe()
    settings = BenchSettings(
        classes=tuple(args.classes), depths=tuple(args.depth), repeats=args.repeat, n_predict=args.n_predict,
        cotenant_policy=args.cotenant, margin_tolerance=args.margin_tolerance, cooling_gate_c=args.cooling_gate,
        cooling_max_wait_s=args.cooling_max_wait, force_mixed_modes=args.force_mixed_modes, n_ctx=args.n_ctx,
        parallel=args.parallel)
    ignored = sorted(DEFAULT_IGNORED_NAMES | set(args.cotenant_ignore))
    with contextlib.ExitStack() as stack:
        locks = []
        if args.lock != "none":
            # one global order, so two harnesses waiting for overlapping device sets cannot deadlock
            for device in sorted(args.lock_device or lock_devices(build_info, args.n_gpu_layers)):
                locks.append(stack.enter_context(DeviceLock(device, args.lock, args.lock_timeout)))
        for backend in backends.values():
            stack.callback(backend.close)  # models unloaded before the locks go (LIFO)
        detector = CotenantDetector(ignored_names=ignored,
                                    load_threshold=CPU_RUN_LOAD_THRESHOLD if args.n_gpu_layers == 0 else None)
        with Progress("bench", unit="runs") as bar:
            runner = BenchRunner(arms, backends, session, prompts, settings, detector=detector,
                                 telemetry=GpuTelemetry(),
                                 progress=lambda done, total, what: bar.update(done, total, note=what))
            result = runner.run()
        lock_state = [lock.describe() for lock in locks]
    models = {"target": args.model, **{f"drafter {label}": path for label, path in drafter_paths.items()}}
    environment = build_environment(build_info=build_info, models=models, params=_recorded_params(args, arms),
                                    cotenant={"ignored_names": ignored}, locks=lock_state)
    return assemble(environment, result)


def _write_outputs(document: dict, args: argparse.Namespace) -> None:
    if args.json:
        write_json(document, args.json)
    if args.md:
        args.md.write_text(render_markdown(document))
    elif not args.json and not args.plots:
        sys.stdout.write(render_markdown(document))
    if args.plots:
        write_plots(document, args.plots)


def run(args: argparse.Namespace) -> int:
    try:
        document = load_json(args.from_json) if args.from_json else _measure(args)
        _write_outputs(document, args)
    except (PyllamaspecError, OSError) as error:
        print(f"pyllamaspec bench: error: {error}", file=sys.stderr)
        return 2
    return 0
