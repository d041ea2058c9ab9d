"""Typed, validated configuration for models and sessions.

Names follow llama.cpp's command line (--spec-type, --spec-draft-n-max, ...) so settings carry over.
Validation here catches what can be known without loading anything; the native layer re-checks what
depends on the loaded models (pairing, placement, ring size) and reports it the same way.
"""

from __future__ import annotations

import json
import math
import numbers
import re
from dataclasses import dataclass, fields
from typing import Any, Mapping, Sequence

from ._native.header import (MAX_DRAFT, MAX_SCHEDULE, MAX_SPEC_TYPES, MAX_STREAMS, MAX_TOP_LOGPROBS, MAX_TRACE,
                             SPEC_TYPE_IDS, SPEC_TYPES)
from .errors import ConfigError, ConfigTypeError, ParamError

# SPEC_TYPES: llama.cpp's names, in the order of upstream's enum common_speculative_type (from the header)
SPEC_TYPE_ALIASES = {"dflash": "draft-dflash", "dflash2": "draft-dflash", "mtp": "draft-mtp",
                     "eagle3": "draft-eagle3", "draft": "draft-simple", "dspark": "draft-dspark"}
DRAFTER_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"})
NGRAM_TYPES = frozenset(name for name in SPEC_TYPES if name.startswith("ngram-"))

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}

# The draft ceiling (--spec-draft-n-max) when none is asked for: the API, `generate` and `bench` all use it.
# With adaptive draft lengths (the default) it is a ceiling the controller chooses under, not a fixed length;
# DFlash drafters are clamped to their block (7 for a DFlash2 block of 8).
DEFAULT_N_MAX = 8

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
UINT16_MAX = 2 ** 16 - 1
UINT32_MAX = 2 ** 32 - 1
MAX_THREADS = 512  # llama.cpp's GGML_MAX_N_THREADS: more aborts in its thread pool
TOP_K_MAX = 1 << 24  # the largest top_k a native session takes
FLOAT32_MAX = 3.4028234663852886e38


def _field(owner: str, name: str) -> str:
    return f"{owner}.{name}" if owner else name


def _check_int(owner: str, name: str, value: Any, lo: int = INT32_MIN, hi: int = INT32_MAX,
               hint: str = "") -> None:
    """An integer (not a bool, not None; numpy's integers count) within lo..hi: what the native int32/uint32 field
    can hold."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigTypeError(f"{_field(owner, name)}={value!r} must be an integer{hint}")
    if not lo <= value <= hi:
        raise ConfigError(f"{_field(owner, name)}={value} must be within {lo}..{hi}{hint}")


def check_kv_window(value: Any, owner: str = "SessionConfig") -> None:
    """The steps in which a KV cache's view grows: a power of two from 256 to 65536 cells (what llama can pad to)."""
    _check_int(owner, "kv_window", value, 256, 65536, hint=" (a power of two; None: auto)")
    if value & (value - 1):
        raise ConfigError(f"{_field(owner, 'kv_window')}={value} must be a power of two from 256 to 65536 "
                          f"(None: 1024 on a GPU, 256 on a CPU)")


