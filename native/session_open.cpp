// Session open, once the models are loaded: pairing guards, the draft length, placement, contexts and the drafter
// set up; and a session's teardown.
#include "session_open.h"

#include "device_greedy.h"

#include "llama-ext.h"
#include "llama-model.h"  // whether a drafter has its own LM head

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pls {

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

// A plain draft model must speak the target's tokenizer (common/speculative.cpp's compatibility check,
// which upstream runs when it builds its draft-simple state; this package drives draft models itself).
template <typename Fail>
void check_shared_tokenizer(const llama_model * mt, const llama_model * md, Fail && pairing) {
    const llama_vocab * vt = llama_model_get_vocab(mt);
    const llama_vocab * vd = llama_model_get_vocab(md);
    if (llama_vocab_type(vt) != llama_vocab_type(vd)) {
        pairing("tokenizer type: target has " + std::to_string(llama_vocab_type(vt)) + ", drafter has " +
                std::to_string(llama_vocab_type(vd)) + " - pick a drafter of the target's model family");
    }
    const struct { const char * name; bool t_add, d_add; llama_token t_id, d_id; } specials[] = {
        { "BOS", llama_vocab_get_add_bos(vt), llama_vocab_get_add_bos(vd), llama_vocab_bos(vt), llama_vocab_bos(vd) },
        { "EOS", llama_vocab_get_add_eos(vt), llama_vocab_get_add_eos(vd), llama_vocab_eos(vt), llama_vocab_eos(vd) },
    };
    for (const auto & sp : specials) {
        if (sp.t_add != sp.d_add || (sp.t_add && sp.t_id != sp.d_id)) {
            pairing(std::string("both models must agree on adding ") + sp.name + " and on its id: pick a drafter "
                    "of the target's model family");
        }
    }
    const int32_t nv_t = llama_vocab_n_tokens(vt);
    const int32_t nv_d = llama_vocab_n_tokens(vd);
    if (std::abs(nv_t - nv_d) > 128) {
        return;  // reported as a vocabulary size mismatch
    }
    constexpr int32_t first_checked = 5;  // the first few ids are special tokens that may differ
    for (int32_t i = first_checked; i < std::min(nv_t, nv_d); ++i) {
        if (std::strcmp(llama_vocab_get_text(vt, i), llama_vocab_get_text(vd, i)) != 0) {
            pairing("tokens " + std::to_string(first_checked) + ".." + std::to_string(std::min(nv_t, nv_d) - 1) +
                    " differ (first at id " + std::to_string(i) + "): the drafter must share the target's "
                    "tokenizer; pick a drafter of the same model family");
        }
    }
}

}  // namespace

