// How a session's contexts are configured, shared by session open and the memory estimate. Below the session
// (session.h), which includes this header: nothing here takes a session.
#pragma once

#include "shim_common.h"

#include "common.h"

#include <vector>

namespace pls {

int64_t now_us();
bool has_type(const std::vector<common_speculative_type> & types, common_speculative_type t);

// llama.cpp's common parameters for a session (sampling, speculative settings, batch sizes, threads)
common_params session_common_params(const pls_session_params & p);

// the draft length after each type's own clamp (DFlash: block_size - 1, DSpark: block_size unless its block
// is [anchor, N predictions]); block_size 0 when no block drafter
int32_t effective_n_max(const std::vector<common_speculative_type> & types, int32_t n_max, int32_t block_size,
                        bool sample_from_anchor = true);

// rows a deferred drafter keeps for a stream that does not draft: the most recent ones (older ones leave a gap in
// its context when it drafts again, as a draft model's limited catch-up does)
constexpr int32_t KEPT_ROWS = 512;

// rows per sequence the target keeps a feature-reading drafter's features in on its layers' devices (patches 0014,
// 0015; one more row each for what falls behind them), and so the most rows of one sequence a batch holds: at least
// the rows a deferred drafter keeps, and a whole ubatch, so that a prompt goes in the ubatches it would go in with
// the features copied to the host (an H100, 27B + DFlash2, a 4 096-token prompt in ubatches of 2 048: 1.85 s with
// host copies, 2.11 s in chunks of 512)
inline int32_t feature_ring_rows(int32_t n_ubatch) { return n_ubatch > KEPT_ROWS ? n_ubatch : KEPT_ROWS; }

// the drafters that read the target's layer inputs (DFlash, DSpark, EAGLE3; MTP reads its nextn embeddings)
bool reads_layer_inputs(const std::vector<common_speculative_type> & types);

struct context_plan {
    llama_context_params target{};
    llama_context_params draft{};
    bool has_draft = false;
};

// context parameters of target and draft; throws std::invalid_argument where upstream would assert
context_plan plan_contexts(common_params & c, const pls_session_params & sp, int32_t n_max_eff, bool target_recurrent);

// the first check of session open: what can be checked on the parameters alone (the rest: session_open.h)
void validate_params(const pls_session_params & p);

}  // namespace pls
