// The slot a new sequence of a running batch takes.
#pragma once

#include "session.h"

namespace pls {

// Each KV stream of a context is one slot, and a batch reaches the model in one pass only over a run of
// consecutive slots: the free slot that keeps the taken ones in the fewest runs, unless another holds a much longer
// prefix of the prompt; -1 when every slot is taken. Reads s.reserved and s.slot_kv (the caller holds s.ops_mu).
int32_t choose_slot(const pls_session & s, const int32_t * prompt, int32_t n_prompt);

}  // namespace pls
