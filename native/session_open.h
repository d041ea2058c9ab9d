// Session open once the models are loaded, in order after validate_params (session_plan.h): what needs the
// loaded models, then placement, contexts and the drafter.
#pragma once

#include "session.h"

namespace pls {

void validate_pair(pls_session & s);      // throws status_error PLS_ERR_PAIRING with both values named
void resolve_n_max(pls_session & s);
void check_placement(pls_session & s);    // throws status_error PLS_ERR_PLACEMENT with the device to use
void create_contexts(pls_session & s);
void setup_drafting(pls_session & s);     // which drafter kind, the draft model's device sampler, the controller

// the engine's type list without the draft model the shim drives itself
std::vector<common_speculative_type> engine_types(const pls_session & s);

}  // namespace pls
