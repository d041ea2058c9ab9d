// A session's state, shared by the files of the speculative loop:
//   session_plan.cpp  parameters, checks and context parameters, before any model
//   session_open.cpp  pairing, n_max, placement, contexts, drafter set-up (everything done at open)
//   drafter.cpp       the draft model driven token by token (draft-simple), with catch-up after k = 0 steps
//   loop.cpp          begin, one step (draft -> verify -> settle per stream), scoring, the per-step trace
//   slots.cpp         which slot a new sequence takes
//   session_api.cpp, session_seqs.cpp, controller_api.cpp, trace.cpp
//                     the extern "C" entry points (api_guard.h: locking, status codes, no exception escaping)
#pragma once

#include "adaptive.h"
#include "sampling_ext.h"
#include "session_plan.h"

#include "common.h"
#include "sampling.h"
#include "speculative.h"

#include <atomic>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

namespace pls {

enum rollback_kind : int32_t {
    ROLLBACK_NONE = 0,
    ROLLBACK_KV = 1,          // attention-only memory: partial seq_rm
    ROLLBACK_RING = 2,        // recurrent-state snapshot ring (n_rs_seq)
    ROLLBACK_CHECKPOINT = 3,  // save state before verify, restore + replay after a partial accept
};

struct scoped_timer {
    double & acc_ms;
    int64_t t0;
    explicit scoped_timer(double & acc) : acc_ms(acc), t0(now_us()) {}
    ~scoped_timer() { acc_ms += (now_us() - t0) / 1000.0; }
};


// The draft model's view of one stream: what of the stream its KV holds.
struct draft_stream {
    int32_t pos = 0;           // next position the drafter would write; tokens [pos, n_past) are pending
    int32_t skipped_to = 0;    // a catch-up that restarted from the recent context: positions below it never decoded
    bool ckpt_valid = false;   // a state checkpoint of a drafter that cannot drop tokens
    int32_t ckpt_pos = 0;
    bool reads_prompt = true;  // the prompt goes to the draft model with the target (else it catches up if it drafts)
};

// One generated sequence of a session: its own position, draft, checkpoint, sampler and counters.
struct stream_state {
    llama_seq_id seq = 0;
    bool used = false;         // the slot holds a sequence (of this generation, or added to the running batch)
    bool active = false;       // generating (prompt processed, not finished)
    bool prefilling = false;   // prompt tokens still to process
    llama_tokens prompt_in;    // the whole prompt while it is processed
    int32_t n_prefilled = 0;
    int32_t n_prompt_step = 0; // prompt tokens processed in this step
    int32_t n_predict = -1;    // per sequence: -1 until the end of generation or context
    int32_t n_max_cap = -1;    // per sequence draft ceiling (-1: the session's)
    float p_min = 0.0f;        // per sequence (the shim's draft model)
    int32_t n_min = 0;
    llama_tokens prompt_tgt;   // tokens at positions [0, n_past): all committed but id_last
    llama_tokens draft;
    uint32_t draft_hash = 0;               // FNV-1a of this step's draft (0: none), for the trace
    llama_token id_last = 0;
    int32_t n_past = 0;
    int64_t n_emitted = 0;
    common_prompt_checkpoint ckpt;
    bool ckpt_valid = false;   // a target checkpoint was taken for the draft being verified
    bool replay = false;       // this step re-decodes tokens restored from a checkpoint
    int32_t i_batch = -1;      // where this stream's [id_last, draft...] starts in the verify batch
    int32_t k = 0;             // this step's draft length (controller's choice within the cap)
    int32_t catchup = 0;       // tokens the draft model caught up for this stream this step
    bool engine_draft = false; // this step's draft came from upstream's engine (n-gram or its drafters)
    int32_t n_drafted_step = 0;
    int32_t n_accepted_step = 0;
    int32_t finish = PLS_FINISH_NONE;
    bool greedy = false;       // verify by argmax (temperature 0, nothing else in the sampler chain)
    int32_t n_probs = -1;      // log-probabilities of committed tokens: -1 none, else with this many alternatives
    bool device_greedy = false; // greedy rows sampled on the device (device_greedy.h): no raw logits come back
    uint64_t synth_key = 0;    // synthetic acceptance: the seed and this prompt (a drafted token's draw is by position)
    common_sampler_ptr smpl;
    draft_stream dft;
    pls_stats stats{};         // counters only; the session's stats hold the (shared) timings
};

// Per-step measurements handed to the controller.
struct step_timing {
    double draft_first_ms = 0.0;
    double draft_rest_ms = 0.0;
    int32_t draft_iters = 0;
    double draft_call_ms = 0.0;
    double target_ms = 0.0;
};

}  // namespace pls