void validate_pair(pls_session & s) {
    const auto & types = s.params.speculative.types;
    auto invalid = [](const std::string & m) { fail(PLS_ERR_INVALID, m); };
    auto pairing = [](const std::string & m) { fail(PLS_ERR_PAIRING, m); };

    const bool needs_drafter = has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) ||
                               has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3) ||
                               has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) ||
                               has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK);
    if (needs_drafter && s.drafter == nullptr) {
        invalid("speculative type " + common_speculative_type_name_str(types) + " needs a drafter model (-md)");
    }
    if (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_MTP) && s.drafter == nullptr &&
        llama_model_n_layer_nextn(s.target->model) <= 0) {
        invalid("draft-mtp needs a target with MTP (NextN) layers loaded; this target has none");
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
                pairing("hidden size (n_embd): target has " + std::to_string(llama_model_n_embd(mt)) +
                     ", drafter has " + std::to_string(llama_model_n_embd(md)) + " - this drafter was trained for another target");
            }
            const std::string arch = target_arch(mt);
            if (!arch_exports_layer_inputs(arch)) {
                pairing("target arch '" + arch + "' does not export layer inputs, which DFlash/EAGLE3 drafters "
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
                    pairing("target layer id " + std::to_string(ids[i]) + " (GGUF, HF id + 1) is outside 1.." +
                         std::to_string(hi) + " for a target with " + std::to_string(llama_model_n_layer(mt)) + " layers");
                }
            }
            if (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3) && n_ids != 3) {
                pairing("an EAGLE3 drafter taps exactly 3 target layers, this one lists " + std::to_string(n_ids));
            }
        }
        if (block) {
            const llama_token mask = llama_vocab_mask(llama_model_get_vocab(md));
            if (mask < 0 || mask >= nv_t) {
                pairing("mask token id " + std::to_string(mask) + " is outside the target vocab (" +
                     std::to_string(nv_t) + " tokens)");
            }
        }
        if (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) && !borrows) {
            check_shared_tokenizer(mt, md, pairing);
        }
        if (nv_d != nv_t && !(borrows && md->output == nullptr)) {
            if (has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE) ? std::abs(nv_d - nv_t) > 128 : true) {
                pairing("vocab size: target has " + std::to_string(nv_t) + " tokens, drafter has " +
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
        fail(PLS_ERR_INVALID, "n_batch=" + std::to_string(s.sp.n_batch) + " must be at least n_parallel x (n_max + 1) = " +
                                    std::to_string(n_verify) + " (one verify batch holds every stream's draft)");
    }
    // a non-causal block drafter decodes every stream's block in one micro-batch
    if (s.block_size > 0 && s.sp.n_ubatch < n_verify) {
        fail(PLS_ERR_INVALID, "n_ubatch=" + std::to_string(s.sp.n_ubatch) + " must be at least n_parallel x (n_max + 1) = " +
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
        fail(PLS_ERR_PLACEMENT,
            "this drafter borrows the target's LM head, which -sm tensor keeps in a meta buffer no drafter "
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
        fail(PLS_ERR_PLACEMENT,
            "the drafter borrows the target's LM head (output.weight), which is on " + pls::device_name(head) +
            ", but the drafter is placed on " + (names.empty() ? std::string("the CPU only") : names) +
            "; put the drafter on " + pls::device_name(head) + " (-devd " + pls::device_name(head) +
            ") or leave -devd unset");
    }
}

[[noreturn]] static void context_failure(const char * which) {
    const std::string why = pls::take_last_error();
    const bool memory = why.find("alloc") != std::string::npos || why.find("memory") != std::string::npos;
    fail(memory ? PLS_ERR_MEMORY : PLS_ERR_INTERNAL,
         std::string("failed to create the ") + which + " context" + (why.empty() ? std::string() : ": " + why) +
         (memory ? "; lower n_ctx or n_parallel, or offload fewer layers" : ""));
}

// the steps in which the target's KV cache view grows (llama pads it to 256 cells by default): a graph serves one
// view, and a GPU runs a new one eagerly, then captures it - for a 27B target on an H200 4-14 ms a batch size over
// 10-21 ms steps, every 256 tokens. By default 1024 cells where the target's output layer is on a GPU (attention
// over up to 1023 more cells costs it little); a CPU's attention pays for every cell, and builds a graph in about a
// millisecond
static void set_kv_window(pls_session & s) {
    int32_t want = s.sp.kv_window;
    if (want == 0) {
        ggml_backend_dev_t dev = llama_model_dev_output(s.target->model);
        want = dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU ? 256 : 1024;
    }
    if (want == 256) {
        return;
    }
    if (!llama_set_kv_pad(s.ctx_tgt.get(), (uint32_t) want)) {
        if (s.sp.kv_window != 0) {
            fail(PLS_ERR_INVALID, "kv_window=" + std::to_string(want) + ", but the target's memory holds no KV cache " +
                                  "whose view can grow in other steps; leave kv_window unset");
        }
        return;
    }
    s.kv_window = want;
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
        context_failure("target");
    }
    s.n_rs_seq = (int32_t) llama_n_rs_seq(s.ctx_tgt.get());
    set_kv_window(s);
    const int32_t n_verify = s.sp.n_parallel * (s.n_max_effective + 1);
    if (speculating && (int32_t) llama_n_batch(s.ctx_tgt.get()) < n_verify) {
        // llama.cpp caps a causal context's batch at n_ctx
        fail(PLS_ERR_INVALID, "n_ctx=" + std::to_string(s.sp.n_ctx) + " caps the batch at " +
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
            context_failure("draft");
        }
        c.speculative.draft.ctx_dft = s.ctx_dft.get();
        if (s.kv_window != 256) {
            llama_set_kv_pad(s.ctx_dft.get(), (uint32_t) s.kv_window);  // a drafter without a KV cache keeps none
        }
        ggml_backend_dev_t dd = s.drafter && llama_model_n_devices(md) > 0 ? llama_model_get_device(md, 0) : nullptr;
        s.draft_device = s.drafter ? pls::device_name(dd) : pls::device_name(nullptr);
    }
    c.speculative.draft.ctx_tgt = s.ctx_tgt.get();
    s.batch = common_batch(s.ctx_tgt.get());

    // how each context rolls back: probed once (the probe clears the memory, harmless before any prompt)
    const auto tgt_rm = common_context_can_seq_rm(s.ctx_tgt.get());
    if (tgt_rm == COMMON_CONTEXT_SEQ_RM_TYPE_NO && speculating) {
        fail(PLS_ERR_INVALID, "the target context cannot remove tokens, so speculative decoding cannot roll back");
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

namespace {

// verify by argmax: temperature 0 and nothing else in the target's sampler chain
bool greedy_sampling(const pls_session & s) {
    const common_params & c = s.params;
    int32_t n_suppress = 0;
    llama_vocab_get_suppress_tokens(llama_model_get_vocab(s.target->model), &n_suppress);
    const auto & sm = c.sampling;
    return sm.temp <= 0.0f && n_suppress == 0 && sm.logit_bias.empty() && common_grammar_value(sm.grammar).empty() &&
           sm.penalty_repeat == 1.0f && sm.penalty_freq == 0.0f && sm.penalty_present == 0.0f &&
           sm.dry_multiplier == 0.0f && sm.mirostat == 0;
}

// which kind of drafter the speculative types make (the controller prices each kind its own way)
void set_drafter_kind(pls_session & s) {
    const auto & types = s.params.speculative.types;
    s.own_draft_model = has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE);
    const bool autoreg = has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3) || has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_MTP);
    const bool block = has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) || has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK);
    bool ngram = false;
    for (auto t : types) {
        ngram = ngram || (t >= COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE && t <= COMMON_SPECULATIVE_TYPE_NGRAM_CACHE);
    }
    s.drafter_kind = s.own_draft_model ? DRAFTER_MODEL : autoreg ? DRAFTER_AUTOREGRESSIVE : block ? DRAFTER_BLOCK
                   : ngram ? DRAFTER_NGRAM : DRAFTER_NONE;
    s.process_every_batch = autoreg || block;
}

