// The loop's entry points, shared with the C API and the draft-model driver.
#pragma once

#include "session_open.h"

namespace pls {

void decode_or_throw(llama_context * ctx, common_batch & batch, const char * what);
void reset_generation(pls_session & s);
void check_prompt(const pls_session & s, const int32_t * prompt, int32_t n_prompt, const std::string & who);
// p and spec NULL: a stream of a begin (the session's sampling)
void start_stream(pls_session & s, stream_state & st, const int32_t * prompt, int32_t n_prompt, const pls_seq_params * p,
                  const sampling_spec * spec = nullptr);
// one step of the running batch (continuous mode): apply queued adds and cancels, then step; events per sequence
int32_t step_seqs(pls_session & s, std::vector<pls_seq_event> & events);
void begin(pls_session & s, const int32_t * prompts, const int32_t * n_prompt, int32_t n_streams, int32_t n_predict);
// one verify step for every active stream; out[i] receives stream i's committed tokens (and margins).
// Returns the number of streams still active.
int32_t step(pls_session & s, std::vector<std::vector<int32_t>> & out_tokens, std::vector<std::vector<float>> & out_margins);
void end_generation(pls_session & s, int32_t why);
void score_margins(pls_session & s, const int32_t * prompt, int32_t n_prompt, const int32_t * cont, int32_t n_cont,
                   int32_t chunk, float * margins);
void publish_stats(pls_session & s);
void fill_adaptive_info(const controller & c, pls_adaptive_info & out);
void reset_stats_now(pls_session & s);

// the draft model driven by the shim (drafter.cpp)
void draft_model_feed_batch(pls_session & s);  // decodes s.batch_dft (prompt tokens, no outputs)
void draft_model_run(pls_session & s, step_timing & tm);
void draft_model_settle(pls_session & s, stream_state & st);
void draft_model_truncate(pls_session & s, stream_state & st, int32_t pos);
int32_t draft_model_pending(const stream_state & st);

}  // namespace pls
