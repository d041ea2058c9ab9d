// Speculative sessions: the draft -> verify -> accept -> rollback loop, in native code.
//
// The loop follows upstream's reference driver (examples/speculative-simple) and the server's rule for
// recurrent targets: a target with a snapshot ring rolls back in place when the draft fits the ring, and
// falls back to checkpoint + replay when it does not (or when the arch keeps no ring at all).
#include "session_plan.h"

#include "common.h"
#include "sampling.h"
#include "speculative.h"
#include "llama-ext.h"
#include "llama-model.h"  // whether a drafter has its own LM head

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <memory>
#include <stdexcept>

namespace {

enum rollback_kind : int32_t {
    ROLLBACK_NONE = 0,
    ROLLBACK_KV = 1,          // attention-only memory: partial seq_rm
    ROLLBACK_RING = 2,        // recurrent-state snapshot ring (n_rs_seq)
    ROLLBACK_CHECKPOINT = 3,  // save state before verify, restore + replay after a partial accept
};

int64_t now_us() { return ggml_time_us(); }

struct scoped_timer {
    double & acc_ms;
    int64_t t0;
    explicit scoped_timer(double & acc) : acc_ms(acc), t0(now_us()) {}
    ~scoped_timer() { acc_ms += (now_us() - t0) / 1000.0; }
};

bool has_type(const std::vector<common_speculative_type> & types, common_speculative_type t) {
    return std::find(types.begin(), types.end(), t) != types.end();
}

// one verify step that committed tokens: a replay after a checkpoint restore is not a new step
void count_step(pls_stats & st, size_t n_draft, size_t n_accepted) {
    st.n_steps++;
    st.n_drafts += n_draft > 0;
    st.n_drafted += n_draft;
    st.n_accepted += n_accepted;
    for (size_t i = 0; i < n_draft && i < PLS_MAX_DRAFT; ++i) {
        st.drafted_per_pos[i]++;
    }
    for (size_t i = 0; i < n_accepted && i < PLS_MAX_DRAFT; ++i) {
        st.accepted_per_pos[i]++;
    }
}

// target top-1 minus top-2 logit: how close the target's own choice was to a tie at this position
float top2_margin(const float * logits, int32_t n_vocab) {
    float a = -INFINITY, b = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) {
        const float v = logits[i];
        if (v > a) {
            b = a;
            a = v;
        } else if (v > b) {
            b = v;
        }
    }
    return a - b;
}

}  // namespace

// One generated sequence of a session: its own position, draft, checkpoint, sampler and counters.
struct stream_state {
    llama_seq_id seq = 0;
    bool active = false;
    llama_tokens prompt_tgt;
    llama_tokens draft;
    llama_token id_last = 0;
    int32_t n_past = 0;
    int64_t n_emitted = 0;
    common_prompt_checkpoint ckpt;
    bool ckpt_valid = false;   // a target checkpoint was taken for the draft being verified
    bool replay = false;       // this step re-decodes tokens restored from a checkpoint
    int32_t i_batch = -1;      // where this stream's [id_last, draft...] starts in the verify batch
    int32_t n_draft_max = 0;   // this step's draft cap (context, n_predict and n_max)
    int32_t finish = PLS_FINISH_NONE;
    common_sampler_ptr smpl;
    pls_stats stats{};         // counters only; the session's stats hold the (shared) timings
};

struct pls_session {
    pls_model * target = nullptr;
    pls_model * drafter = nullptr;
    pls_session_params sp{};
    common_params params;

    llama_context_ptr ctx_tgt;
    llama_context_ptr ctx_dft;
    common_speculative * spec = nullptr;
    common_batch batch;  // prompt chunks and verify batches of the target, reused every step

    int32_t n_max_effective = 0;
    int32_t block_size = 0;
    bool sample_from_anchor = true;  // DSpark block layout
    int32_t rollback_tgt = ROLLBACK_NONE;
    int32_t rollback_dft = ROLLBACK_NONE;
    bool use_ckpt_tgt_always = false;  // FULL: every verify with a draft is checkpointed
    bool use_ckpt_dft = false;
    int32_t n_rs_seq = 0;
    uint64_t ring_bytes = 0;
    int32_t n_vocab = 0;
    std::string draft_device = "none";

    // generation state
    bool active = false;                 // some stream is still generating
    std::vector<stream_state> streams;   // of the last begin; stream i is sequence i
    int32_t n_predict = -1;
    std::atomic<bool> stop_requested{false};

    pls_stats stats{};

    ~pls_session() {
        if (spec) {
            common_speculative_free(spec);
        }
        streams.clear();
        batch = common_batch();  // before the context it was sized for
        ctx_dft.reset();
        ctx_tgt.reset();
    }
};