// rows per pass when a feature-reading drafter takes in the steps it did not draft (common_speculative_defer_pass:
// full passes, the rest in powers of two). On a GPU up to 8 rows keep ggml's vector kernels for quantized weights and
// shapes that steady drafting runs too (an H200, DFlash2 drafter of a 27B-shape target: 63 rows took 12-15 ms in one
// pass, 5.7 ms in passes of 8, 4, 2, 1); on a CPU one pass (catchup_pass 0: all at once) reads the weights once.
constexpr int32_t GPU_CATCHUP_ROWS = 8;

void set_catchup_rows(pls_session & s) {
    s.catchup_pass = 0;
    if (!s.process_every_batch || !s.ctx_dft) {
        if (s.sp.catchup_rows > 0) {
            fail(PLS_ERR_INVALID, "catchup_rows=" + std::to_string(s.sp.catchup_rows) +
                                  ": only a drafter that reads the target's features (DFlash, DSpark, EAGLE3, MTP) takes "
                                  "in skipped steps in passes, and this session has none; leave it at 0");
        }
        return;
    }
    ggml_backend_dev_t dev = llama_model_dev_output(llama_get_model(s.ctx_dft.get()));
    const bool gpu = dev != nullptr && ggml_backend_dev_type(dev) != GGML_BACKEND_DEVICE_TYPE_CPU;
    s.catchup_pass = s.sp.catchup_rows > 0 ? s.sp.catchup_rows : gpu ? GPU_CATCHUP_ROWS : 0;
}

