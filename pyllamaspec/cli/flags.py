"""Flag groups shared by `generate` and `bench`, spelled as llama.cpp spells them, and their mapping onto
ModelConfig / SessionConfig.

Every flag defaults to None, meaning "the configuration's default": the default shown in --help is read from
the ModelConfig / SessionConfig field, so the API and the command line cannot disagree on it.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Any

from ..config import DEFAULT_N_MAX, KV_CACHE_TYPES, SPLIT_MODES, ModelConfig, SessionConfig
from ..errors import ConfigError

_FLASH_ATTN = {"on": True, "off": False, "auto": None}
_ON_OFF = {"on": True, "off": False}


def _default(config: type, name: str) -> Any:
    return {f.name: f.default for f in dataclasses.fields(config)}[name]


def _shown(config: type, name: str) -> str:
    value = _default(config, name)
    return "none" if value is None else str(value)


def csv_floats(text: str) -> list[float]:
    try:
        return [float(x) for x in text.replace("/", ",").split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers") from None


def csv_strings(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def add_placement_flags(parser: argparse.ArgumentParser) -> None:
    """How the target and the drafter are loaded and placed (ModelConfig)."""
    g = parser.add_argument_group("model placement")
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", dest="n_gpu_layers", type=int, default=None, metavar="N",
                   help=f"target layers on the GPUs; -1: all, 0: CPU only (default: "
                        f"{_shown(ModelConfig, 'n_gpu_layers')})")
    g.add_argument("-ngld", "--spec-draft-ngl", "--gpu-layers-draft", dest="n_gpu_layers_draft", type=int,
                   default=None, metavar="N", help="drafter layers on the GPUs (default: as -ngl)")
    g.add_argument("-dev", "--device", dest="devices", type=csv_strings, default=None, metavar="DEV[,DEV...]",
                   help="devices for the target, e.g. CUDA0; 'none': CPU only (default: every device)")
    g.add_argument("-devd", "--spec-draft-device", "--device-draft", dest="devices_draft", type=csv_strings,
                   default=None, metavar="DEV[,DEV...]",
                   help="devices for the drafter (default: with more than one device, the one holding the target's "
                        "output layer; otherwise every device)")
    g.add_argument("--rpc", dest="rpc", default=None, metavar="HOST:PORT[,...]",
                   help="rpc-servers (pyllamaspec rpc-server) whose devices join placement as RPC0, RPC1, ... in "
                        "this order; -dev/-ts place layers on them (default: none)")
    g.add_argument("-sm", "--split-mode", dest="split_mode", choices=list(SPLIT_MODES), default=None,
                   help=f"how the target is split across GPUs (default: {_shown(ModelConfig, 'split_mode')})")
    g.add_argument("-ts", "--tensor-split", dest="tensor_split", type=csv_floats, default=None, metavar="P[,P...]",
                   help="proportions of the target per GPU, e.g. 3,1 (default: by free memory)")
    g.add_argument("-ot", "--override-tensor", dest="tensor_overrides", action="append", default=None,
                   metavar="PATTERN=BUFFER_TYPE", help="keep the target's tensors matching PATTERN in BUFFER_TYPE, "
                                                       "e.g. exps=CPU; repeatable (default: none)")
    g.add_argument("-otd", "--spec-draft-override-tensor", dest="tensor_overrides_draft", action="append",
                   default=None, metavar="PATTERN=BUFFER_TYPE", help="the same for the drafter (default: none)")
    g.add_argument("--n-cpu-moe", dest="n_cpu_moe", type=int, default=None, metavar="N",
                   help=f"keep the MoE experts of the first N target layers on the CPU (default: "
                        f"{_shown(ModelConfig, 'n_cpu_moe')})")
    g.add_argument("--no-mmap", dest="use_mmap", action="store_const", const=False, default=None,
                   help="read the models into memory instead of mapping them (default: mapped)")


def model_configs(args: argparse.Namespace) -> tuple[ModelConfig, ModelConfig]:
    """The target's and the drafter's ModelConfig from the placement flags. The drafter takes -ngl unless
    -ngld is given; --no-mmap applies to both."""
    target = _given(args, {"n_gpu_layers": "n_gpu_layers", "devices": "devices", "split_mode": "split_mode",
                           "tensor_split": "tensor_split", "tensor_overrides": "tensor_overrides",
                           "n_cpu_moe": "n_cpu_moe", "use_mmap": "use_mmap", "rpc": "rpc"})
    drafter = _given(args, {"n_gpu_layers_draft": "n_gpu_layers", "devices_draft": "devices",
                            "tensor_overrides_draft": "tensor_overrides", "use_mmap": "use_mmap", "rpc": "rpc"})
    if "n_gpu_layers" not in drafter and "n_gpu_layers" in target:
        drafter["n_gpu_layers"] = target["n_gpu_layers"]
    return ModelConfig(**target), ModelConfig(**drafter)


def add_context_flags(parser: argparse.ArgumentParser, *, ctx_size_help: str | None = None) -> None:
    """Context, batches, threads, KV cache types, flash attention (SessionConfig)."""
    g = parser.add_argument_group("context, batch and threads")
    g.add_argument("-c", "--ctx-size", dest="n_ctx", type=int, default=None, metavar="N",
                   help=ctx_size_help or f"context size in tokens, shared by all streams (default: "
                                         f"{_shown(SessionConfig, 'n_ctx')})")
    g.add_argument("-b", "--batch-size", dest="n_batch", type=int, default=None, metavar="N",
                   help=f"logical batch size (default: {_shown(SessionConfig, 'n_batch')})")
    g.add_argument("-ub", "--ubatch-size", dest="n_ubatch", type=int, default=None, metavar="N",
                   help=f"physical batch size (default: {_shown(SessionConfig, 'n_ubatch')})")
    g.add_argument("-t", "--threads", dest="n_threads", type=int, default=None, metavar="N",
                   help="threads for generation (default: the CPU cores useful for math, as llama.cpp's tools "
                        "count them)")
    g.add_argument("-tb", "--threads-batch", dest="n_threads_batch", type=int, default=None, metavar="N",
                   help="threads for prompt processing (default: as --threads)")
    g.add_argument("-td", "--threads-draft", dest="n_threads_draft", type=int, default=None, metavar="N",
                   help="threads of the drafter (default: as --threads and --threads-batch)")
    types = ", ".join(KV_CACHE_TYPES)
    for short, long, name, whose in (("-ctk", "--cache-type-k", "cache_type_k", "target's K"),
                                     ("-ctv", "--cache-type-v", "cache_type_v", "target's V"),
                                     ("-ctkd", "--cache-type-k-draft", "cache_type_k_draft", "drafter's K"),
                                     ("-ctvd", "--cache-type-v-draft", "cache_type_v_draft", "drafter's V")):
        g.add_argument(short, long, dest=name, default=None, metavar="TYPE",
                       help=f"type of the {whose} cache: {types} (default: {_shown(SessionConfig, name)})")
    g.add_argument("-fa", "--flash-attn", dest="flash_attn", choices=list(_FLASH_ATTN), default=None,
                   help="flash attention (default: auto)")
    g.add_argument("--kv-window", dest="kv_window", type=int, default=None, metavar="N",
                   help="the KV cache's view grows in steps of N cells, a power of two 256..65536: a GPU captures a "
                        "batch size's graph again at each step (default: 1024 where the target's output layer is on a "
                        "GPU, else 256)")


def add_speculative_flags(parser: argparse.ArgumentParser, *, per_arm: bool = False) -> None:
    """What drafts and how much (SessionConfig). With per_arm (bench), --spec-type and --spec-draft-n-max take
    comma lists, one arm per item."""
    g = parser.add_argument_group("speculative decoding")
    if per_arm:
        g.add_argument("--spec-type", dest="spec_type", type=csv_strings, default=[], metavar="TYPE[,TYPE...]",
                       help="one arm per item (join types with '+' to combine them in one arm); the plain arm is "
                            "always included (default: the plain arm only)")
        g.add_argument("--spec-draft-n-max", dest="spec_draft_n_max", type=_csv_ints, default=[None],
                       metavar="N[,N...]", help=f"draft tokens per step; one arm per value and spec type "
                                                f"(default: {DEFAULT_N_MAX})")
    else:
        g.add_argument("--spec-type", dest="spec_type", default=None, metavar="TYPE[,TYPE...]",
                       help="llama.cpp speculative types: draft-simple, draft-dflash, draft-mtp, draft-eagle3, "
                            "draft-dspark, ngram-mod, ngram-simple, ... (default: detected from the drafter; "
                            "none without one)")
        g.add_argument("--spec-draft-n-max", dest="spec_draft_n_max", type=int, default=None, metavar="N",
                       help=f"draft tokens per step (default: {DEFAULT_N_MAX})")
    adaptive_default = "on" if _default(SessionConfig, "adaptive") else "off"
    if per_arm:
        g.add_argument("--spec-adaptive", dest="adaptive", type=_csv_on_off, default=[None], metavar="on|off[,...]",
                       help="on: each step's draft length is chosen (0 included) from measured costs, under "
                            "--spec-draft-n-max; off: n-max tokens every step; 'on,off' measures both as arms "
                            f"(default: {adaptive_default})")
    else:
        g.add_argument("--spec-adaptive", dest="adaptive", choices=list(_ON_OFF), default=None,
                       help="on: choose each step's draft length (0 included) from measured costs, with "
                            "--spec-draft-n-max as the ceiling; off: draft --spec-draft-n-max tokens every step "
                            f"(default: {adaptive_default})")
    cost_default = "on" if _default(SessionConfig, "cost_cache") else "off"
    g.add_argument("--spec-cost-cache", dest="cost_cache", choices=list(_ON_OFF), default=None,
                   help="on: the adaptive choice starts from the costs measured by an earlier run of the same setup "
                        "on this machine and keeps what this run measures (a small file per setup under the cache "
                        f"directory; PYLLAMASPEC_COST_CACHE names another, or 'off') (default: {cost_default})")
    g.add_argument("--spec-synth-rates", dest="synth_rates", type=csv_floats, default=None, metavar="P[,P...]",
                   help="speed measurement only, the output is not the model's: accept draft position i with "
                        "probability P_i (non-increasing) instead of checking it (default: real verification)")
    g.add_argument("--spec-synth-len", dest="synth_len", type=float, default=None, metavar="L",
                   help="speed measurement only: synthetic acceptance with this mean accepted length "
                        "(default: real verification)")
    g.add_argument("--spec-draft-n-min", dest="n_min", type=int, default=None, metavar="N",
                   help=f"fewest draft tokens worth verifying (default: {_shown(SessionConfig, 'n_min')})")
    g.add_argument("--spec-draft-p-min", dest="p_min", type=float, default=None, metavar="P",
                   help=f"stop drafting below this draft probability (default: {_shown(SessionConfig, 'p_min')})")
    for flag, name, what in (("--spec-ngram-size-n", "ngram_size_n", "n-gram length looked up"),
                             ("--spec-ngram-size-m", "ngram_size_m", "tokens drafted per n-gram match"),
                             ("--spec-ngram-min-hits", "ngram_min_hits", "hits before an n-gram is drafted"),
                             ("--spec-ngram-mod-n-match", "ngram_mod_n_match", "ngram-mod: match length"),
                             ("--spec-ngram-mod-n-min", "ngram_mod_n_min", "ngram-mod: fewest draft tokens"),
                             ("--spec-ngram-mod-n-max", "ngram_mod_n_max", "ngram-mod: most draft tokens")):
        g.add_argument(flag, dest=name, type=int, default=None, metavar="N",
                       help=f"{what}; 0: upstream's value (default: {_shown(SessionConfig, name)})")


def add_sampling_flags(parser: argparse.ArgumentParser, *, seed_only: bool = False,
                       temp_default: str | None = None) -> None:
    """How the target samples (SessionConfig). seed_only: a command that always decodes greedily; temp_default: the
    default --temp shows, for a command whose default is not SessionConfig's (the server's)."""
    g = parser.add_argument_group("sampling")
    if not seed_only:
        g.add_argument("--temp", dest="temp", type=float, default=None, metavar="T",
                       help=f"temperature; <= 0: greedy (default: {temp_default or _shown(SessionConfig, 'temp')})")
        g.add_argument("--top-k", dest="top_k", type=int, default=None, metavar="K",
                       help=f"top-k sampling; <= 0: off (default: {_shown(SessionConfig, 'top_k')})")
        g.add_argument("--top-p", dest="top_p", type=float, default=None, metavar="P",
                       help=f"top-p sampling (default: {_shown(SessionConfig, 'top_p')})")
        g.add_argument("--min-p", dest="min_p", type=float, default=None, metavar="P",
                       help=f"min-p sampling (default: {_shown(SessionConfig, 'min_p')})")
    g.add_argument("-s", "--seed", dest="seed", type=int, default=None, metavar="N",
                   help=f"sampling seed; {_default(SessionConfig, 'seed')} picks one at random "
                        f"(default: {_shown(SessionConfig, 'seed')})")
    g.add_argument("-bs", "--backend-sampling", dest="backend_sampling", action="store_const", const=True, default=None,
                   help="sample greedy rows on the device that holds the target's output layer, a CPU included "
                        "(default: on where that device is a GPU)")
    g.add_argument("--no-backend-sampling", dest="backend_sampling", action="store_const", const=False,
                   help="sample every row on the host, from its logits (default: as --backend-sampling says)")
    if not seed_only:
        add_output_shape_flags(g)


def add_output_shape_flags(g) -> None:
    """A grammar or JSON schema the output follows, the repetition penalties and logit biases (llama.cpp's names)."""
    g.add_argument("--grammar", default=None, metavar="GRAMMAR",
                   help="GBNF grammar the output follows (rule 'root') (default: none)")
    g.add_argument("--grammar-file", default=None, metavar="FILE", help="read the GBNF grammar from FILE (default: none)")
    g.add_argument("-j", "--json-schema", default=None, metavar="SCHEMA",
                   help="JSON schema the output follows, e.g. '{}' for any JSON object (default: none)")
    g.add_argument("-jf", "--json-schema-file", default=None, metavar="FILE", help="read the JSON schema from FILE (default: none)")
    g.add_argument("--repeat-penalty", dest="repeat_penalty", type=float, default=None, metavar="N",
                   help=f"penalize repeated tokens; 1: off (default: {_shown(SessionConfig, 'repeat_penalty')})")
    g.add_argument("--repeat-last-n", dest="repeat_last_n", type=int, default=None, metavar="N",
                   help=f"tokens the penalties look back on; -1: the context "
                        f"(default: {_shown(SessionConfig, 'repeat_last_n')})")
    g.add_argument("--presence-penalty", dest="presence_penalty", type=float, default=None, metavar="N",
                   help=f"presence penalty; 0: off (default: {_shown(SessionConfig, 'presence_penalty')})")
    g.add_argument("--frequency-penalty", dest="frequency_penalty", type=float, default=None, metavar="N",
                   help=f"frequency penalty; 0: off (default: {_shown(SessionConfig, 'frequency_penalty')})")
    g.add_argument("-l", "--logit-bias", dest="logit_bias", action="append", default=None,
                   metavar="TOKEN_ID(+/-)BIAS",
                   help="add BIAS to a token's logit, e.g. '15043+1' or '15043-inf' to ban it (repeatable) (default: none)")


_MAX_GRAMMAR_BYTES = 16 << 20


def output_shape_settings(args: argparse.Namespace) -> dict[str, Any]:
    """SessionConfig's grammar / json_schema, penalties and logit biases from the flags that were given."""
    from ..textfiles import read_text_file

    settings = _given(args, {name: name for name in ("repeat_penalty", "repeat_last_n", "presence_penalty",
                                                      "frequency_penalty")})
    pairs = (("grammar", "--grammar"), ("grammar_file", "--grammar-file"), ("json_schema", "--json-schema"),
             ("json_schema_file", "--json-schema-file"))
    given = [flag for name, flag in pairs if getattr(args, name, None) is not None]
    if len(given) > 1:
        raise ConfigError(f"give one of {', '.join(given)}: each sets the output's format")
    if getattr(args, "grammar", None) is not None:
        settings["grammar"] = args.grammar
    if getattr(args, "grammar_file", None) is not None:
        settings["grammar"] = read_text_file(args.grammar_file, "grammar file", _MAX_GRAMMAR_BYTES, "give --grammar-file")
    if getattr(args, "json_schema", None) is not None:
        settings["json_schema"] = args.json_schema
    if getattr(args, "json_schema_file", None) is not None:
        settings["json_schema"] = read_text_file(args.json_schema_file, "JSON schema file", _MAX_GRAMMAR_BYTES,
                                                 "give --json-schema-file")
    if getattr(args, "logit_bias", None):
        bias = {}
        for item in args.logit_bias:
            m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*", item)
            if m is None:
                raise ConfigError(f"--logit-bias {item!r}: give TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043-inf)")
            bias[int(m.group(1))] = float(m.group(2) + m.group(3))
        settings["logit_bias"] = bias
    return settings


_CONTEXT_FLAGS = ("n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "n_threads_draft", "cache_type_k",
                  "cache_type_v", "cache_type_k_draft", "cache_type_v_draft", "kv_window")
_SPECULATIVE_FLAGS = ("synth_rates", "synth_len", "n_min", "p_min", "ngram_size_n", "ngram_size_m", "ngram_min_hits", "ngram_mod_n_match",
                      "ngram_mod_n_min", "ngram_mod_n_max")
_SAMPLING_FLAGS = ("temp", "top_k", "top_p", "min_p", "seed", "backend_sampling")


def context_settings(args: argparse.Namespace) -> dict[str, Any]:
    """SessionConfig fields of the context group that were given."""
    settings = _given(args, {name: name for name in _CONTEXT_FLAGS})
    if "n_threads_batch" not in settings and "n_threads" in settings:
        settings["n_threads_batch"] = settings["n_threads"]  # llama.cpp: -tb defaults to -t
    if getattr(args, "flash_attn", None) is not None:
        settings["flash_attn"] = _FLASH_ATTN[args.flash_attn]
    return settings


def speculative_settings(args: argparse.Namespace) -> dict[str, Any]:
    """SessionConfig fields of the speculative group that were given (spec types and n_max aside)."""
    settings = _given(args, {name: name for name in _SPECULATIVE_FLAGS})
    if isinstance(getattr(args, "adaptive", None), str):  # a list (bench) is one arm per value instead
        settings["adaptive"] = _ON_OFF[args.adaptive]
    if getattr(args, "cost_cache", None) is not None:
        settings["cost_cache"] = _ON_OFF[args.cost_cache]
    return settings


def sampling_settings(args: argparse.Namespace) -> dict[str, Any]:
    return {**_given(args, {name: name for name in _SAMPLING_FLAGS}), **output_shape_settings(args)}


def session_settings(args: argparse.Namespace) -> dict[str, Any]:
    """Every SessionConfig field set on the command line by the flag groups above."""
    return {**context_settings(args), **speculative_settings(args), **sampling_settings(args)}


def _given(args: argparse.Namespace, names: dict[str, str]) -> dict[str, Any]:
    """{config field: value} for the flags that were given (not None)."""
    return {field: getattr(args, flag) for flag, field in names.items() if getattr(args, flag, None) is not None}


def _csv_on_off(text: str) -> list[bool]:
    items = csv_strings(text)
    if not items or any(item not in _ON_OFF for item in items):
        raise argparse.ArgumentTypeError(f"{text!r}: give on, off or on,off")
    return [_ON_OFF[item] for item in items]


def _csv_ints(text: str) -> list[int]:
    try:
        return [int(item) for item in csv_strings(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers") from None