int32_t pls::effective_n_max(const std::vector<common_speculative_type> & types, int32_t n_max, int32_t block_size,
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

pls::context_plan pls::plan_contexts(common_params & c, const pls_session_params & sp, int32_t n_max_eff,
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

common_params pls::session_common_params(const pls_session_params & p) {
    common_params c;
    c.n_ctx = p.n_ctx;
    c.n_batch = p.n_batch;
    c.n_ubatch = p.n_ubatch;
    c.n_parallel = p.n_parallel;
    if (p.n_threads > 0) {
        c.cpuparams.n_threads = p.n_threads;
    }
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

namespace {

// Target graphs that record layer inputs (res->t_layer_inp), and the few that also record the final one
// (upstream src/models/*.cpp at the pinned commit): tapping any other layer trips a GGML_ASSERT.
bool arch_exports_layer_inputs(const std::string & arch) {
    static const char * archs[] = { "llama", "qwen3", "qwen3moe", "qwen3next", "qwen35", "qwen35moe", "qwen4exp",
        "gemma4", "muse-glimmer", "deepseek4", "nemotron_h", "nemotron_h_moe", "bailingmoe3", "hunyuan_vl",
        "gpt-oss", "lfm2", "lfm2moe", "minimax-01", "minimax-m2", "mimo2", "nanbeige" };
    return std::find(std::begin(archs), std::end(archs), arch) != std::end(archs);
}

bool arch_exports_final_layer_input(const std::string & arch) {
    return arch == "deepseek4" || arch == "nemotron_h" || arch == "nemotron_h_moe" || arch == "mimo2";
}

std::string target_arch(const llama_model * m) {
    char buf[64];
    return llama_model_meta_val_str(m, "general.architecture", buf, sizeof(buf)) < 0 ? std::string() : std::string(buf);
}

// Everything that upstream would assert on, checked up front so the caller gets a message instead of an abort.
void validate(pls_session & s) {
    const pls_session_params & p = s.sp;
    const auto & types = s.params.speculative.types;
    auto fail = [](const std::string & m) { throw std::invalid_argument(m); };

    if (p.n_parallel < 1 || p.n_parallel > PLS_MAX_STREAMS) {
        fail("n_parallel=" + std::to_string(p.n_parallel) + " must be within 1.." + std::to_string(PLS_MAX_STREAMS));
    }
    if (p.n_ctx < 8) {
        fail("n_ctx=" + std::to_string(p.n_ctx) + " is too small");
    }
    if (p.n_ubatch < 1 || p.n_batch < p.n_ubatch) {
        fail("n_batch=" + std::to_string(p.n_batch) + " must be >= n_ubatch=" + std::to_string(p.n_ubatch) + " >= 1");
    }
    if (p.n_max < 0 || p.n_max > PLS_MAX_DRAFT) {
        fail("n_max=" + std::to_string(p.n_max) + " must be within 0.." + std::to_string(PLS_MAX_DRAFT));
    }
    for (auto t : types) {
        if ((int) t < 0 || t >= COMMON_SPECULATIVE_TYPE_COUNT) {
            fail("unknown speculative type value " + std::to_string((int) t));
        }
    }
    const bool needs_drafter = has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) ||
                               has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3) ||
                               has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) ||
                               has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK);
    if (needs_drafter && s.drafter == nullptr) {
        fail("speculative type " + common_speculative_type_name_str(types) + " needs a drafter model (-md)");
    }
    if (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_MTP) && s.drafter == nullptr &&
        llama_model_n_layer_nextn(s.target->model) <= 0) {
        fail("draft-mtp needs a target with MTP (NextN) layers loaded; this target has none");
    }

    const llama_model * mt = s.target->model;
    if (s.drafter != nullptr) {
        const llama_model * md = s.drafter->model;
        const int32_t nv_t = llama_vocab_n_tokens(llama_model_get_vocab(mt));
        const int32_t nv_d = llama_vocab_n_tokens(llama_model_get_vocab(md));
        const bool block = has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) ||
                           has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK);
        const bool borrows = block || has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3);
        if (borrows) {
            if (llama_model_n_embd(md) != llama_model_n_embd(mt)) {
                fail("pairing: hidden size (n_embd): target has " + std::to_string(llama_model_n_embd(mt)) +
                     ", drafter has " + std::to_string(llama_model_n_embd(md)) + " - this drafter was trained for another target");
            }
            const std::string arch = target_arch(mt);
            if (!arch_exports_layer_inputs(arch)) {
                fail("pairing: target arch '" + arch + "' does not export layer inputs, which DFlash/EAGLE3 drafters "
                     "read; this drafter cannot run with it");
            }
            const uint32_t n_ids = llama_model_target_layer_ids_n(md);
            const int32_t * ids = llama_model_target_layer_ids(md);
            // drafters tap the input of layer L; most graphs record it for L < n_layer only
            // EAGLE3 reads id n_layer (the final hidden state) through the NextN embeddings instead
            const bool eagle3 = has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3);
            const int32_t hi = llama_model_n_layer(mt) - (eagle3 || arch_exports_final_layer_input(arch) ? 0 : 1);
            for (uint32_t i = 0; i < n_ids; ++i) {
                if (ids[i] < 1 || ids[i] > hi) {
                    fail("pairing: target layer id " + std::to_string(ids[i]) + " (GGUF, HF id + 1) is outside 1.." +
                         std::to_string(hi) + " for a target with " + std::to_string(llama_model_n_layer(mt)) + " layers");
                }
            }
            if (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3) && n_ids != 3) {
                fail("pairing: an EAGLE3 drafter taps exactly 3 target layers, this one lists " + std::to_string(n_ids));
            }
        }
        if (block) {
            const llama_token mask = llama_vocab_mask(llama_model_get_vocab(md));
            if (mask < 0 || mask >= nv_t) {
                fail("pairing: mask token id " + std::to_string(mask) + " is outside the target vocab (" +
                     std::to_string(nv_t) + " tokens)");
            }
        }
        if (nv_d != nv_t && !(borrows && md->output == nullptr)) {
            if (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) ? std::abs(nv_d - nv_t) > 128 : true) {
                fail("pairing: vocab size: target has " + std::to_string(nv_t) + " tokens, drafter has " +
                     std::to_string(nv_d) + " - drafter and target must share a tokenizer");
            }
        }
    }
}

