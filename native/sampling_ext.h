// A sequence's sampling beyond temperature and truncation (grammar, penalties, logit biases) and the
// log-probabilities of what it commits: read from the header's pls_sampling_params, checked, and applied to
// upstream's common_params_sampling when the sequence's sampler is made.
#pragma once

#include "shim_common.h"

#include "sampling.h"

#include <string>
#include <vector>

namespace pls {

struct sampling_spec {
    std::string grammar;                   // GBNF; empty: none
    std::vector<common_grammar_trigger> triggers;  // given: the grammar is lazy, it applies from the first
    float penalty_repeat = 1.0f;
    float penalty_freq = 0.0f;
    float penalty_present = 0.0f;
    int32_t penalty_last_n = 64;           // -1: the context
    std::vector<llama_logit_bias> logit_bias;
    int32_t n_probs = -1;                  // -1: no log-probabilities

    bool penalties() const { return penalty_repeat != 1.0f || penalty_freq != 0.0f || penalty_present != 0.0f; }
    // anything that makes the target's choice other than the argmax of its logits at temperature 0
    bool shapes_choice() const { return !grammar.empty() || penalties() || !logit_bias.empty(); }
};

// The checked copy of p (NULL: none); PLS_ERR_INVALID names a setting that cannot be honoured. The grammar is
// parsed against the model's vocabulary here, so that making the sampler later cannot fail.
sampling_spec read_sampling(const llama_model * model, const pls_sampling_params * p);

// The spec into upstream's sampling parameters (n_ctx_seq: what a penalty_last_n of -1 looks back on).
void apply_sampling(const sampling_spec & spec, int32_t n_ctx_seq, common_params_sampling & out);

// Throws PLS_ERR_INVALID with the parser's message when grammar does not parse or has no root for the vocabulary.
void check_grammar(const llama_model * model, const std::string & grammar,
                   const std::vector<common_grammar_trigger> & triggers = {});

// The log-probability of token under the softmax of the raw logits, and the n_top most likely tokens.
void token_logprob(const float * logits, int32_t n_vocab, llama_token token, int32_t n_top, pls_token_logprob & out);

}  // namespace pls
