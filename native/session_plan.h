// How a session's contexts are configured, shared by session open and the memory estimate.
#pragma once

#include "shim_common.h"

#include "common.h"

#include <vector>

struct pls_session;

namespace pls {

// llama.cpp's common parameters for a session (sampling, speculative settings, batch sizes, threads)
common_params session_common_params(const pls_session_params & p);

// the draft length after each type's own clamp (DFlash: block_size - 1, DSpark: block_size unless its block
// is [anchor, N predictions]); block_size 0 when no block drafter
int32_t effective_n_max(const std::vector<common_speculative_type> & types, int32_t n_max, int32_t block_size,
                        bool sample_from_anchor = true);

struct context_plan {
    llama_context_params target{};
    llama_context_params draft{};
    bool has_draft = false;
};

// context parameters of target and draft; throws std::invalid_argument where upstream would assert
context_plan plan_contexts(common_params & c, const pls_session_params & sp, int32_t n_max_eff, bool target_recurrent);

// session open, in order: what can be checked on the parameters, what needs the loaded models, contexts
void validate_params(const pls_session_params & p);
void validate_pair(pls_session & s);      // throws status_error PLS_ERR_PAIRING with both values named
void resolve_n_max(pls_session & s);
void check_placement(pls_session & s);    // throws status_error PLS_ERR_PLACEMENT with the device to use
void create_contexts(pls_session & s);
void setup_drafting(pls_session & s);     // which drafter kind, the draft model's device sampler, the controller
std::vector<common_speculative_type> engine_types(const pls_session & s);

}  // namespace pls
