// A session's plan, before any model is bound to it: llama.cpp's common parameters, the draft length after each
// type's clamp, the context parameters, and what can be checked on the parameters alone. Shared by session open
// (session_open.cpp) and the memory estimate (memory.cpp).
#include "session_plan.h"

#include "adaptive.h"

#include "speculative.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pls {

int64_t now_us() { return ggml_time_us(); }

bool has_type(const std::vector<common_speculative_type> & types, common_speculative_type t) {
    return std::find(types.begin(), types.end(), t) != types.end();
}

bool reads_layer_inputs(const std::vector<common_speculative_type> & types) {
    return has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) || has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK) ||
           has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3);
}

int32_t effective_n_max(const std::vector<common_speculative_type> & types, int32_t n_max, int32_t block_size,
                             bool sample_from_anchor) {
    if (block_size > 0 && has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK) && sample_from_anchor) {
        return std::min(n_max, block_size);      // DSpark may predict the anchor slot too
    }
    if (block_size > 0 && has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH)) {
        return std::min(n_max, block_size - 1);  // the block is [anchor, mask x (block - 1)]
    }
    if (block_size > 0 && has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK)) {
        return std::min(n_max, block_size - 1);  // bonus-anchor DSpark: [anchor, N predictions]
    }
    return n_max;
}

context_plan plan_contexts(common_params & c, const pls_session_params & sp, int32_t n_max_eff,
                                     bool target_recurrent) {
    const auto & types = c.speculative.types;
    const bool speculating = !has_type(types, COMMON_SPECULATIVE_TYPE_NONE);
    const auto limits = common_speculative_get_output_limits(c.n_batch, c.n_parallel, n_max_eff);
    c.n_outputs_max = limits.total;
    c.n_outputs_max_per_seq = limits.per_seq;

    context_plan plan;
    plan.target = common_context_params_to_llama(c);
    // a ring on every rollback-capable target, for any speculative type, sized from the clamped draft length
    int32_t ring = sp.n_rs_seq >= 0 ? sp.n_rs_seq : (speculating ? std::min(n_max_eff, 16) : 0);
    if (!target_recurrent) {
        ring = 0;
    } else if (ring > 0 && sp.n_ubatch <= ring + 1) {
        throw std::invalid_argument("n_ubatch=" + std::to_string(sp.n_ubatch) + " must exceed n_rs_seq + 1 = " +
                                    std::to_string(ring + 1) + " (the rollback window must fit one micro-batch)");
    }
    plan.target.n_rs_seq = (uint32_t) ring;
    if (speculating && sp.n_ubatch < n_max_eff + 1) {
        throw std::invalid_argument("n_ubatch=" + std::to_string(sp.n_ubatch) + " must be at least n_max + 1 = " +
                                    std::to_string(n_max_eff + 1) + " (a verify batch holds the draft and one more token)");
    }

    plan.has_draft = has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) || has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3) ||
                     has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) || has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK) ||
                     has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_MTP);
    if (plan.has_draft) {
        // as common_speculative_init_result builds it: the draft context mirrors the target's size, keeps no ring
        plan.draft = common_context_params_to_llama(common_base_params_to_speculative(c));
        if (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_MTP)) {
            plan.draft.ctx_type = LLAMA_CONTEXT_TYPE_MTP;
        }
        plan.draft.n_ctx = plan.target.n_ctx;
        plan.draft.n_rs_seq = 0;
    }
    return plan;
}

