// The C API of continuous batching: sequences join a running batch (pls_seq_add, in the slot slots.h chooses),
// leave it (pls_seq_cancel), and step together (pls_step_seqs); the first of these calls switches a session from
// begin-style generation to continuous mode.
#include "api_guard.h"
#include "slots.h"

#include <cmath>

using namespace pls;

extern "C" int32_t pls_seq_add(pls_session * s, const int32_t * prompt, int32_t n_prompt, const pls_seq_params * params,
                               int32_t * slot, char * err, size_t err_size) {
    return pls_seq_add_sampling(s, prompt, n_prompt, params, nullptr, slot, err, err_size);
}

extern "C" int32_t pls_seq_add_sampling(pls_session * s, const int32_t * prompt, int32_t n_prompt,
                                        const pls_seq_params * params, const pls_sampling_params * sampling,
                                        int32_t * slot, char * err, size_t err_size) {
    return session_entry(s, err, err_size, [&]() -> int32_t {
        if (slot == nullptr || params == nullptr) {
            fail(PLS_ERR_INVALID, "sequence parameters and a place for the slot are required");
        }
        check_prompt(*s, prompt, n_prompt, std::string());
        if (!std::isfinite(params->temp) || !std::isfinite(params->top_p) || !std::isfinite(params->min_p) ||
            !std::isfinite(params->p_min) || params->top_p < 0.0f || params->top_p > 1.0f || params->min_p < 0.0f ||
            params->min_p > 1.0f || params->p_min > 1.0f || params->top_k < 0 || params->n_max > PLS_MAX_DRAFT ||
            params->n_min > PLS_MAX_DRAFT) {
            fail(PLS_ERR_INVALID, "sequence parameters out of range: temp, top_p, min_p must be finite (top_p, min_p "
                                  "within 0..1), top_k >= 0, n_max and n_min at most " + std::to_string(PLS_MAX_DRAFT));
        }
        sampling_spec spec = read_sampling(s->target->model, sampling);  // outside the lock: a grammar is parsed
        std::lock_guard<std::mutex> lock(s->ops_mu);
        if (!s->continuous) {
            // the first sequence of continuous batching: no begin-style generation may hold the slots
            if (s->n_begin > 0 && s->active) {
                fail(PLS_ERR_BUSY, "a generation begun with pls_begin is running on this session");
            }
            // a finished begin-style generation leaves its slots marked: only queued sequences hold one now
            std::fill(s->reserved.begin(), s->reserved.end(), 0);
            for (const auto & a : s->adds) {
                s->reserved[a.slot] = 1;
            }
        }
        const int32_t free_slot = choose_slot(*s, prompt, n_prompt);
        if (free_slot < 0) {
            fail(PLS_ERR_BUSY, "all " + std::to_string(s->sp.n_parallel) + " slots are taken; wait for a sequence to "
                               "finish or open the session with a larger n_parallel");
        }
        s->reserved[free_slot] = 1;
        s->adds.push_back({ free_slot, llama_tokens(prompt, prompt + n_prompt), *params, std::move(spec) });
        *slot = free_slot;
        return PLS_OK;
    });
}

extern "C" int32_t pls_seq_cancel(pls_session * s, int32_t slot) {
    if (s == nullptr) {
        return PLS_ERR_INVALID;
    }
    std::lock_guard<std::mutex> lock(s->ops_mu);
    const bool queued = std::any_of(s->adds.begin(), s->adds.end(), [&](const auto & a) { return a.slot == slot; });
    if (slot < 0 || slot >= (int32_t) s->reserved.size() || !s->reserved[slot] || (!s->continuous && !queued)) {
        return PLS_ERR_INVALID;
    }
    s->cancels.push_back(slot);
    return PLS_OK;
}

extern "C" int32_t pls_step_seqs(pls_session * s, pls_seq_event * events, int32_t capacity, int32_t * n_events,
                                 char * err, size_t err_size) {
    return session_guarded(s, err, err_size, [&]() -> int32_t {
        if (events == nullptr || n_events == nullptr || capacity < s->sp.n_parallel) {
            fail(PLS_ERR_INVALID, "the event buffer must hold n_parallel = " + std::to_string(s->sp.n_parallel) + " events");
        }
        *n_events = 0;
        if (!s->continuous) {
            if (s->n_begin > 0 && s->active) {
                fail(PLS_ERR_BUSY, "a generation begun with pls_begin is running on this session");
            }
            // the slots change hands: drop what a begin-style generation left
            std::vector<pls_session::pending_add> adds;
            {
                std::lock_guard<std::mutex> lock(s->ops_mu);
                adds.swap(s->adds);
            }
            reset_generation(*s);
            s->continuous = true;
            std::lock_guard<std::mutex> lock(s->ops_mu);
            s->adds.swap(adds);
            for (const auto & a : s->adds) {
                s->reserved[a.slot] = 1;
            }
        }
        std::vector<pls_seq_event> ev;
        int32_t n_left = 0;
        try {
            n_left = step_seqs(*s, ev);
        } catch (...) {
            // a failed step ends every sequence: report each, then free the slots
            for (auto & st : s->streams) {
                if (st.used && (st.active || st.prefilling) && *n_events < capacity) {
                    pls_seq_event e{};
                    e.slot = st.seq;
                    e.finish = PLS_FINISH_ERROR;
                    events[(*n_events)++] = e;
                }
            }
            {
                // and each sequence still queued (one waiting to copy another's prompt): its slot is freed too
                std::lock_guard<std::mutex> lock(s->ops_mu);
                for (const auto & a : s->adds) {
                    if (*n_events < capacity) {
                        pls_seq_event e{};
                        e.slot = a.slot;
                        e.finish = PLS_FINISH_ERROR;
                        events[(*n_events)++] = e;
                    }
                }
            }
            s->spec_reusable = false;
            reset_generation(*s);
            s->continuous = true;
            throw;
        }
        for (const auto & e : ev) {
            events[(*n_events)++] = e;
        }
        return n_left;
    });
}