// The effective draft length after each type's own clamp: known before any context exists, so the
// target's snapshot ring can be sized from it (upstream sizes it from the unclamped request).
void resolve_n_max(pls_session & s) {
    const auto & types = s.params.speculative.types;
    if (s.drafter != nullptr && (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) ||
                                 has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK))) {
        char buf[32];
        const int32_t n = llama_model_meta_val_str(s.drafter->model, "dflash.block_size", buf, sizeof(buf));
        s.block_size = n > 0 ? atoi(buf) : 16;  // upstream's default
        // a DSpark drafter predicts the anchor slot too, unless exported with the 1 + N bonus-anchor block
        const bool from_anchor = llama_model_meta_val_str(s.drafter->model, "dflash.sample_from_anchor", buf, sizeof(buf)) < 0 ||
                                 strcmp(buf, "true") == 0;
        s.sample_from_anchor = from_anchor;
    }
    s.n_max_effective = pls::effective_n_max(types, s.sp.n_max, s.block_size, s.sample_from_anchor);
    s.params.speculative.draft.n_max = s.n_max_effective;
    s.params.speculative.draft.n_min = std::min(s.params.speculative.draft.n_min, s.n_max_effective);

    if (has_type(types, COMMON_SPECULATIVE_TYPE_NONE)) {
        return;
    }
    // one verify batch carries every stream's [id_last, draft...]
    const int32_t n_verify = s.sp.n_parallel * (s.n_max_effective + 1);
    if (s.sp.n_batch < n_verify) {
        throw std::invalid_argument("n_batch=" + std::to_string(s.sp.n_batch) + " must be at least n_parallel x (n_max + 1) = " +
                                    std::to_string(n_verify) + " (one verify batch holds every stream's draft)");
    }
    // a non-causal block drafter decodes every stream's block in one micro-batch
    if (s.block_size > 0 && s.sp.n_ubatch < n_verify) {
        throw std::invalid_argument("n_ubatch=" + std::to_string(s.sp.n_ubatch) + " must be at least n_parallel x (n_max + 1) = " +
                                    std::to_string(n_verify) + " (the block drafter decodes all streams' blocks at once)");
    }
}

void check_placement(pls_session & s) {
    if (s.drafter == nullptr) {
        return;
    }
    const auto & types = s.params.speculative.types;
    const bool borrows_head = s.drafter->model->output == nullptr &&
        (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) || has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK) ||
         has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3));
    if (!borrows_head) {
        return;
    }
    if (s.target->split_mode == LLAMA_SPLIT_MODE_TENSOR) {
        throw std::invalid_argument(
            "placement: this drafter borrows the target's LM head, which -sm tensor keeps in a meta buffer no drafter "
            "can read; load the target with split mode 'layer'");
    }
    ggml_backend_dev_t head = llama_model_dev_output(s.target->model);
    if (head == nullptr) {
        return;  // host memory: every scheduler has the CPU backend
    }
    // the drafter's scheduler holds its model's devices (all GPUs when none were named) plus the CPU
    const auto & devs = s.drafter->devices;
    const bool all_gpus = devs.empty() && llama_model_n_devices(s.drafter->model) > 0;
    bool ok = all_gpus;
    for (int32_t i = 0; i < llama_model_n_devices(s.drafter->model) && !ok; ++i) {
        ok = llama_model_get_device(s.drafter->model, i) == head;
    }
    if (!ok) {
        std::string names;
        for (int32_t i = 0; i < llama_model_n_devices(s.drafter->model); ++i) {
            names += (names.empty() ? "" : ",") + pls::device_name(llama_model_get_device(s.drafter->model, i));
        }
        throw std::invalid_argument(
            "placement: the drafter borrows the target's LM head (output.weight), which is on " + pls::device_name(head) +
            ", but the drafter is placed on " + (names.empty() ? std::string("the CPU only") : names) +
            "; put the drafter on " + pls::device_name(head) + " (-devd " + pls::device_name(head) +
            ") or leave -devd unset");
    }
}

void create_contexts(pls_session & s) {
    common_params & c = s.params;
    const auto & types = c.speculative.types;
    const bool speculating = !has_type(types, COMMON_SPECULATIVE_TYPE_NONE);
    const bool recurrent = llama_model_is_hybrid(s.target->model) || llama_model_is_recurrent(s.target->model);
    pls::context_plan plan = pls::plan_contexts(c, s.sp, s.n_max_effective, recurrent);
    llama_context_params & cp = plan.target;

    s.ctx_tgt.reset(llama_init_from_model(s.target->model, cp));
    if (!s.ctx_tgt) {
        const std::string why = pls::take_last_error();
        throw std::runtime_error("failed to create the target context" + (why.empty() ? std::string() : ": " + why));
    }
    s.n_rs_seq = (int32_t) llama_n_rs_seq(s.ctx_tgt.get());
    const int32_t n_verify = s.sp.n_parallel * (s.n_max_effective + 1);
    if (speculating && (int32_t) llama_n_batch(s.ctx_tgt.get()) < n_verify) {
        // llama.cpp caps a causal context's batch at n_ctx
        throw std::invalid_argument("n_ctx=" + std::to_string(s.sp.n_ctx) + " caps the batch at " +
                                    std::to_string(llama_n_batch(s.ctx_tgt.get())) + " tokens, below n_parallel x (n_max + 1) = " +
                                    std::to_string(n_verify) + "; raise n_ctx or lower n_parallel / n_max");
    }

    if (plan.has_draft) {
        llama_context_params & cpd = plan.draft;
        cpd.n_ctx = llama_n_ctx(s.ctx_tgt.get());
        cpd.ctx_other = s.ctx_tgt.get();
        llama_model * md = s.drafter ? s.drafter->model : s.target->model;
        s.ctx_dft.reset(llama_init_from_model(md, cpd));
        if (!s.ctx_dft) {
            const std::string why = pls::take_last_error();
            throw std::runtime_error("failed to create the draft context" + (why.empty() ? std::string() : ": " + why));
        }
        c.speculative.draft.ctx_dft = s.ctx_dft.get();
        ggml_backend_dev_t dd = s.drafter && llama_model_n_devices(md) > 0 ? llama_model_get_device(md, 0) : nullptr;
        s.draft_device = s.drafter ? pls::device_name(dd) : pls::device_name(nullptr);
    }
    c.speculative.draft.ctx_tgt = s.ctx_tgt.get();
    s.batch = common_batch(s.ctx_tgt.get());

    // how each context rolls back: probed once (the probe clears the memory, harmless before any prompt)
    const auto tgt_rm = common_context_can_seq_rm(s.ctx_tgt.get());
    if (tgt_rm == COMMON_CONTEXT_SEQ_RM_TYPE_NO && speculating) {
        throw std::runtime_error("the target context cannot remove tokens, so speculative decoding cannot roll back");
    }
    s.rollback_tgt = tgt_rm == COMMON_CONTEXT_SEQ_RM_TYPE_RS ? ROLLBACK_RING
                   : tgt_rm == COMMON_CONTEXT_SEQ_RM_TYPE_FULL ? ROLLBACK_CHECKPOINT : ROLLBACK_KV;
    s.use_ckpt_tgt_always = tgt_rm == COMMON_CONTEXT_SEQ_RM_TYPE_FULL;
    if (s.ctx_dft) {
        const auto dft_rm = common_context_can_seq_rm(s.ctx_dft.get());
        s.use_ckpt_dft = dft_rm == COMMON_CONTEXT_SEQ_RM_TYPE_FULL;
        s.rollback_dft = dft_rm == COMMON_CONTEXT_SEQ_RM_TYPE_RS ? ROLLBACK_RING
                       : dft_rm == COMMON_CONTEXT_SEQ_RM_TYPE_FULL ? ROLLBACK_CHECKPOINT : ROLLBACK_KV;
    }
    if (s.n_rs_seq > 0) {
        // one plane per snapshot, per sequence: the partial (recurrent) state of one sequence is one plane
        s.ring_bytes = (uint64_t) llama_state_seq_get_size_ext(s.ctx_tgt.get(), 0, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY) *
                       (uint64_t) s.n_rs_seq * (uint64_t) std::max(1, s.sp.n_parallel);
    }
}

