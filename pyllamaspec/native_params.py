"""The native parameter structs (pls_model_params, pls_session_params, pls_seq_params) filled from ModelConfig,
SessionConfig and SequenceParams: what a model load, a session open, the memory estimate and a sequence joining
a running batch hand to the library."""

from __future__ import annotations

import os

from pathlib import Path

from .config import KV_CACHE_TYPES, SPLIT_MODES, ModelConfig, SequenceParams, SessionConfig, spec_type_id


def native_model_params(ffi, path: Path, config: ModelConfig):
    """pls_model_params for a path and config, and the C buffers it points into (keep them alive)."""
    keep = []

    def cstr(s: str | None):
        if s is None:
            return ffi.NULL
        b = ffi.new("char[]", os.fsencode(s))  # a path of any bytes, as the command line gave it
        keep.append(b)
        return b

    c = config
    p = ffi.new("pls_model_params *")
    p.path = cstr(str(path))
    p.n_gpu_layers = c.n_gpu_layers
    p.devices = cstr(",".join(c.devices)) if c.devices else ffi.NULL
    p.split_mode = SPLIT_MODES[c.split_mode]
    p.main_gpu = c.main_gpu
    if c.tensor_split:
        arr = ffi.new("float[]", list(c.tensor_split))
        keep.append(arr)
        p.tensor_split = arr
        p.n_tensor_split = len(c.tensor_split)
    p.tensor_overrides = cstr(",".join(c.tensor_overrides)) if c.tensor_overrides else ffi.NULL
    p.n_cpu_moe = c.n_cpu_moe
    p.load_mtp = -1 if c.load_mtp is None else int(c.load_mtp)
    p.use_mmap = int(c.use_mmap)
    return p, keep


def native_session_params(ffi, config: SessionConfig):
    """pls_session_params for a config (spec types already resolved)."""
    p = ffi.new("pls_session_params *")
    types = list(config.spec_types or ())
    p.n_spec_types = len(types)
    for i, t in enumerate(types):
        p.spec_types[i] = spec_type_id(t)
    for name in ("n_max", "n_min", "p_min", "n_ctx", "n_batch", "n_ubatch", "n_parallel", "n_threads",
                 "n_threads_batch", "n_threads_draft", "temp", "top_k", "top_p", "min_p", "seed",
                 "ngram_size_n", "ngram_size_m", "ngram_min_hits", "ngram_mod_n_match", "ngram_mod_n_min",
                 "ngram_mod_n_max"):
        setattr(p, name, getattr(config, name))
    p.type_k = KV_CACHE_TYPES[config.cache_type_k.lower()]
    p.type_v = KV_CACHE_TYPES[config.cache_type_v.lower()]
    p.type_k_draft = KV_CACHE_TYPES[config.cache_type_k_draft.lower()]
    p.type_v_draft = KV_CACHE_TYPES[config.cache_type_v_draft.lower()]
    p.flash_attn = -1 if config.flash_attn is None else int(config.flash_attn)
    p.n_rs_seq = -1 if config.n_rs_seq is None else config.n_rs_seq
    p.draft_backend_sampling = int(config.draft_backend_sampling)
    p.backend_sampling = -1 if config.backend_sampling is None else int(config.backend_sampling)
    p.kv_window = 0 if config.kv_window is None else config.kv_window
    p.collect_margins = int(config.margins)
    p.force_reject = int(config.force_reject)
    p.adaptive = int(config.adaptive)
    schedule = list(config.draft_schedule or ())
    p.n_k_schedule = len(schedule)
    for i, k in enumerate(schedule):
        p.k_schedule[i] = k
    rates = list(config.synth_rates or ())
    p.n_synth_rates = len(rates)
    for i, r in enumerate(rates):
        p.synth_rates[i] = r
    p.synth_len = config.synth_len or 0.0
    p.synth_seed = config.synth_seed
    p.trace_steps = config.trace_steps
    p.catchup_rows = config.catchup_rows
    p.host_features = int(config.host_features)
    p.draft_grammar = int(config.draft_grammar)
    p.ignore_eos = int(config.ignore_eos)
    return p


def native_seq_params(ffi, params: SequenceParams, config: SessionConfig):
    """pls_seq_params for a sequence: what it leaves None is the session's (n_max, n_min, p_min: -1, the native
    session's own)."""
    p = ffi.new("pls_seq_params *")
    p.n_predict = params.n_predict
    for name in ("temp", "top_k", "top_p", "min_p", "seed"):
        value = getattr(params, name)
        setattr(p, name, getattr(config, name) if value is None else value)
    p.n_max = -1 if params.n_max is None else params.n_max
    p.n_min = -1 if params.n_min is None else params.n_min
    p.p_min = -1.0 if params.p_min is None else params.p_min
    return p