def _check_float(owner: str, name: str, value: Any, lo: float | None = None, hi: float | None = None) -> None:
    """A finite number (NaN and infinities are refused; numpy's numbers count) within lo..hi when given."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigTypeError(f"{_field(owner, name)}={value!r} must be a finite number")
    if not math.isfinite(value):
        raise ConfigError(f"{_field(owner, name)}={value!r} must be a finite number")
    if hi is None and lo is not None and value < lo:
        raise ConfigError(f"{_field(owner, name)}={value} must be >= {lo}")
    if hi is not None and lo is not None and not lo <= value <= hi:
        raise ConfigError(f"{_field(owner, name)}={value} must be within {lo}..{hi}")


def _check_bool(owner: str, name: str, value: Any, optional: bool = False) -> None:
    if not (isinstance(value, bool) or (optional and value is None)):
        allowed = "True, False or None" if optional else "True or False"
        raise ConfigTypeError(f"{owner}.{name}={value!r} must be {allowed}")


def _check_choice(owner: str, name: str, value: Any, choices: Sequence[str]) -> None:
    if not isinstance(value, str) or value.lower() not in choices:
        raise ConfigError(f"{owner}.{name}={value!r}: use one of {', '.join(choices)}")


def _plain_list(value: Any) -> Any:
    """A one-dimensional numpy array as the list of Python numbers it holds; anything else unchanged."""
    if getattr(value, "ndim", None) == 1 and callable(getattr(value, "tolist", None)):
        return value.tolist()
    return value


def _string_list(owner: str, name: str, value: Any) -> tuple[str, ...] | None:
    """None, one string (comma-separated) or a sequence of strings -> a tuple of non-empty strings."""
    if value is None:
        return None
    items = value.split(",") if isinstance(value, str) else value
    if isinstance(items, (bytes, bytearray)) or not isinstance(items, Sequence) or \
            not all(isinstance(item, str) for item in items):
        raise ConfigError(f"{owner}.{name}={value!r} must be a list of strings")
    out = tuple(item.strip() for item in items if item.strip())
    return out or None


# -- remote devices (rpc-servers): endpoints as --rpc and ModelConfig.rpc take them ---------------------------------
RPC_DEFAULT_PORT = 50052          # upstream rpc-server's
_RPC_HOST = re.compile(r"^[A-Za-z0-9._-]+$")


def parse_rpc_endpoint(text: Any) -> str:
    """'HOST:PORT' (a host name or IPv4 address and a port 1..65535) as given, stripped; ConfigError otherwise."""
    if not isinstance(text, str):
        raise ConfigTypeError(f"an RPC server is a 'HOST:PORT' string, not {type(text).__name__}")
    e = text.strip()
    host, sep, port = e.rpartition(":")
    if not sep or not host or not port:
        raise ConfigError(f"RPC server '{text}' is not of the form HOST:PORT (e.g. 127.0.0.1:{RPC_DEFAULT_PORT})")
    if not _RPC_HOST.match(host):
        ipv6 = ":" in host or "[" in host
        raise ConfigError(f"RPC server '{text}': '{host}' is not a host name or IPv4 address"
                          + (" (the RPC transport speaks IPv4 only)" if ipv6 else ""))
    if not port.isascii() or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(f"RPC server '{text}': port '{port}' is not a number within 1..65535")
    return f"{host}:{int(port)}"


def parse_rpc_endpoints(value: Any, owner: str = "rpc") -> tuple[str, ...] | None:
    """None, 'HOST:PORT,HOST:PORT' or a sequence of 'HOST:PORT' -> a tuple of endpoints without repeats, or None."""
    if value is None:
        return None
    if isinstance(value, str):
        items = value.split(",")
        if any(not item.strip() for item in items):
            raise ConfigError(f"{owner}={value!r} has an empty entry; give HOST:PORT,HOST:PORT")
    elif isinstance(value, Sequence) and not isinstance(value, (bytes, bytearray)):
        items = list(value)
    else:
        raise ConfigTypeError(f"{owner}={value!r} must be 'HOST:PORT,...' or a list of 'HOST:PORT' strings")
    out: list[str] = []
    for item in items:
        e = parse_rpc_endpoint(item)
        if e not in out:
            out.append(e)
    return tuple(out) or None


def check_rpc_timeout(value: Any, owner: str = "rpc_timeout") -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ConfigTypeError(f"{owner}={value!r} must be a number of seconds")
    if not math.isfinite(value) or not 0.001 <= value <= 3600:
        raise ConfigError(f"{owner}={value!r} must be within 0.001..3600 seconds")
    return float(value)



def parse_spec_types(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """'draft-simple,ngram-mod' or a list -> validated llama.cpp names ('none' alone means plain decoding)."""
    if value is None:
        return ()
    if not isinstance(value, (str, Sequence)) or isinstance(value, (bytes, bytearray)):
        raise ConfigError(f"speculative types {value!r}: give a comma-separated str or a list of names")
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for raw in items:
        if not isinstance(raw, str):
            raise ConfigError(f"speculative type {raw!r} is not a name; valid: {', '.join(SPEC_TYPES)}")
        name = raw.strip().lower()
        if not name:
            continue
        name = SPEC_TYPE_ALIASES.get(name, name)
        if name not in SPEC_TYPES:
            raise ConfigError(f"unknown speculative type '{raw}'; valid: {', '.join(SPEC_TYPES)}")
        if name not in out:
            out.append(name)
    if "none" in out:
        if len(out) > 1:
            raise ConfigError("'none' cannot be combined with other speculative types")
        return ()
    if len(out) > MAX_SPEC_TYPES:
        raise ConfigError(f"{len(out)} speculative types: a session combines at most {MAX_SPEC_TYPES}")
    return tuple(out)


def spec_type_id(name: str) -> int:
    return SPEC_TYPE_IDS[name]


@dataclass
class ModelConfig:
    """How a GGUF is loaded and placed (llama.cpp: -ngl, -dev, -sm, -ts, -ot, --n-cpu-moe)."""

    n_gpu_layers: int = -1            # -1: as many as the devices take; 0: CPU only
    devices: Sequence[str] | None = None  # e.g. ["CUDA0"]; ["none"] = CPU only
    split_mode: str = "layer"
    main_gpu: int = 0
    tensor_split: Sequence[float] | None = None
    tensor_overrides: Sequence[str] | None = None  # ["regex=BUFFER_TYPE", ...]
    n_cpu_moe: int = 0
    load_mtp: bool | None = None      # None: when the GGUF has NextN (MTP) layers
    use_mmap: bool = True
    rpc: Sequence[str] | str | None = None  # rpc-servers ("HOST:PORT"): their devices join placement (--rpc)
    rpc_timeout: float = 5.0          # seconds to connect to each rpc-server and hear its handshake

    def __post_init__(self) -> None:
        owner = "ModelConfig"
        self.rpc = parse_rpc_endpoints(self.rpc, f"{owner}.rpc")
        self.rpc_timeout = check_rpc_timeout(self.rpc_timeout, f"{owner}.rpc_timeout")
        _check_int(owner, "n_gpu_layers", self.n_gpu_layers, -1, hint=" (-1: all layers, 0: CPU only)")
        _check_choice(owner, "split_mode", self.split_mode, tuple(SPLIT_MODES))
        self.split_mode = self.split_mode.lower()
        _check_int(owner, "main_gpu", self.main_gpu, 0)
        _check_int(owner, "n_cpu_moe", self.n_cpu_moe, 0)
        _check_bool(owner, "load_mtp", self.load_mtp, optional=True)
        _check_bool(owner, "use_mmap", self.use_mmap)
        self.devices = _string_list(owner, "devices", self.devices)
        if self.tensor_split is not None:
            self.tensor_split = _plain_list(self.tensor_split)
            if isinstance(self.tensor_split, (str, bytes)) or not isinstance(self.tensor_split, Sequence):
                raise ConfigError(f"{owner}.tensor_split={self.tensor_split!r} must be a list of proportions")
            for i, x in enumerate(self.tensor_split):
                _check_float(owner, f"tensor_split[{i}]", x, 0.0)
            self.tensor_split = tuple(float(x) for x in self.tensor_split) or None
        overrides = self.tensor_overrides
        self.tensor_overrides = _string_list(owner, "tensor_overrides", [overrides] if isinstance(overrides, str)
                                             else overrides)
        for o in self.tensor_overrides or ():
            if "=" not in o or o.startswith("=") or o.endswith("="):
                raise ConfigError(f"tensor override '{o}' is not PATTERN=BUFFER_TYPE (e.g. 'exps=CPU')")


# Per-sequence settings, one limit (and so one message) per field: SequenceParams, the session-wide defaults in
# SessionConfig, the server's request schemas and the native layer's checks all hold to these.
#                name: (integer, lo, hi, hint)
SEQUENCE_LIMITS: dict[str, tuple[bool, float | None, float | None, str]] = {
    "n_predict": (True, -1, INT32_MAX, " (-1: until the end of generation or of the context)"),
    "temp": (False, None, None, ""),
    "top_k": (True, 0, TOP_K_MAX, " (0: off)"),
    "top_p": (False, 0.0, 1.0, ""),
    "min_p": (False, 0.0, 1.0, ""),
    "seed": (True, 0, UINT32_MAX, f" ({UINT32_MAX}: a random seed)"),
    "n_max": (True, 0, MAX_DRAFT, ""),
    "n_min": (True, 0, MAX_DRAFT, ""),
    "p_min": (False, 0.0, 1.0, ""),
    # sampling beyond temperature and truncation (llama.cpp's names; OpenAI's frequency/presence penalties)
    "repeat_penalty": (False, 0.0, None, " (1: off)"),
    "repeat_last_n": (True, -1, INT32_MAX, " (-1: the context, 0: none)"),
    "frequency_penalty": (False, None, None, ""),
    "presence_penalty": (False, None, None, ""),
    "n_probs": (True, 0, MAX_TOP_LOGPROBS, ""),
}
# settings that are not numbers: a grammar (GBNF text), a JSON schema (converted to a grammar by upstream's
# converter when the sequence starts) and logit biases ({token id: bias}; -inf bans a token)
SAMPLING_SHAPES = ("grammar", "json_schema", "logit_bias")


def check_sequence_value(name: str, value: Any, owner: str = "") -> None:
    """The one check of a per-sequence setting: ConfigTypeError for a wrong type, ConfigError naming the field
    for a value out of its limits (SEQUENCE_LIMITS)."""
    integer, lo, hi, hint = SEQUENCE_LIMITS[name]
    try:
        if integer:
            _check_int(owner, name, value, int(lo), int(hi), hint)
        else:
            _check_float(owner, name, value, lo, hi)
            if abs(float(value)) > FLOAT32_MAX:  # the native side holds a 32-bit float: 1e308 would be inf there
                raise ConfigError(f"{_field(owner, name)}={value!r} is out of range (at most {FLOAT32_MAX:.4g} in "
                                  f"magnitude)")
        if name == "repeat_penalty" and value <= 0:
            raise ConfigError(f"{_field(owner, name)}={value} must be > 0 (1: off)")
    except ConfigTypeError:
        raise
    except ConfigError as e:
        raise ParamError(name, str(e)) from None


def check_sampling_shape(name: str, value: Any, owner: str = "") -> Any:
    """The one check of a grammar, a JSON schema or logit biases (None: not given); returns the value as it is
    kept: a grammar as str, a JSON schema as JSON text, logit biases as a tuple of (token id, bias) pairs.
    ParamError names the field."""
    if value is None:
        return None
    where = _field(owner, name)
    if name == "grammar":
        if not isinstance(value, str):
            raise ParamError(name, f"{where} must be GBNF text (a str), not {type(value).__name__}")
        if "\0" in value:
            raise ParamError(name, f"{where} holds a NUL character")
        return value
    if name == "json_schema":
        if isinstance(value, str):
            try:
                json.loads(value)
            except ValueError as e:
                raise ParamError(name, f"{where} is not valid JSON: {e}") from None
            return value
        if not isinstance(value, (dict, bool)):
            raise ParamError(name, f"{where} must be a JSON schema (a dict, or its JSON text), not "
                                   f"{type(value).__name__}")
        try:
            return json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as e:
            raise ParamError(name, f"{where} cannot be written as JSON: {e}") from None
    # logit_bias: {token: bias} or [(token, bias), ...]
    items = value.items() if isinstance(value, Mapping) else value
    if isinstance(items, (str, bytes)) or not isinstance(items, (Sequence, type({}.items()))):
        raise ParamError(name, f"{where} must map token ids to biases ({{token: bias}} or [[token, bias], ...])")
    out: dict[int, float] = {}
    for item in items:
        try:
            token, bias = item
        except (TypeError, ValueError):
            raise ParamError(name, f"{where}: {item!r} is not a (token id, bias) pair") from None
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or not 0 <= token <= INT32_MAX:
            raise ParamError(name, f"{where}: token {token!r} must be a token id (an int >= 0)")
        if isinstance(bias, bool) or not isinstance(bias, numbers.Real) or math.isnan(bias) or bias == math.inf \
                or (math.isfinite(bias) and abs(bias) > FLOAT32_MAX):
            raise ParamError(name, f"{where}: the bias of token {token} must be a finite number, or -inf to ban it")
        out[int(token)] = float(bias)
    return tuple(sorted(out.items())) or None


GRAMMAR_TRIGGER_TYPES = ("token", "word", "pattern", "pattern_full")  # PLS_TRIGGER_* in this order


def check_grammar_triggers(value: Any) -> tuple[tuple[str, str, int], ...] | None:
    """Lazy-grammar triggers as kept: a tuple of (type, value, token), from objects with type/value/token
    attributes (pyllamaspec.chat.GrammarTrigger), mappings with those keys, or such triples. ParamError names the
    field; the regular expressions and tokens are checked natively, against the model."""
    if value is None:
        return None
    name = "grammar_triggers"
    if isinstance(value, (str, bytes, Mapping)) or not isinstance(value, Sequence) or not value:
        raise ParamError(name, f"{name} must be a non-empty list of triggers (type, value, token)")
    out = []
    for item in value:
        if isinstance(item, Mapping):
            kind, text, token = item.get("type"), item.get("value", ""), item.get("token", -1)
        elif hasattr(item, "type") and hasattr(item, "value"):
            kind, text, token = item.type, item.value, getattr(item, "token", -1)
        else:
            try:
                kind, text, token = item
            except (TypeError, ValueError):
                raise ParamError(name, f"{name}: {item!r} is not a trigger (type, value, token)") from None
        if kind not in GRAMMAR_TRIGGER_TYPES:
            raise ParamError(name, f"{name}: type {kind!r} is none of {', '.join(GRAMMAR_TRIGGER_TYPES)}")
        if not isinstance(text, str) or "\0" in text or (kind != "token" and not text):
            raise ParamError(name, f"{name}: a {kind} trigger needs its text (a str without NUL)")
        if isinstance(token, bool) or not isinstance(token, numbers.Integral) or \
                (kind == "token" and not 0 <= token <= INT32_MAX):
            raise ParamError(name, f"{name}: token {token!r} must be a token id (an int >= 0)")
        out.append((kind, text, int(token)))
    return tuple(out)


@dataclass(frozen=True)
class SequenceParams:
    """One sequence's settings in a running batch (SpecSession.submit, the server's requests). None: the
    session's own (SessionConfig); n_max may only lower the session's draft ceiling. numpy's numbers are
    accepted and stored as Python ints and floats."""

    n_predict: int = -1
    temp: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    min_p: float | None = None
    seed: int | None = None
    n_max: int | None = None
    n_min: int | None = None
    p_min: float | None = None
    # a grammar or a JSON schema (not both; given, they replace the session's), penalties, logit biases
    grammar: str | None = None
    json_schema: Any = None
    repeat_penalty: float | None = None
    repeat_last_n: int | None = None
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: Any = None
    # the log-probability of every generated token and of this many alternatives (None: no log-probabilities)
    n_probs: int | None = None
    # where the grammar (or the JSON schema's) starts to apply - the text before the first trigger is free (a chat
    # template's tool calls): (type, value, token) each, type one of GRAMMAR_TRIGGER_TYPES; None: from the start
    grammar_triggers: Any = None

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if f.name == "grammar_triggers":
                object.__setattr__(self, f.name, check_grammar_triggers(value))
                continue
            if f.name in SAMPLING_SHAPES:
                object.__setattr__(self, f.name, check_sampling_shape(f.name, value))
                continue
            if value is None and f.name != "n_predict":
                continue
            check_sequence_value(f.name, value)
            integer = SEQUENCE_LIMITS[f.name][0]
            object.__setattr__(self, f.name, int(value) if integer else float(value))
        if self.grammar is not None and self.json_schema is not None:
            raise ParamError("grammar", "give a grammar or a JSON schema, not both")
        if self.grammar_triggers is not None and self.grammar is None and self.json_schema is None:
            raise ParamError("grammar_triggers", "grammar_triggers start a grammar: give one (grammar or json_schema)")

    def given(self) -> dict[str, Any]:
        """The settings given (not None), n_predict included."""
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


@dataclass
class SessionConfig:
    """A speculative session: what drafts, how much, and how the target samples."""

    spec_types: Sequence[str] | str | None = None  # None: detect from the drafter (or plain decoding)
    n_max: int = DEFAULT_N_MAX      # --spec-draft-n-max
    n_min: int = 0                  # --spec-draft-n-min
    p_min: float = 0.0              # --spec-draft-p-min
    n_ctx: int = 4096
    n_batch: int = 2048
    n_ubatch: int = 512
    n_parallel: int = 1
    n_threads: int = 0              # 0: the CPU cores useful for math (as llama.cpp's tools count them)
    n_threads_batch: int = 0
    n_threads_draft: int = 0
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    cache_type_k_draft: str = "f16"
    cache_type_v_draft: str = "f16"
    flash_attn: bool | None = None  # None: auto
    n_rs_seq: int | None = None     # recurrent snapshot ring; None: sized from the effective n_max
    draft_backend_sampling: bool = True
    # greedy rows of the target sampled on the device holding its output layer (llama.cpp's --backend-sampling): a
    # row's token comes back instead of its logits. None: where that device is a GPU; True: wherever the session
    # samples greedily (an error otherwise); False: on the host. Log-probabilities and margins read logits either way
    backend_sampling: bool | None = None
    # the KV cache's view grows in steps of this many cells (a power of two, 256..65536): a graph serves one view, and
    # a GPU runs each batch size's new one eagerly, then captures it. None: 1024 where the target's output layer is
    # on a GPU, else 256 (llama.cpp's)
    kv_window: int | None = None
    temp: float = 0.0               # <= 0: greedy
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0xFFFFFFFF          # LLAMA_DEFAULT_SEED: random
    # the output follows a grammar (GBNF, llama.cpp's --grammar) or a JSON schema (--json-schema), not both
    grammar: str | None = None
    json_schema: Any = None
    repeat_penalty: float = 1.0     # --repeat-penalty (1: off)
    repeat_last_n: int = 64         # --repeat-last-n: tokens the penalties look back on (-1: the context)
    frequency_penalty: float = 0.0  # --frequency-penalty
    presence_penalty: float = 0.0   # --presence-penalty
    logit_bias: Any = None          # {token id: bias}; -inf bans a token (llama.cpp's --logit-bias)
    ngram_size_n: int = 0
    ngram_size_m: int = 0
    ngram_min_hits: int = 0
    ngram_mod_n_match: int = 0
    ngram_mod_n_min: int = 0
    ngram_mod_n_max: int = 0
    margins: bool = False           # per-token target top-1/top-2 logit margin
    force_reject: bool = False      # reject every draft (cost of speculating at zero acceptance)
    ignore_eos: bool = False        # never sample an end-of-generation token (llama.cpp's --ignore-eos)
    adaptive: bool = True           # choose the draft length per step and stream (0..n_max) from measured costs
    draft_schedule: Sequence[int] | None = None  # adaptive off: a fixed cycle of draft lengths (0 = a plain step)
    # adaptive: start from the costs an earlier session of the same setup measured on this machine, and keep what
    # this one learns (pyllamaspec.costcache; PYLLAMASPEC_COST_CACHE=off turns it off everywhere)
    cost_cache: bool = True
    # synthetic acceptance, for speed measurement only (the output is not the model's): unconditional
    # per-position acceptance rates (one per draft position, non-increasing) or a mean accepted length
    synth_rates: Sequence[float] | None = None
    synth_len: float | None = None
    synth_seed: int = 1
    # record what each step was and cost, for SpecSession.take_trace() (replaying the controller against measured
    # costs): at most this many steps are kept between takes (0: no trace)
    trace_steps: int = 0
    # a drafter that reads the target's features (DFlash, DSpark, EAGLE3, MTP) takes in the rows of the steps it did
    # not draft before its next draft, this many per pass (the rest in powers of two); 0: 8 where the drafter runs on
    # a GPU, else all at once. Set for a session whose drafter reads no features, the session refuses to open
    catchup_rows: int = 0
    # a drafter that reads the target's layer features (DFlash, DSpark, EAGLE3) reads them from the target's device,
    # where the target keeps the latest max(512, n_ubatch) rows of each sequence, when it processes them, so a step
    # that drafts nothing copies none to the host; True: the target copies them to the host after every batch, as
    # llama.cpp does
    host_features: bool = False
    # a draft model (draft-simple) drafts the best of its top 10 candidates that the sequence's grammar allows (a
    # drafted token the grammar forbids would be rejected); False: its best candidate, as upstream's draft-simple
    draft_grammar: bool = True

    def __post_init__(self) -> None:
        owner = "SessionConfig"
        if self.spec_types is not None:
            self.spec_types = parse_spec_types(self.spec_types)
        check_sequence_value("n_max", self.n_max, owner)
        check_sequence_value("n_min", self.n_min, owner)
        if self.n_min > self.n_max:
            raise ConfigError(f"n_min={self.n_min} must be within 0..n_max ({self.n_max})")
        check_sequence_value("p_min", self.p_min, owner)
        _check_int(owner, "n_ctx", self.n_ctx, 8, hint=" (the context must hold a few tokens)")
        _check_int(owner, "n_ubatch", self.n_ubatch, 1)
        _check_int(owner, "n_batch", self.n_batch, 1)
        if self.n_batch < self.n_ubatch:
            raise ConfigError(f"n_batch={self.n_batch} must be >= n_ubatch={self.n_ubatch}")
        _check_int(owner, "n_parallel", self.n_parallel, 1, MAX_STREAMS)
        for name in ("n_threads", "n_threads_batch", "n_threads_draft"):
            _check_int(owner, name, getattr(self, name), 0, MAX_THREADS, hint=" (0: the CPU cores useful for math)")
        for name in ("cache_type_k", "cache_type_v", "cache_type_k_draft", "cache_type_v_draft"):
            _check_choice(owner, name, getattr(self, name), tuple(KV_CACHE_TYPES))
        _check_bool(owner, "flash_attn", self.flash_attn, optional=True)
        if self.n_rs_seq is not None:
            _check_int(owner, "n_rs_seq", self.n_rs_seq, 0, MAX_DRAFT)
        for name in ("draft_backend_sampling", "margins", "force_reject", "ignore_eos"):
            _check_bool(owner, name, getattr(self, name))
        _check_bool(owner, "backend_sampling", self.backend_sampling, optional=True)
        if self.kv_window is not None:
            check_kv_window(self.kv_window, owner)
        if self.backend_sampling and self.margins:
            raise ParamError("backend_sampling", "margins=True reads every row's logits on the host: leave "
                                                 "backend_sampling unset (or False) to collect margins")
        check_sequence_value("temp", self.temp, owner)
        # any int32 here; opening a session refuses what is outside 0..TOP_K_MAX
        _check_int(owner, "top_k", self.top_k)
        check_sequence_value("top_p", self.top_p, owner)
        check_sequence_value("min_p", self.min_p, owner)
        check_sequence_value("seed", self.seed, owner)
        for name in ("repeat_penalty", "repeat_last_n", "frequency_penalty", "presence_penalty"):
            check_sequence_value(name, getattr(self, name), owner)
        for name in SAMPLING_SHAPES:
            setattr(self, name, check_sampling_shape(name, getattr(self, name), owner))
        if self.grammar is not None and self.json_schema is not None:
            raise ParamError("grammar", "give a grammar or a JSON schema, not both")
        if self.backend_sampling:
            shaped = [n for n in SAMPLING_SHAPES if getattr(self, n) not in (None, {}, "")]
            shaped += [f"{n}={getattr(self, n)}" for n, off in (("repeat_penalty", 1.0), ("frequency_penalty", 0.0),
                                                                 ("presence_penalty", 0.0)) if getattr(self, n) != off]
            if self.temp > 0:
                shaped.insert(0, f"temp={self.temp}")
            if shaped:
                raise ParamError("backend_sampling", f"backend_sampling=True samples greedy rows on the device, but "
                                                     f"{', '.join(shaped)} makes this session's rows other than greedy; "
                                                     f"leave backend_sampling unset (a sequence that asks for them "
                                                     f"samples on the host)")
        # the n-gram sizes and hit count are 16-bit in upstream's settings
        for name in ("ngram_size_n", "ngram_size_m", "ngram_min_hits"):
            _check_int(owner, name, getattr(self, name), 0, UINT16_MAX, hint=" (0: upstream's default)")
        for name in ("ngram_mod_n_match", "ngram_mod_n_min", "ngram_mod_n_max"):
            _check_int(owner, name, getattr(self, name), 0, hint=" (0: upstream's default)")
        _check_bool(owner, "adaptive", self.adaptive)
        _check_bool(owner, "cost_cache", self.cost_cache)
        if self.draft_schedule is not None:
            self.draft_schedule = _plain_list(self.draft_schedule)
            if isinstance(self.draft_schedule, (str, bytes)) or not isinstance(self.draft_schedule, Sequence):
                raise ConfigError(f"{owner}.draft_schedule={self.draft_schedule!r} must be a list of draft lengths")
            if not 1 <= len(self.draft_schedule) <= MAX_SCHEDULE:
                raise ConfigError(f"{owner}.draft_schedule: 1..{MAX_SCHEDULE} draft lengths, got {len(self.draft_schedule)}")
            for i, k in enumerate(self.draft_schedule):
                _check_int(owner, f"draft_schedule[{i}]", k, 0, MAX_DRAFT)
            if self.adaptive:
                raise ConfigError("draft_schedule fixes the draft lengths: use it with adaptive=False")
            self.draft_schedule = tuple(int(k) for k in self.draft_schedule)
        if self.synth_rates is not None:
            self.synth_rates = _plain_list(self.synth_rates)
            if isinstance(self.synth_rates, (str, bytes)) or not isinstance(self.synth_rates, Sequence) \
                    or not 1 <= len(self.synth_rates) <= MAX_DRAFT:
                raise ConfigError(f"{owner}.synth_rates: 1..{MAX_DRAFT} acceptance rates within 0..1")
            for i, r in enumerate(self.synth_rates):
                _check_float(owner, f"synth_rates[{i}]", r, 0.0, 1.0)
            rates = [float(r) for r in self.synth_rates]
            if any(b > a for a, b in zip(rates, rates[1:])):
                raise ConfigError("synth_rates must not increase with position (they are unconditional rates)")
            if self.synth_len is not None:
                raise ConfigError("synthetic acceptance takes synth_rates or synth_len, not both")
            self.synth_rates = tuple(rates)
        if self.synth_len is not None:
            _check_float(owner, "synth_len", self.synth_len, 1.0, self.n_max + 1.0)
        _check_int(owner, "synth_seed", self.synth_seed, 0, UINT32_MAX)
        _check_int(owner, "trace_steps", self.trace_steps, 0, MAX_TRACE)
        _check_int(owner, "catchup_rows", self.catchup_rows, 0, 1 << 20)
        if not isinstance(self.draft_grammar, bool):
            raise ConfigTypeError(f"{owner}.draft_grammar={self.draft_grammar!r} must be true or false")
        if not isinstance(self.host_features, bool):
            raise ConfigTypeError(f"{owner}.host_features={self.host_features!r} must be true or false")
        types = self.spec_types or ()
        if types and self.n_ubatch < self.n_max + 1:
            raise ConfigError(f"n_ubatch={self.n_ubatch} must be at least n_max + 1 = {self.n_max + 1}: "
                              f"a verify batch holds the draft plus one token")

    @property
    def synthetic(self) -> bool:
        """Synthetic acceptance: generated text is not the model's output (speed measurement only)."""
        return self.synth_rates is not None or self.synth_len is not None

    def replace(self, **changes) -> "SessionConfig":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return SessionConfig(**values)
