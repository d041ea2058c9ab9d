// Greedy verification on the device that holds the target's output layer: every verified row's argmax is taken
// there by a backend sampler (llama_set_sampler), so a step reads back one token and one number per row instead of
// the whole vocabulary's logits and scanning them on the host.
#pragma once

#include "session.h"

#include <cstdint>

namespace pls {

// A sampler chain for one sequence: the end-of-generation tokens masked to -inf (ignore_eos; none: no mask), then
// the argmax of the row and, beside it, the sum of the row: NaN where a logit is NaN (the loop ends the generation
// with an error there, as on the host). Owned by the caller (llama_sampler_free).
llama_sampler * device_greedy_chain(int32_t n_vocab, const llama_token * eog, int32_t n_eog);

// Whether the last llama_set_sampler of this chain found every op it needs on the device (the argmax then runs
// there); a chain that was never attached: false.
bool device_greedy_ready(llama_sampler * chain);

// Attach a sequence's chain (a no-op when attached); where the device cannot run it, every sequence's is released
// and the session samples on the host from then on. Returns whether the sequence samples on the device.
bool device_greedy_attach(pls_session & s, int32_t seq);
void device_greedy_detach(pls_session & s, int32_t seq);
// every sequence back to the host; the session no longer tries the device (and before its context goes)
void device_greedy_release(pls_session & s);

// The stream's sequence samples its greedy rows on the device (on) or on the host (off): the sampler is attached
// or detached as needed. A stream that reads raw logits (log-probabilities, margins, scoring) or samples other than
// greedily runs off. Returns whether the stream samples on the device now.
bool device_greedy_set(pls_session & s, stream_state & st, bool on);

// The token the device chose for output row idx of the last batch; checks the row's sum for NaN (fails as the host
// argmax does) and the token for being in the vocabulary.
llama_token device_greedy_token(pls_session & s, int32_t idx);

}  // namespace pls