struct pls_session {
    pls_model * target = nullptr;
    pls_model * drafter = nullptr;
    pls_session_params sp{};
    common_params params;

    llama_context_ptr ctx_tgt;
    llama_context_ptr ctx_dft;
    common_speculative * spec = nullptr;   // upstream drafters (and n-gram lookups); not the shim's draft model
    bool spec_reusable = false;            // spec may serve the next generation (no step failed in this one)
    common_batch batch;                    // prompt chunks and verify batches of the target, reused every step
    common_batch batch_dft;                // the draft model's batches

    int32_t n_max_effective = 0;
    int32_t block_size = 0;
    bool sample_from_anchor = true;        // DSpark block layout
    int32_t rollback_tgt = pls::ROLLBACK_NONE;
    int32_t rollback_dft = pls::ROLLBACK_NONE;
    bool use_ckpt_tgt_always = false;      // FULL: every verify with a draft is checkpointed
    bool use_ckpt_dft = false;             // the draft model cannot drop tokens: checkpoint + catch-up
    int32_t n_rs_seq = 0;
    uint64_t ring_bytes = 0;
    int32_t n_vocab = 0;
    int32_t n_vocab_dft = 0;               // the draft model's vocabulary (may be smaller than the target's)
    bool greedy = false;                   // temperature 0 and nothing else to apply: verify by argmax
    std::vector<llama_token> eog_tokens;   // masked before every argmax (ignore_eos); empty otherwise
    bool tgt_device_greedy = false;        // greedy streams sample on the target's output device (backend_sampling)
    int32_t kv_window = 256;               // the target's KV cache view grows in steps of this many cells
    std::vector<llama_sampler *> tgt_chains;  // per sequence: its attached device argmax, nullptr when on the host
    std::string draft_device = "none";
    int32_t drafter_kind = pls::DRAFTER_NONE;
    bool own_draft_model = false;          // draft-simple: the shim drives the draft model itself
    bool process_every_batch = false;      // upstream drafters that read every target batch (EAGLE3, MTP, DFlash)
    int32_t catchup_pass = 0;              // rows per pass of such a drafter's catch-up (0: all at once)
    int32_t feature_rows = 0;              // rows per sequence the target keeps such a drafter's features in (0: host)
    std::vector<llama_sampler *> dft_chains;  // device-side top-k of the draft model, one per sequence
    std::vector<common_sampler_ptr> dft_smpl; // the draft model's samplers (top-k 10, as upstream's draft-simple)
    std::vector<double> synth_probs;       // conditional acceptance probabilities (synthetic mode)

    std::unique_ptr<pls::controller> ctl;

    // generation state: one slot per sequence the contexts hold; stream i is sequence i
    bool active = false;                   // some stream is still generating or processing its prompt
    std::vector<pls::stream_state> streams;
    int32_t n_begin = 0;                   // streams of the last begin (slots 0..n_begin-1); 0 in continuous mode
    bool continuous = false;               // sequences join and leave the running batch (pls_seq_add)
    std::atomic<bool> stop_requested{false};

    // sequences added or cancelled from any thread, applied at the next step
    struct pending_add {
        int32_t slot;
        llama_tokens prompt;
        pls_seq_params params;
        pls::sampling_spec sampling;
    };
    std::mutex ops_mu;
    std::vector<pending_add> adds;
    std::vector<int32_t> cancels;
    std::vector<char> reserved;            // slot taken by a sequence (pending or running), under ops_mu
    // per free slot: the tokens whose target KV its last sequence left (positions 0..), so that a later prompt
    // starting with them is not processed again; under ops_mu
    std::vector<llama_tokens> slot_kv;

    // the sampling of the sequences a begin starts (pls_session_set_sampling), and the log-probabilities of the
    // tokens each stream committed in the last step (for streams that asked for them)
    pls::sampling_spec sampling_begin;
    std::vector<std::vector<pls_token_logprob>> logprobs_step;

    // one call at a time; stats published under their own lock so any thread may read them
    std::mutex mu;
    std::atomic<std::thread::id> owner{};
    mutable std::mutex stats_mu;
    pls_stats stats{};                     // owned by the calling thread while it holds mu
    pls_stats stats_pub{};                 // what pls_get_stats reads
    std::vector<pls_stats> stream_stats_pub;
    pls_adaptive_info adaptive_pub{};
    std::atomic<bool> reset_requested{false};
    int64_t graph_captures0 = 0;           // the process-wide graph counters when the stats were last reset
    int64_t graph_resets0 = 0;
    int64_t graph_reused0 = 0;             // the contexts' reused-graph counts then
    std::vector<pls_trace_step> trace;     // steps recorded for pls_take_trace (under stats_mu), at most sp.trace_steps
    int64_t trace_dropped = 0;             // steps recorded beyond that since the last take

    ~pls_session();
};
