// Slot choice for continuous batching: packing the taken slots into few runs, reusing a prompt's prefix.
#include "slots.h"

namespace pls {

namespace {

// A prefix at least this much longer than the packed slot's is worth a split batch: processing a shorter one
// again costs less than a second pass over the weights at every step of the generation.
constexpr size_t PREFIX_OVER_PACKING = 256;

}  // namespace

// The slot for a new sequence. Each KV stream of a context is one slot, and a batch reaches the model in one pass
// only over a run of consecutive slots (llama.cpp splits a batch at every gap between the streams it touches), so
// the slot that keeps the taken ones in the fewest runs comes first; among those, the one whose last sequence left
// the longest prefix of this prompt, then the one holding least (what the others hold may serve a later prompt),
// then the lowest. A slot holding a prefix longer by PREFIX_OVER_PACKING tokens or more is taken instead.
int32_t choose_slot(const pls_session & s, const int32_t * prompt, int32_t n_prompt) {
    const size_t n = s.reserved.size();
    auto runs_with = [&](size_t slot) {
        size_t runs = 0;
        for (size_t i = 0; i < n; ++i) {
            const bool taken = s.reserved[i] || i == slot;
            const bool before = i > 0 && (s.reserved[i - 1] || i - 1 == slot);
            runs += taken && !before;
        }
        return runs;
    };
    auto common_with = [&](size_t slot) {
        const llama_tokens * kv = slot < s.slot_kv.size() ? &s.slot_kv[slot] : nullptr;
        size_t common = 0;
        while (kv && common < kv->size() && common + 1 < (size_t) n_prompt && (*kv)[common] == prompt[common]) {
            common++;
        }
        return common;
    };
    int32_t packed = -1, longest = -1;
    size_t packed_runs = 0, packed_common = 0, packed_held = 0, longest_common = 0;
    for (size_t i = 0; i < n; ++i) {
        if (s.reserved[i]) {
            continue;
        }
        const size_t runs = runs_with(i), common = common_with(i);
        const size_t held = i < s.slot_kv.size() ? s.slot_kv[i].size() : 0;
        if (packed < 0 || runs < packed_runs || (runs == packed_runs && (common > packed_common ||
                                                                         (common == packed_common && held < packed_held)))) {
            packed = (int32_t) i;
            packed_runs = runs;
            packed_common = common;
            packed_held = held;
        }
        if (longest < 0 || common > longest_common) {
            longest = (int32_t) i;
            longest_common = common;
        }
    }
    return longest >= 0 && longest_common >= packed_common + PREFIX_OVER_PACKING ? longest : packed;
}

}  // namespace pls