common_params session_common_params(const pls_session_params & p) {
    common_params c;
    c.n_ctx = p.n_ctx;
    c.n_batch = p.n_batch;
    c.n_ubatch = p.n_ubatch;
    c.n_parallel = p.n_parallel;
    // unset: the cores useful for math, as llama.cpp's tools resolve it (a context given -1 would run
    // GGML_DEFAULT_N_THREADS = 4 threads, oversubscribing a 2-core machine); the drafter inherits both
    c.cpuparams.n_threads = p.n_threads > 0 ? p.n_threads : common_cpu_get_num_math();
    c.cpuparams_batch.n_threads = p.n_threads_batch > 0 ? p.n_threads_batch : c.cpuparams.n_threads;
    c.cache_type_k = p.type_k >= 0 ? (ggml_type) p.type_k : GGML_TYPE_F16;
    c.cache_type_v = p.type_v >= 0 ? (ggml_type) p.type_v : GGML_TYPE_F16;
    c.flash_attn_type = p.flash_attn < 0 ? LLAMA_FLASH_ATTN_TYPE_AUTO
                        : (p.flash_attn ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED);
    c.warmup = false;

    c.sampling.temp = p.temp;
    c.sampling.top_k = p.top_k;
    c.sampling.top_p = p.top_p;
    c.sampling.min_p = p.min_p;
    c.sampling.seed = p.seed;
    c.sampling.ignore_eos = p.ignore_eos != 0;

    auto & sp = c.speculative;
    sp.types.clear();
    for (int32_t i = 0; i < p.n_spec_types; ++i) {
        sp.types.push_back((common_speculative_type) p.spec_types[i]);
    }
    if (sp.types.empty()) {
        sp.types.push_back(COMMON_SPECULATIVE_TYPE_NONE);
    }
    sp.draft.n_max = p.n_max;
    sp.draft.n_min = p.n_min;
    sp.draft.p_min = p.p_min;
    sp.draft.backend_sampling = p.draft_backend_sampling != 0;
    sp.draft.cache_type_k = p.type_k_draft >= 0 ? (ggml_type) p.type_k_draft : GGML_TYPE_F16;
    sp.draft.cache_type_v = p.type_v_draft >= 0 ? (ggml_type) p.type_v_draft : GGML_TYPE_F16;
    if (p.n_threads_draft > 0) {
        sp.draft.cpuparams.n_threads = p.n_threads_draft;
        sp.draft.cpuparams_batch.n_threads = p.n_threads_draft;
    }
    if (p.ngram_size_n > 0) {
        sp.ngram_simple.size_n = sp.ngram_map_k.size_n = sp.ngram_map_k4v.size_n = (uint16_t) p.ngram_size_n;
    }
    if (p.ngram_size_m > 0) {
        sp.ngram_simple.size_m = sp.ngram_map_k.size_m = sp.ngram_map_k4v.size_m = (uint16_t) p.ngram_size_m;
    }
    if (p.ngram_min_hits > 0) {
        sp.ngram_simple.min_hits = sp.ngram_map_k.min_hits = sp.ngram_map_k4v.min_hits = (uint16_t) p.ngram_min_hits;
    }
    if (p.ngram_mod_n_match > 0) {
        sp.ngram_mod.n_match = p.ngram_mod_n_match;
    }
    if (p.ngram_mod_n_min > 0) {
        sp.ngram_mod.n_min = p.ngram_mod_n_min;
    }
    if (p.ngram_mod_n_max > 0) {
        sp.ngram_mod.n_max = p.ngram_mod_n_max;
    }
    return c;
}

