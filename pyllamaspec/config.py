"""Typed, validated configuration for models and sessions.

Names follow llama.cpp's command line (--spec-type, --spec-draft-n-max, ...) so settings carry over.
Validation here catches what can be known without loading anything; the native layer re-checks what
depends on the loaded models (pairing, placement, ring size) and reports it the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Sequence

from ._native.header import MAX_DRAFT, MAX_STREAMS, SPEC_TYPE_IDS, SPEC_TYPES
from .errors import ConfigError

# SPEC_TYPES: llama.cpp's names, in the order of upstream's enum common_speculative_type (from the header)
SPEC_TYPE_ALIASES = {"dflash": "draft-dflash", "dflash2": "draft-dflash", "mtp": "draft-mtp",
                     "eagle3": "draft-eagle3", "draft": "draft-simple", "dspark": "draft-dspark"}
DRAFTER_TYPES = frozenset({"draft-simple", "draft-eagle3", "draft-dflash", "draft-dspark"})
NGRAM_TYPES = frozenset(name for name in SPEC_TYPES if name.startswith("ngram-"))

SPLIT_MODES = {"none": 0, "layer": 1, "row": 2, "tensor": 3}
KV_CACHE_TYPES = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q5_0": 6, "q5_1": 7, "q8_0": 8, "bf16": 30}

# The draft ceiling (--spec-draft-n-max) when none is asked for: the API, `generate` and `bench` all use it.
DEFAULT_N_MAX = 3

INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1


def parse_spec_types(value: str | Sequence[str] | None) -> tuple[str, ...]:
    """'draft-simple,ngram-mod' or a list -> validated llama.cpp names ('none' alone means plain decoding)."""
    if value is None:
        return ()
    items = value.split(",") if isinstance(value, str) else list(value)
    out: list[str] = []
    for raw in items:
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

    def __post_init__(self) -> None:
        if self.split_mode not in SPLIT_MODES:
            raise ConfigError(f"split_mode '{self.split_mode}': use one of {', '.join(SPLIT_MODES)}")
        if self.n_gpu_layers < -1:
            raise ConfigError(f"n_gpu_layers={self.n_gpu_layers}: use -1 (all) or a count >= 0")
        if self.n_cpu_moe < 0:
            raise ConfigError(f"n_cpu_moe={self.n_cpu_moe} must be >= 0")
        if self.tensor_split is not None and any(x < 0 for x in self.tensor_split):
            raise ConfigError("tensor_split proportions must be >= 0")
        for o in self.tensor_overrides or ():
            if "=" not in o or o.startswith("=") or o.endswith("="):
                raise ConfigError(f"tensor override '{o}' is not PATTERN=BUFFER_TYPE (e.g. 'exps=CPU')")


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
    n_threads: int = 0              # 0: llama.cpp's default
    n_threads_batch: int = 0
    n_threads_draft: int = 0
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    cache_type_k_draft: str = "f16"
    cache_type_v_draft: str = "f16"
    flash_attn: bool | None = None  # None: auto
    n_rs_seq: int | None = None     # recurrent snapshot ring; None: sized from the effective n_max
    draft_backend_sampling: bool = True
    temp: float = 0.0               # <= 0: greedy
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int = 0xFFFFFFFF          # LLAMA_DEFAULT_SEED: random
    ngram_size_n: int = 0
    ngram_size_m: int = 0
    ngram_min_hits: int = 0
    ngram_mod_n_match: int = 0
    ngram_mod_n_min: int = 0
    ngram_mod_n_max: int = 0
    margins: bool = False           # per-token target top-1/top-2 logit margin
    force_reject: bool = False      # reject every draft (cost of speculating at zero acceptance)

    def __post_init__(self) -> None:
        if self.spec_types is not None:
            self.spec_types = parse_spec_types(self.spec_types)
        checks = [
            (0 <= self.n_max <= MAX_DRAFT, f"n_max={self.n_max} must be within 0..{MAX_DRAFT}"),
            (0 <= self.n_min <= max(self.n_max, 0), f"n_min={self.n_min} must be within 0..n_max ({self.n_max})"),
            (0.0 <= self.p_min <= 1.0, f"p_min={self.p_min} must be within 0..1"),
            (self.n_ctx >= 8, f"n_ctx={self.n_ctx} is too small"),
            (self.n_ubatch >= 1, f"n_ubatch={self.n_ubatch} must be >= 1"),
            (self.n_batch >= self.n_ubatch, f"n_batch={self.n_batch} must be >= n_ubatch={self.n_ubatch}"),
            (1 <= self.n_parallel <= MAX_STREAMS, f"n_parallel={self.n_parallel} must be within 1..{MAX_STREAMS}"),
            (self.n_threads >= 0 and self.n_threads_batch >= 0 and self.n_threads_draft >= 0,
             "thread counts must be >= 0"),
            (self.n_rs_seq is None or 0 <= self.n_rs_seq <= MAX_DRAFT, f"n_rs_seq={self.n_rs_seq} must be within 0..{MAX_DRAFT}"),
            (0.0 <= self.top_p <= 1.0 and 0.0 <= self.min_p <= 1.0, "top_p and min_p must be within 0..1"),
            (0 <= self.seed <= 0xFFFFFFFF, f"seed={self.seed} must fit in 32 bits"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ConfigError(msg)
        for name in ("cache_type_k", "cache_type_v", "cache_type_k_draft", "cache_type_v_draft"):
            if getattr(self, name).lower() not in KV_CACHE_TYPES:
                raise ConfigError(f"{name}='{getattr(self, name)}': use one of {', '.join(KV_CACHE_TYPES)}")
        types = self.spec_types or ()
        if types and self.n_ubatch < self.n_max + 1:
            raise ConfigError(f"n_ubatch={self.n_ubatch} must be at least n_max + 1 = {self.n_max + 1}: "
                              f"a verify batch holds the draft plus one token")

    def replace(self, **changes) -> "SessionConfig":
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        values.update(changes)
        return SessionConfig(**values)