void reset_generation(pls_session & s, int32_t n_streams) {
    llama_memory_clear(llama_get_memory(s.ctx_tgt.get()), true);
    if (s.ctx_dft) {
        llama_memory_clear(llama_get_memory(s.ctx_dft.get()), true);
    }
    if (s.spec) {
        common_speculative_free(s.spec);
        s.spec = nullptr;
    }
    if (!has_type(s.params.speculative.types, COMMON_SPECULATIVE_TYPE_NONE)) {
        // one drafting state per sequence the contexts hold, whether or not this generation uses them all
        s.spec = common_speculative_init(s.params.speculative, s.sp.n_parallel);
        if (s.spec == nullptr) {
            throw std::runtime_error("failed to initialize speculative decoding for " +
                                     common_speculative_type_name_str(s.params.speculative.types));
        }
    }
    s.streams.clear();
    s.streams.resize(n_streams);
    for (int32_t i = 0; i < n_streams; ++i) {
        stream_state & st = s.streams[i];
        st.seq = i;
        common_params_sampling sampling = s.params.sampling;
        if (i > 0 && sampling.seed != LLAMA_DEFAULT_SEED) {
            sampling.seed += (uint32_t) i;  // streams of one seeded run sample differently, reproducibly
        }
        st.smpl.reset(common_sampler_init(s.target->model, sampling));
    }
    s.stop_requested.store(false);
    s.active = false;
}

void decode_or_throw(llama_context * ctx, common_batch & batch, const char * what) {
    const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    if (rc != 0) {
        const std::string why = pls::take_last_error();
        throw std::runtime_error(std::string(what) + " failed (llama_process returned " + std::to_string(rc) + ")" +
                                 (why.empty() ? std::string() : ": " + why));
    }
}

void begin(pls_session & s, const int32_t * prompts, const int32_t * n_prompt, int32_t n_streams, int32_t n_predict) {
    if (n_streams < 1 || n_streams > s.sp.n_parallel) {
        throw std::invalid_argument(std::to_string(n_streams) + " prompts for a session of n_parallel=" +
                                    std::to_string(s.sp.n_parallel) + " streams");
    }
    const int32_t n_ctx_seq = (int32_t) llama_n_ctx_seq(s.ctx_tgt.get());
    const int32_t n_vocab = s.n_vocab;
    int64_t off = 0;
    for (int32_t k = 0; k < n_streams; ++k) {
        const std::string who = n_streams > 1 ? "prompt " + std::to_string(k) + ": " : std::string();
        if (n_prompt[k] < 1) {
            throw std::invalid_argument(who + "the prompt is empty");
        }
        if (n_prompt[k] + 1 > n_ctx_seq) {
            throw std::length_error(who + "the prompt has " + std::to_string(n_prompt[k]) + " tokens, but the context holds " +
                                    std::to_string(n_ctx_seq) + (s.sp.n_parallel > 1 ? " per stream (n_ctx / n_parallel)" : " (n_ctx)") +
                                    "; raise n_ctx or shorten the prompt");
        }
        for (int32_t i = 0; i < n_prompt[k]; ++i) {
            const int32_t t = prompts[off + i];
            if (t < 0 || t >= n_vocab) {
                throw std::invalid_argument(who + "prompt token " + std::to_string(t) + " at position " + std::to_string(i) +
                                            " is outside the vocab (" + std::to_string(n_vocab) + ")");
            }
        }
        off += n_prompt[k];
    }
    reset_generation(s, n_streams);
    s.n_predict = n_predict;

    // prefill every stream's prompt but its last token, packed into as few target batches as fit
    {
        scoped_timer t(s.stats.t_prefill_ms);
        const int32_t n_batch = (int32_t) llama_n_batch(s.ctx_tgt.get());
        common_batch & batch = s.batch;
        batch.clear();
        auto flush = [&]() {
            if (batch.size() == 0) {
                return;
            }
            decode_or_throw(s.ctx_tgt.get(), batch, "prompt processing");
            if (s.spec && !common_speculative_process(s.spec, batch)) {
                throw std::runtime_error("the drafter failed to process the prompt");
            }
            batch.clear();
        };
        off = 0;
        for (int32_t k = 0; k < n_streams; ++k) {
            stream_state & st = s.streams[k];
            const int32_t * p = prompts + off;
            off += n_prompt[k];
            for (int32_t i = 0; i < n_prompt[k] - 1; ++i) {
                if ((int32_t) batch.size() >= n_batch) {
                    flush();
                }
                batch.add(p[i], i, st.seq, false);
            }
            st.prompt_tgt.reserve(n_ctx_seq);
            st.prompt_tgt.assign(p, p + n_prompt[k] - 1);
            st.id_last = p[n_prompt[k] - 1];
            st.n_past = n_prompt[k] - 1;
            st.stats.n_prompt = n_prompt[k];
            s.stats.n_prompt += n_prompt[k];
        }
        flush();
    }
    for (auto & st : s.streams) {
        if (s.spec) {
            common_speculative_begin(s.spec, st.seq, st.prompt_tgt);
        }
        st.active = true;
    }
    s.active = true;
}