// host_features asks for the features a drafter reads copied to the host after every batch, not kept on the
// target's device: only a drafter that reads layer inputs has any (MTP's nextn embeddings are copied either way)
void check_host_features(const pls_session & s) {
    if (!s.sp.host_features || (s.ctx_dft && reads_layer_inputs(engine_types(s)))) {
        return;
    }
    fail(PLS_ERR_INVALID, "host_features=true: only a drafter that reads the target's layer inputs (DFlash, DSpark, "
                          "EAGLE3) has features to copy to the host, and this session has none; leave it false");
}

// synthetic acceptance: validated by upstream's resolver, applied by the loop (upstream's engine only stores it)
void setup_synthetic_acceptance(pls_session & s) {
    common_params & c = s.params;
    if (s.sp.n_synth_rates <= 0 && s.sp.synth_len <= 0.0f) {
        return;
    }
    if (s.drafter_kind == DRAFTER_NONE) {
        fail(PLS_ERR_INVALID, "synthetic acceptance needs a speculative type that drafts");
    }
    c.speculative.synth_rates.assign(s.sp.synth_rates, s.sp.synth_rates + s.sp.n_synth_rates);
    c.speculative.synth_len = s.sp.synth_len > 0.0f ? s.sp.synth_len : -1.0;
    if (s.sp.n_synth_rates > 0 && s.sp.n_synth_rates != s.n_max_effective) {
        fail(PLS_ERR_INVALID, "synthetic acceptance needs one rate per draft position: " + std::to_string(s.n_max_effective) +
                              " (the effective n_max), got " + std::to_string(s.sp.n_synth_rates));
    }
    const std::vector<double> rates = common_speculative_synth_rates_resolve(&c.speculative, s.n_max_effective);
    double prev = 1.0;
    for (double r : rates) {
        s.synth_probs.push_back(prev > 0.0 ? r / prev : 0.0);
        prev = r;
    }
    c.speculative.synth_rates.clear();  // applied here, not by the engine
    c.speculative.synth_len = -1.0;
}

// the shim drives a draft model itself: its samplers (top-k on the device when it can); the engine keeps only
// the n-gram lookups of a combined list
void setup_own_draft_model(pls_session & s) {
    s.n_vocab_dft = llama_vocab_n_tokens(llama_model_get_vocab(s.drafter->model));
    s.batch_dft = common_batch(s.ctx_dft.get());
    for (int32_t q = 0; q < s.sp.n_parallel; ++q) {
        common_params_sampling sp;  // as upstream's draft-simple: the top 10 candidates, the best one drafted
        sp.no_perf = true;
        sp.top_k = 10;
        sp.samplers.assign(1, COMMON_SAMPLER_TYPE_TOP_K);
        s.dft_smpl.emplace_back(common_sampler_init(s.drafter->model, sp));
    }
    if (s.sp.draft_backend_sampling) {
        // top-k on the device: a handful of candidates come back instead of the whole vocabulary
        s.dft_chains.assign(s.sp.n_parallel, nullptr);
        for (int32_t q = 0; q < s.sp.n_parallel; ++q) {
            llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
            llama_sampler_chain_add(chain, llama_sampler_init_top_k(10));
            if (!llama_set_sampler(s.ctx_dft.get(), q, chain)) {
                llama_sampler_free(chain);
                for (auto & ch : s.dft_chains) {
                    if (ch) {
                        llama_set_sampler(s.ctx_dft.get(), &ch - s.dft_chains.data(), nullptr);
                        llama_sampler_free(ch);
                    }
                }
                s.dft_chains.clear();
                break;
            }
            s.dft_chains[q] = chain;
        }
    }
}

