"""What ``pyllamaspec bench`` does once its command line is parsed (pyllamaspec.cli.bench): arms from the
options, the checks that can fail before a lock is taken, the measurement under the device locks, and the
outputs. Every failure is a PyllamaspecError, reported by the command line."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.util import find_spec
from pathlib import Path

from pyllamaspec.bench.backends import PyllamaspecBackend
from pyllamaspec.bench.cotenant import DEFAULT_IGNORED_NAMES, CotenantDetector, GpuTelemetry
from pyllamaspec.bench.external import LlamaCppPythonBackend, SpeculativeSimpleBackend, packaged_speculative_simple
from pyllamaspec.bench.lock import DeviceLock
from pyllamaspec.bench.plan import PLAIN_ARM_NAME, Arm, PromptMode, check_modes, spec_arm_name
from pyllamaspec.bench.report import assemble, build_environment, load_json, render_markdown, write_json, write_plots
from pyllamaspec.bench.runner import BenchRunner, BenchSettings
from pyllamaspec.bench.workloads import CONTENT_CLASSES, load_prompt_set
from pyllamaspec.config import DRAFTER_TYPES, SPEC_TYPES, ModelConfig, SessionConfig
from pyllamaspec.errors import ConfigError
from pyllamaspec.ggufinfo import check_model_file
from pyllamaspec.progress import Progress

# A CPU run shares its cores with everything else: more than one runnable task on average beforehand is a tenant.
CPU_RUN_LOAD_THRESHOLD = 1.0


@dataclass(frozen=True)
class RunOptions:
    """How every arm loads its models and opens its sessions, from the shared flag groups (cli.flags)."""

    target: ModelConfig = field(default_factory=ModelConfig)
    drafter: ModelConfig = field(default_factory=ModelConfig)
    session: Mapping = field(default_factory=dict)      # SessionConfig fields for every arm
    speculative: Mapping = field(default_factory=dict)  # SessionConfig fields for the speculative arms
    seed: int = SessionConfig.seed

    @property
    def n_threads(self) -> int | None:
        return self.session.get("n_threads")


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
            combos += [(types, n_max, label, adaptive) for adaptive in dict.fromkeys(args.adaptive)
                       for label in (labels if needs_drafter else [None])]
    modes = [PromptMode(chat, reasoning) for chat, reasoning in zip(
        _per_arm(args.chat_template, 1 + len(combos), "--chat-template"),
        _per_arm(args.reasoning, 1 + len(combos), "--reasoning"), strict=True)]
    arms = [Arm(PLAIN_ARM_NAME, mode=modes[0])]
    synthetic = getattr(args, "synth_rates", None) is not None or getattr(args, "synth_len", None) is not None
    if synthetic and (args.external_speculative_simple or args.breakeven):
        raise ConfigError("synthetic acceptance (--spec-synth-rates/--spec-synth-len) runs in pyllamaspec's own "
                          "loop only: it cannot be combined with --external-speculative-simple or --breakeven")
    spec_arms = [Arm(spec_arm_name(types, n_max, label, adaptive if len(args.adaptive) > 1 else None), types, n_max,
                     label, mode=mode, adaptive=SessionConfig.adaptive if adaptive is None else adaptive,
                     synthetic=synthetic)
                 for (types, n_max, label, adaptive), mode in zip(combos, modes[1:], strict=True)]
    arms += spec_arms
    if args.breakeven:
        arms += [Arm(f"{arm.name}/forced-reject", arm.spec_types, arm.n_max, arm.drafter, force_reject=True,
                     mode=arm.mode, compare_to=arm.name, adaptive=False) for arm in spec_arms]
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
        check_model_file(path)
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


def _external_backends(args: argparse.Namespace, options: RunOptions, drafter_paths: Mapping[str, str]) -> dict:
    backends = {}
    common = {"n_gpu_layers": options.target.n_gpu_layers, "n_threads": options.n_threads, "seed": options.seed}
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


def _recorded_params(args: argparse.Namespace, options: RunOptions, arms: Sequence[Arm]) -> dict:
    return {"n_predict": args.n_predict, "repeats": args.repeat, "classes": args.classes, "depths": args.depth,
            "threads": options.n_threads, "n_gpu_layers": options.target.n_gpu_layers, "seed": options.seed,
            "n_ctx_requested": options.session.get("n_ctx"), "margin_tolerance": args.margin_tolerance,
            "parallel": args.parallel, "cooling_gate_c": args.cooling_gate, "arms": [arm.name for arm in arms],
            "target_model": _changed(options.target), "drafter_model": _changed(options.drafter),
            "session": dict(options.session), "speculative": dict(options.speculative)}


def _changed(config: ModelConfig) -> dict:
    """The ModelConfig fields that differ from the defaults."""
    default = ModelConfig()
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)
            if getattr(config, f.name) != getattr(default, f.name)}


def measure(args: argparse.Namespace, options: RunOptions) -> dict:
    validate(args)
    arms = build_arms(args)
    check_modes(arms, args.force_mixed_modes)  # fail before waiting for a lock; the runner checks again
    prompts = {content_class: load_prompt_set(content_class) for content_class in args.classes}
    drafter_paths = dict(zip(drafter_labels(args.drafters, args.drafter_labels), args.drafters, strict=True))
    session_options = {k: v for k, v in options.session.items() if k != "n_ctx"}  # the runner sizes the context
    session = PyllamaspecBackend(args.model, drafter_paths, n_gpu_layers=options.target.n_gpu_layers,
                                 seed=options.seed, target_options=_changed(options.target),
                                 drafter_options=_changed(options.drafter), session_options=session_options,
                                 speculative_options=dict(options.speculative))
    backends = {"session": session, **_external_backends(args, options, drafter_paths)}
    build_info = session.describe()
    settings = BenchSettings(
        classes=tuple(args.classes), depths=tuple(args.depth), repeats=args.repeat, n_predict=args.n_predict,
        cotenant_policy=args.cotenant, margin_tolerance=args.margin_tolerance, cooling_gate_c=args.cooling_gate,
        cooling_max_wait_s=args.cooling_max_wait, force_mixed_modes=args.force_mixed_modes,
        n_ctx=options.session.get("n_ctx"),
        parallel=args.parallel)
    ignored = sorted(DEFAULT_IGNORED_NAMES | set(args.cotenant_ignore))
    with contextlib.ExitStack() as stack:
        locks = []
        if args.lock != "none":
            # one global order, so two harnesses waiting for overlapping device sets cannot deadlock
            for device in sorted(args.lock_device or lock_devices(build_info, options.target.n_gpu_layers)):
                locks.append(stack.enter_context(DeviceLock(device, args.lock, args.lock_timeout)))
        for backend in backends.values():
            stack.callback(backend.close)  # models unloaded before the locks go (LIFO)
        detector = CotenantDetector(ignored_names=ignored,
                                    load_threshold=CPU_RUN_LOAD_THRESHOLD if options.target.n_gpu_layers == 0
                                    else None)
        with Progress("bench", unit="runs") as bar:
            runner = BenchRunner(arms, backends, session, prompts, settings, detector=detector,
                                 telemetry=GpuTelemetry(),
                                 progress=lambda done, total, what: bar.update(done, total, note=what))
            result = runner.run()
        lock_state = [lock.describe() for lock in locks]
    models = {"target": args.model, **{f"drafter {label}": path for label, path in drafter_paths.items()}}
    environment = build_environment(build_info=build_info, models=models,
                                    params=_recorded_params(args, options, arms),
                                    cotenant={"ignored_names": ignored}, locks=lock_state)
    return assemble(environment, result)


def write_outputs(document: dict, args: argparse.Namespace) -> None:
    if args.json:
        write_json(document, args.json)
    if args.md:
        args.md.write_text(render_markdown(document))
    elif not args.json and not args.plots:
        sys.stdout.write(render_markdown(document))
    if args.plots:
        write_plots(document, args.plots)


def run(args: argparse.Namespace, options: RunOptions) -> int:
    """Measure (or re-render --from-json) and write the outputs; failures raise PyllamaspecError."""
    document = load_json(args.from_json) if args.from_json else measure(args, options)
    write_outputs(document, args)
    return 0