void validate_params(const pls_session_params & p) {
    auto bad = [](const std::string & m) { fail(PLS_ERR_INVALID, m); };
    auto range = [&](const char * name, int64_t v, int64_t lo, int64_t hi) {
        if (v < lo || v > hi) {
            bad(std::string(name) + "=" + std::to_string(v) + " must be within " + std::to_string(lo) + ".." + std::to_string(hi));
        }
    };
    range("n_spec_types", p.n_spec_types, 0, PLS_MAX_SPEC_TYPES);
    for (int32_t i = 0; i < p.n_spec_types; ++i) {
        if (p.spec_types[i] < 0 || p.spec_types[i] >= COMMON_SPECULATIVE_TYPE_COUNT) {
            bad("unknown speculative type value " + std::to_string(p.spec_types[i]));
        }
    }
    range("n_parallel", p.n_parallel, 1, PLS_MAX_STREAMS);
    range("n_ctx", p.n_ctx, 8, 1 << 24);
    range("n_ubatch", p.n_ubatch, 1, 1 << 20);
    range("n_batch", p.n_batch, p.n_ubatch, 1 << 20);
    range("n_max", p.n_max, 0, PLS_MAX_DRAFT);
    range("n_min", p.n_min, 0, std::max(0, p.n_max));
    range("n_threads", p.n_threads, 0, 4096);
    range("n_threads_batch", p.n_threads_batch, 0, 4096);
    range("n_threads_draft", p.n_threads_draft, 0, 4096);
    range("n_rs_seq", p.n_rs_seq, -1, PLS_MAX_DRAFT);
    range("flash_attn", p.flash_attn, -1, 1);
    range("backend_sampling", p.backend_sampling, -1, 1);
    if (p.kv_window != 0 && !valid_kv_window(p.kv_window)) {
        bad("kv_window=" + std::to_string(p.kv_window) + " must be a power of two from 256 to 65536 (0: auto)");
    }
    range("top_k", p.top_k, 0, 1 << 24);
    for (int32_t t : { p.type_k, p.type_v, p.type_k_draft, p.type_v_draft }) {
        const bool ok = t == -1 || t == GGML_TYPE_F32 || t == GGML_TYPE_F16 || t == GGML_TYPE_BF16 || t == GGML_TYPE_Q8_0 ||
                        t == GGML_TYPE_Q4_0 || t == GGML_TYPE_Q4_1 || t == GGML_TYPE_Q5_0 || t == GGML_TYPE_Q5_1 ||
                        t == GGML_TYPE_IQ4_NL;
        if (!ok) {
            bad("KV cache type value " + std::to_string(t) + " is not one llama.cpp's cache supports");
        }
    }
    for (int32_t v : { p.ngram_size_n, p.ngram_size_m, p.ngram_min_hits }) {
        range("n-gram size", v, 0, 1024);
    }
    range("ngram_mod_n_match", p.ngram_mod_n_match, 0, 1024);
    range("ngram_mod_n_min", p.ngram_mod_n_min, 0, 1024);
    range("ngram_mod_n_max", p.ngram_mod_n_max, 0, 1024);
    if (!std::isfinite(p.temp) || !std::isfinite(p.top_p) || !std::isfinite(p.min_p) || !std::isfinite(p.p_min)) {
        bad("temp, top_p, min_p and p_min must be finite numbers");
    }
    if (p.top_p < 0.0f || p.top_p > 1.0f || p.min_p < 0.0f || p.min_p > 1.0f || p.p_min < 0.0f || p.p_min > 1.0f) {
        bad("top_p, min_p and p_min must be within 0..1");
    }
    range("n_synth_rates", p.n_synth_rates, 0, PLS_MAX_DRAFT);
    range("n_k_schedule", p.n_k_schedule, 0, PLS_MAX_SCHEDULE);
    range("trace_steps", p.trace_steps, 0, PLS_MAX_TRACE);
    range("catchup_rows", p.catchup_rows, 0, 1 << 20);
    range("draft_grammar", p.draft_grammar, 0, 1);
    range("host_features", p.host_features, 0, 1);
    for (int32_t i = 0; i < p.n_k_schedule; ++i) {
        range("k_schedule entry", p.k_schedule[i], 0, PLS_MAX_DRAFT);
    }
    if (p.n_k_schedule > 0 && p.adaptive) {
        bad("a draft-length schedule is for sessions with adaptive = 0");
    }
    if (p.n_synth_rates > 0 && p.synth_len > 0.0f) {
        bad("synthetic acceptance takes rates or a mean length, not both");
    }
    if (!std::isfinite(p.synth_len) || p.synth_len < 0.0f) {
        bad("synthetic acceptance length must be a finite number >= 1 (0: off)");
    }
    for (int32_t i = 0; i < p.n_synth_rates; ++i) {
        const float r = p.synth_rates[i];
        if (!std::isfinite(r) || r < 0.0f || r > 1.0f) {
            bad("synthetic acceptance rates must be within 0..1");
        }
        if (i > 0 && r > p.synth_rates[i - 1]) {
            bad("synthetic acceptance rates must not increase with position (they are unconditional)");
        }
    }
}

// Everything about the pair that upstream would assert on, checked up front so the caller gets a message
// instead of an abort. The verdict users see comes first from Python's pairing rules; these are the guards
// for callers of the C API.

}  // namespace pls