// greedy rows sampled on the target's output device (device_greedy.h): by default where that device is not the
// CPU (there the host's argmax reads logits already in memory); the sequences attach as they start
void setup_device_greedy(pls_session & s) {
    const int32_t want = s.sp.backend_sampling;
    if (want == 0) {
        return;
    }
    const char * why_not = !s.greedy ? "this session does not sample greedily (a temperature above 0, a grammar, "
                                       "penalties, logit biases or tokens the model suppresses)"
                         : s.sp.collect_margins ? "margins=True reads every row's logits on the host"
                                                : nullptr;
    if (why_not != nullptr) {
        if (want == 1) {
            fail(PLS_ERR_INVALID, std::string("backend_sampling=1 samples greedy rows on the device, but ") + why_not +
                                  "; leave backend_sampling unset");
        }
        return;
    }
    if (want < 0) {
        ggml_backend_dev_t dev = llama_model_dev_output(s.target->model);
        if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            return;
        }
    }
    s.tgt_device_greedy = true;
    s.tgt_chains.assign(s.sp.n_parallel, nullptr);
    // sequence 0 now: the device's support for every op is known before the first generation
    if (!device_greedy_attach(s, 0) && want == 1) {
        fail(PLS_ERR_INVALID, "backend_sampling=1, but the target's output device cannot run an argmax and a sum; "
                              "leave backend_sampling unset");
    }
}

}  // namespace

void setup_drafting(pls_session & s) {
    s.greedy = greedy_sampling(s);
    if (s.params.sampling.ignore_eos) {
        // as llama.cpp's --ignore-eos: every end-of-generation token biased to -inf, in the sampler chain and in
        // the argmax of greedy verification (which masks them itself, so it keeps its fast path)
        const llama_vocab * vocab = llama_model_get_vocab(s.target->model);
        for (llama_token t = 0; t < llama_vocab_n_tokens(vocab); ++t) {
            if (llama_vocab_is_eog(vocab, t)) {
                s.params.sampling.logit_bias.push_back({ t, -INFINITY });
                s.eog_tokens.push_back(t);
            }
        }
    }
    setup_device_greedy(s);
    set_drafter_kind(s);
    set_catchup_rows(s);
    check_host_features(s);
    setup_synthetic_acceptance(s);
    if (s.own_draft_model) {
        setup_own_draft_model(s);
    }
    controller_params cp;
    cp.n_max = s.n_max_effective;
    cp.n_streams = s.sp.n_parallel;
    cp.kind = (drafter_kind) s.drafter_kind;
    cp.adaptive = s.sp.adaptive != 0;
    cp.seed = s.sp.seed;
    cp.kv_window = s.kv_window;
    cp.schedule.assign(s.sp.k_schedule, s.sp.k_schedule + std::clamp(s.sp.n_k_schedule, 0, (int32_t) PLS_MAX_SCHEDULE));
    s.ctl = std::make_unique<controller>(cp);
}

// the engine's type list without the draft model the shim drives itself
std::vector<common_speculative_type> engine_types(const pls_session & s) {
    std::vector<common_speculative_type> out;
    for (auto t : s.params.speculative.types) {
        if (!(s.own_draft_model && t == COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE)) {
            out.push_back(t);
        }
    }
    return out;
}

}  // namespace pls

pls_session::~pls_session() {
    if (spec) {
        common_speculative_free(spec);
    }
    streams.clear();
    batch = common_batch();      // before the contexts they were sized for
    batch_dft = common_batch();
    if (ctx_dft) {
        for (size_t q = 0; q < dft_chains.size(); ++q) {
            if (dft_chains[q]) {
                llama_set_sampler(ctx_dft.get(), (llama_seq_id) q, nullptr);
            }
        }
    }
    if (ctx_tgt) {
        pls::device_greedy_release(*this);
    }
    ctx_dft.reset();
    ctx_tgt.reset();
    for (auto * ch : dft_chains) {
        llama_sampler_free(ch);
    }
    pls::model_release(drafter);
    pls::model_release(target);
}