void finish_stream(stream_state & st, int32_t why) {
    st.finish = why;
    st.active = false;
}

// Draft for every active stream that is not replaying: one common_speculative_draft call serves them all.
void draft_all(pls_session & s, int32_t n_ctx_seq) {
    llama_context * ctx_tgt = s.ctx_tgt.get();
    llama_context * ctx_dft = s.ctx_dft.get();
    llama_memory_t mem_tgt = llama_get_memory(ctx_tgt);
    scoped_timer t(s.stats.t_draft_ms);

    bool any = false;
    for (int32_t q = 0; q < s.sp.n_parallel; ++q) {
        common_speculative_get_draft_params(s.spec, q).drafting = false;
    }
    for (auto & st : s.streams) {
        if (!st.active || st.replay) {
            continue;
        }
        st.ckpt.update_pos(st.prompt_tgt.size(), llama_memory_seq_pos_min(mem_tgt, st.seq), llama_memory_seq_pos_max(mem_tgt, st.seq));
        if (s.use_ckpt_dft) {
            st.ckpt.update_dft(ctx_dft, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        }
        // n_max caps every type, n-gram ones included (their own lengths, e.g. size_m, are upper bounds too)
        int32_t n = std::min(s.n_max_effective, n_ctx_seq - st.n_past - 2);
        if (s.n_predict >= 0) {
            n = std::min<int32_t>(n, s.n_predict - (int32_t) st.n_emitted - 1);
        }
        n = std::max(n, 0);
        st.n_draft_max = n;
        st.draft.clear();
        common_speculative_get_draft_params(s.spec, st.seq) = {
            /* .drafting = */ true,
            /* .n_max    = */ n,
            /* .pos0     = */ st.n_past,
            /* .id_last  = */ st.id_last,
            /* .prompt   = */ &st.prompt_tgt,
            /* .result   = */ &st.draft,
        };
        any = true;
    }
    if (!any) {
        return;
    }
    common_speculative_draft(s.spec);
    for (auto & st : s.streams) {
        if (!st.active || st.replay) {
            continue;
        }
        if ((int32_t) st.draft.size() > st.n_draft_max) {
            st.draft.resize(st.n_draft_max);
        }
        st.ckpt_valid = false;
        if (!st.draft.empty() && (s.use_ckpt_tgt_always || (s.n_rs_seq > 0 && (int32_t) st.draft.size() > s.n_rs_seq))) {
            scoped_timer tr(s.stats.t_rollback_ms);
            st.ckpt.update_tgt(ctx_tgt, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            st.ckpt_valid = true;
        }
        if (ctx_dft) {
            // drop what the drafter wrote while drafting (e.g. the DFlash noise block) before the verify is injected
            if (s.use_ckpt_dft) {
                st.ckpt.load_dft(ctx_dft, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            }
            llama_memory_seq_rm(llama_get_memory(ctx_dft), st.seq, st.ckpt.pos_max + 1, -1);
        }
    }
}

// After the shared verify: accept, commit and roll back one stream. Appends its committed tokens (and margins).
void settle(pls_session & s, stream_state & st, common_sampler_ptr & smpl_save, std::vector<int32_t> & out_tokens,
            std::vector<float> & out_margins) {
    llama_context * ctx_tgt = s.ctx_tgt.get();
    llama_context * ctx_dft = s.ctx_dft.get();
    llama_memory_t mem_tgt = llama_get_memory(ctx_tgt);
    const llama_vocab * vocab = llama_model_get_vocab(s.target->model);
    const size_t n_draft = st.draft.size();
    const bool replay = st.replay;

    st.n_past += 1;
    llama_tokens ids;
    {
        scoped_timer t(s.stats.t_sample_ms);
        std::vector<int> idxs(n_draft + 1);
        for (size_t i = 0; i <= n_draft; ++i) {
            idxs[i] = st.i_batch + (int) i;
        }
        // force_reject: the zero-acceptance cost model - the target's own token at the first position only
        const bool refuse = s.sp.force_reject && !replay;
        ids = common_sampler_sample_and_accept_n(st.smpl.get(), ctx_tgt, refuse ? std::vector<int>{ idxs[0] } : idxs,
                                                 refuse ? llama_tokens() : st.draft);
    }
    const size_t n_accepted = ids.size() - 1;

    if (st.ckpt_valid && n_accepted < n_draft) {
        // restore the state before this verify and replay the accepted tokens as the next "draft"; the
        // checkpoint stays valid, so a replay that disagrees at a near-tie is restored and replayed again
        scoped_timer t(s.stats.t_rollback_ms);
        for (pls_stats * c : { &s.stats, &st.stats }) {
            c->n_rollback_checkpoint++;
            c->n_replayed += ids.size();
            if (!replay) {
                count_step(*c, n_draft, n_accepted);
            }
        }
        // the drafters hear about acceptance after the replay, whose verify batch they will have processed
        st.draft = std::move(ids);
        st.replay = true;
        st.ckpt.load_tgt(ctx_tgt, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        llama_memory_seq_rm(mem_tgt, st.seq, st.ckpt.pos_max + 1, -1);
        if (ctx_dft) {
            st.ckpt.load_dft(ctx_dft, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            llama_memory_seq_rm(llama_get_memory(ctx_dft), st.seq, st.ckpt.pos_max + 1, -1);
        }
        st.prompt_tgt.resize(st.ckpt.n_tokens);
        st.smpl = std::move(smpl_save);
        st.n_past = (int32_t) st.prompt_tgt.size();
        return;  // nothing committed yet: the next step replays and commits
    }

    if (!replay) {
        count_step(s.stats, n_draft, n_accepted);
        count_step(st.stats, n_draft, n_accepted);
    }
    if (s.spec) {
        // a replay commits exactly what the checkpointed step accepted; drafters still need to hear it
        common_speculative_accept(s.spec, st.seq, (uint16_t) n_accepted);
    }

    st.n_past += (int32_t) n_accepted;
    for (size_t i = 0; i < ids.size(); ++i) {
        st.prompt_tgt.push_back(st.id_last);
        st.id_last = ids[i];
        if (llama_vocab_is_eog(vocab, st.id_last)) {
            st.finish = PLS_FINISH_EOG;
            break;
        }
        if (s.n_predict >= 0 && st.n_emitted >= s.n_predict) {
            st.finish = PLS_FINISH_LENGTH;
            break;
        }
        out_tokens.push_back(st.id_last);
        if (s.sp.collect_margins) {
            out_margins.push_back(top2_margin(llama_get_logits_ith(ctx_tgt, st.i_batch + (int32_t) i), s.n_vocab));
        }
        st.n_emitted++;
    }
    st.replay = false;

    if (n_accepted < n_draft && !replay) {
        for (pls_stats * c : { &s.stats, &st.stats }) {
            (s.n_rs_seq > 0 ? c->n_rollback_ring : c->n_rollback_kv)++;
        }
    }
    {
        scoped_timer t(s.stats.t_rollback_ms);
        if (!llama_memory_seq_rm(mem_tgt, st.seq, st.n_past, -1)) {
            throw std::runtime_error("rollback of the target to position " + std::to_string(st.n_past) + " was refused");
        }
        if (ctx_dft && s.use_ckpt_dft && n_accepted < n_draft && !replay) {
            // a drafter that cannot drop tokens (a hybrid draft model) saw the whole verify batch: restore its
            // state from before the draft and feed it only what the target kept
            st.ckpt.load_dft(ctx_dft, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            llama_memory_seq_rm(llama_get_memory(ctx_dft), st.seq, st.ckpt.pos_max + 1, -1);
            common_batch kept(ctx_dft);
            for (size_t i = 0; i <= n_accepted; ++i) {
                kept.add(s.batch.tokens[st.i_batch + i].id, st.ckpt.pos_max + 1 + (int32_t) i, st.seq, false);
            }
            decode_or_throw(ctx_dft, kept, "drafter catch-up");
        } else if (ctx_dft) {
            llama_memory_seq_rm(llama_get_memory(ctx_dft), st.seq, st.n_past, -1);
        }
    }
    st.draft.clear();
    st.stats.n_generated += (int64_t) (out_tokens.size());
    s.stats.n_generated += (int64_t) (out_tokens.size());
    if (st.finish == PLS_FINISH_NONE && s.n_predict >= 0 && st.n_emitted >= s.n_predict) {
        st.finish = PLS_FINISH_LENGTH;
    }
    if (st.finish != PLS_FINISH_NONE) {
        st.active = false;
    }
}

// One verify step for every active stream: draft, one target batch, then accept/rollback per stream.
// out[i] receives stream i's committed tokens (and margins). Returns the number of streams still active.
int32_t step(pls_session & s, std::vector<std::vector<int32_t>> & out_tokens, std::vector<std::vector<float>> & out_margins) {
    // reused across steps: clear, keep the capacity
    out_tokens.resize(s.streams.size());
    out_margins.resize(s.streams.size());
    for (size_t k = 0; k < s.streams.size(); ++k) {
        out_tokens[k].clear();
        out_margins[k].clear();
    }
    if (!s.active) {
        return 0;
    }
    llama_context * ctx_tgt = s.ctx_tgt.get();
    const int32_t n_ctx_seq = (int32_t) llama_n_ctx_seq(ctx_tgt);
    const int64_t t_step0 = now_us();

    const bool stop = s.stop_requested.load();
    for (auto & st : s.streams) {
        if (st.active && stop) {
            finish_stream(st, PLS_FINISH_STOPPED);
        } else if (st.active && st.n_past + 1 >= n_ctx_seq) {
            finish_stream(st, PLS_FINISH_CONTEXT);
        }
    }

    if (s.spec) {
        draft_all(s, n_ctx_seq);
    }

    // verify every active stream's [id_last, draft...] in one target batch
    common_batch & batch = s.batch;
    int32_t n_active = 0;
    {
        scoped_timer t(s.stats.t_verify_ms);
        batch.clear();
        for (auto & st : s.streams) {
            if (!st.active) {
                continue;
            }
            n_active++;
            st.i_batch = (int32_t) batch.size();
            batch.add(st.id_last, st.n_past, st.seq, true);
            for (size_t i = 0; i < st.draft.size(); ++i) {
                batch.add(st.draft[i], st.n_past + 1 + (int32_t) i, st.seq, true);
            }
        }
        if (n_active > 0) {
            decode_or_throw(ctx_tgt, batch, "verification");
            if (s.spec && !common_speculative_process(s.spec, batch)) {
                throw std::runtime_error("the drafter failed to process the verified batch");
            }
        }
    }

    int32_t n_left = 0;
    for (size_t k = 0; k < s.streams.size(); ++k) {
        stream_state & st = s.streams[k];
        if (st.active) {
            common_sampler_ptr smpl_save;
            if (st.ckpt_valid) {
                smpl_save.reset(common_sampler_clone(st.smpl.get()));
            }
            settle(s, st, smpl_save, out_tokens[k], out_margins[k]);
        }
        n_left += st.active;
    }
    s.active = n_left > 0;
    s.stats.t_decode_ms += (now_us() - t_step0) / 1000.0;
    return n_left;
}

int32_t begin_status(pls_session * s, char * err, size_t err_size, const std::function<void()> & fn) {
    try {
        fn();
        return 0;
    } catch (const std::length_error & e) {
        pls::set_err(err, err_size, std::string("context: ") + e.what());
        return -2;
    } catch (const std::invalid_argument & e) {
        pls::set_err(err, err_size, e.what());
        return -3;
    } catch (const std::exception & e) {
        s->active = false;
        pls::set_err(err, err_size, e.what());
        return -1;
    }
}

void fail_generation(pls_session * s) {
    s->active = false;
    for (auto & st : s->streams) {
        if (st.active) {
            finish_stream(st, PLS_FINISH_ERROR);
        }
    }
}

}  // namespace

extern "C" pls_session * pls_session_open(pls_model * target, pls_model * drafter, const pls_session_params * params,
                                          char * err, size_t err_size) {
    pls::ensure_init();
    pls::clear_last_error();
    if (target == nullptr || params == nullptr) {
        pls::set_err(err, err_size, "no target model given");
        return nullptr;
    }
    auto s = std::make_unique<pls_session>();
    s->target = target;
    s->drafter = drafter;
    s->sp = *params;
    try {
        s->params = pls::session_common_params(s->sp);
        validate(*s);
        resolve_n_max(*s);
        check_placement(*s);
        create_contexts(*s);
        s->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(target->model));
        reset_generation(*s, 1);  // also proves the speculative engine accepts this configuration
    } catch (const std::exception & e) {
        pls::set_err(err, err_size, e.what());
        return nullptr;
    }
    return s.release();
}

extern "C" void pls_session_close(pls_session * session) { delete session; }

extern "C" int32_t pls_session_get_info(const pls_session * s, pls_session_info * out) {
    if (s == nullptr || out == nullptr) {
        return -1;
    }
    memset(out, 0, sizeof(*out));
    const auto & types = s->params.speculative.types;
    for (size_t i = 0; i < types.size() && i < PLS_MAX_SPEC_TYPES; ++i) {
        out->spec_types[i] = (int32_t) types[i];
        out->n_spec_types++;
    }
    out->n_max_requested = s->sp.n_max;
    out->n_max_effective = s->n_max_effective;
    out->block_size = s->block_size;
    out->is_dflash2 = s->drafter ? llama_model_dflash_selector_top_k(s->drafter->model) > 0 : 0;
    out->n_rs_seq = s->n_rs_seq;
    out->ring_bytes = s->ring_bytes;
    out->rollback_target = s->rollback_tgt;
    out->rollback_draft = s->rollback_dft;
    out->n_ctx = (int32_t) llama_n_ctx(s->ctx_tgt.get());
    out->n_batch = (int32_t) llama_n_batch(s->ctx_tgt.get());
    out->n_ubatch = (int32_t) llama_n_ubatch(s->ctx_tgt.get());
    out->n_parallel = s->sp.n_parallel;
    if (s->drafter) {
        const uint32_t n = llama_model_target_layer_ids_n(s->drafter->model);
        const int32_t * ids = llama_model_target_layer_ids(s->drafter->model);
        out->n_target_layers = (int32_t) n;
        for (uint32_t i = 0; i < n && i < 16; ++i) {
            out->target_layers[i] = ids[i];
        }
    }
    snprintf(out->target_head_device, sizeof(out->target_head_device), "%s",
             pls::device_name(llama_model_dev_output(s->target->model)).c_str());
    snprintf(out->draft_device, sizeof(out->draft_device), "%s", s->draft_device.c_str());
    return 0;
}

extern "C" int32_t pls_begin(pls_session * s, const int32_t * prompt, int32_t n_prompt, int32_t n_predict,
                             char * err, size_t err_size) {
    return begin_status(s, err, err_size, [&] { begin(*s, prompt, &n_prompt, 1, n_predict); });
}

extern "C" int32_t pls_begin_streams(pls_session * s, const int32_t * prompts, const int32_t * n_prompt, int32_t n_streams,
                                     int32_t n_predict, char * err, size_t err_size) {
    if (prompts == nullptr || n_prompt == nullptr) {
        pls::set_err(err, err_size, "no prompts given");
        return -3;
    }
    return begin_status(s, err, err_size, [&] { begin(*s, prompts, n_prompt, n_streams, n_predict); });
}

extern "C" int32_t pls_step(pls_session * s, int32_t * tokens, float * margins, int32_t capacity, int32_t * finish,
                            char * err, size_t err_size) {
    if (capacity < PLS_MAX_DRAFT + 1) {
        pls::set_err(err, err_size, "step buffer must hold at least PLS_MAX_DRAFT + 1 tokens");
        return -1;
    }
    if (s->streams.size() != 1) {
        pls::set_err(err, err_size, "pls_step drives a single stream; use pls_step_streams after pls_begin_streams");
        return -1;
    }
    std::vector<std::vector<int32_t>> toks;
    std::vector<std::vector<float>> mrg;
    try {
        // a checkpoint restore commits nothing; keep stepping until tokens arrive or generation ends
        do {
            step(*s, toks, mrg);
        } while (toks[0].empty() && s->active);
        std::copy(toks[0].begin(), toks[0].end(), tokens);
        if (margins != nullptr && !mrg[0].empty()) {
            std::copy(mrg[0].begin(), mrg[0].end(), margins);
        }
        *finish = s->streams[0].finish;
        return (int32_t) toks[0].size();
    } catch (const std::exception & e) {
        fail_generation(s);
        *finish = PLS_FINISH_ERROR;
        pls::set_err(err, err_size, e.what());
        return -1;
    }
}

extern "C" int32_t pls_step_streams(pls_session * s, int32_t * tokens, float * margins, int32_t capacity,
                                    int32_t * n_tokens, int32_t * finish, char * err, size_t err_size) {
    if (capacity < PLS_MAX_DRAFT + 1) {
        pls::set_err(err, err_size, "step buffer rows must hold at least PLS_MAX_DRAFT + 1 tokens");
        return -1;
    }
    std::vector<std::vector<int32_t>> toks;
    std::vector<std::vector<float>> mrg;
    try {
        const int32_t n_left = step(*s, toks, mrg);
        for (size_t k = 0; k < s->streams.size(); ++k) {
            std::copy(toks[k].begin(), toks[k].end(), tokens + k * capacity);
            if (margins != nullptr) {
                std::copy(mrg[k].begin(), mrg[k].end(), margins + k * capacity);
            }
            n_tokens[k] = (int32_t) toks[k].size();
            finish[k] = s->streams[k].finish;
        }
        return n_left;
    } catch (const std::exception & e) {
        fail_generation(s);
        for (size_t k = 0; k < s->streams.size(); ++k) {
            n_tokens[k] = 0;
            finish[k] = s->streams[k].finish;
        }
        pls::set_err(err, err_size, e.what());
        return -1;
    }
}

extern "C" int32_t pls_generate(pls_session * s, const int32_t * prompt, int32_t n_prompt, int32_t n_predict,
                                pls_emit_cb callback, void * user_data, char * err, size_t err_size) {
    const int32_t rc = pls_begin(s, prompt, n_prompt, n_predict, err, err_size);
    if (rc != 0) {
        return rc;
    }
    std::vector<std::vector<int32_t>> toks;
    std::vector<std::vector<float>> mrg;
    stream_state & st = s->streams[0];
    try {
        while (s->active) {
            step(*s, toks, mrg);
            const int32_t n = (int32_t) toks[0].size();
            if (n > 0 && callback != nullptr &&
                callback(user_data, toks[0].data(), s->sp.collect_margins ? mrg[0].data() : nullptr, n) != 0 && st.active) {
                finish_stream(st, PLS_FINISH_STOPPED);
                s->active = false;
            }
        }
        return st.finish;
    } catch (const std::exception & e) {
        fail_generation(s);
        pls::set_err(err, err_size, e.what());
        return -1;
    }
}

extern "C" int32_t pls_score_margins(pls_session * s, const int32_t * prompt, int32_t n_prompt, const int32_t * cont,
                                     int32_t n_cont, int32_t chunk, float * margins, char * err, size_t err_size) {
    return begin_status(s, err, err_size, [&] {
        if (n_cont < 1 || cont == nullptr || margins == nullptr) {
            throw std::invalid_argument("nothing to score: the continuation is empty");
        }
        // the context keeps logits for n_max + 1 tokens of a sequence per batch (a verify batch's worth)
        const int32_t max_chunk = s->params.n_outputs_max_per_seq;
        if (chunk < 1 || chunk > max_chunk) {
            throw std::invalid_argument("chunk=" + std::to_string(chunk) + " must be within 1.." + std::to_string(max_chunk) +
                                        " (n_max + 1: open the session with n_max >= chunk - 1)");
        }
        for (int32_t i = 0; i < n_cont; ++i) {
            if (cont[i] < 0 || cont[i] >= s->n_vocab) {
                throw std::invalid_argument("continuation token " + std::to_string(cont[i]) + " at position " +
                                            std::to_string(i) + " is outside the vocab (" + std::to_string(s->n_vocab) + ")");
            }
        }
        if (n_prompt + n_cont > (int32_t) llama_n_ctx_seq(s->ctx_tgt.get())) {
            throw std::length_error("prompt and continuation hold " + std::to_string(n_prompt + n_cont) +
                                    " tokens, but a stream's context holds " + std::to_string(llama_n_ctx_seq(s->ctx_tgt.get())));
        }
        // the prefill of a generation, then [last prompt token, continuation...] with every logit kept;
        // scoring is not generation, so the session's counters are left as they were
        const pls_stats saved = s->stats;
        begin(*s, prompt, &n_prompt, 1, 0);
        stream_state & st = s->streams[0];
        llama_tokens seq(1, st.id_last);
        seq.insert(seq.end(), cont, cont + n_cont - 1);
        common_batch & batch = s->batch;
        for (int32_t i0 = 0; i0 < n_cont; i0 += chunk) {
            batch.clear();
            const int32_t i1 = std::min(n_cont, i0 + chunk);
            for (int32_t i = i0; i < i1; ++i) {
                batch.add(seq[i], st.n_past + i, st.seq, true);
            }
            decode_or_throw(s->ctx_tgt.get(), batch, "scoring");
            for (int32_t i = i0; i < i1; ++i) {
                margins[i] = top2_margin(llama_get_logits_ith(s->ctx_tgt.get(), i - i0), s->n_vocab);
            }
        }
        finish_stream(st, PLS_FINISH_LENGTH);
        s->active = false;
        s->stats = saved;
    });
}

extern "C" int32_t pls_get_stream_stats(const pls_session * s, int32_t stream, pls_stats * out) {
    if (s == nullptr || out == nullptr || stream < 0 || stream >= (int32_t) s->streams.size()) {
        return -1;
    }
    *out = s->streams[stream].stats;
    return 0;
}

extern "C" void pls_request_stop(pls_session * s) {
    if (s) {
        s->stop_requested.store(true);
    }
}

extern "C" void pls_get_stats(const pls_session * s, pls_stats * out) {
    if (s && out) {
        *out = s->stats;
    }
}

extern "C" void pls_reset_stats(pls_session * s) {
    if (s) {
        s->stats = pls_stats{};
    }
}
