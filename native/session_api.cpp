// The C API of sessions and of the controller: one call at a time per session (a concurrent call gets
// PLS_ERR_BUSY), status codes for every failure, and no C++ exception crossing into the caller.
#include "loop.h"

#include "llama-ext.h"

#include <cmath>

namespace {

using namespace pls;

// Holds a session for one call, or refuses with PLS_ERR_BUSY; the holder's thread is recorded so a call from
// inside the session's own callback can be told apart from one of another thread.
struct session_call {
    pls_session & s;
    std::unique_lock<std::mutex> lock;
    explicit session_call(pls_session & s) : s(s), lock(s.mu, std::defer_lock) {
        if (s.owner.load() == std::this_thread::get_id()) {
            fail(PLS_ERR_BUSY, "the session cannot be used from inside its own generation callback");
        }
        if (!lock.try_lock()) {
            fail(PLS_ERR_BUSY, "the session is in use by another thread; one call at a time");
        }
        s.owner.store(std::this_thread::get_id());
    }
    ~session_call() { s.owner.store(std::thread::id()); }
};

int32_t no_session(char * err, size_t err_size) {
    set_err(err, err_size, "no session given");
    return PLS_ERR_INVALID;
}

}  // namespace

extern "C" int32_t pls_session_open(pls_model * target, pls_model * drafter, const pls_session_params * params,
                                    pls_session ** out, char * err, size_t err_size) {
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        ensure_init();
        clear_last_error();
        if (out == nullptr) {
            fail(PLS_ERR_INVALID, "no place for the session given");
        }
        *out = nullptr;
        if (target == nullptr || params == nullptr) {
            fail(PLS_ERR_INVALID, "no target model given");
        }
        validate_params(*params);
        auto s = std::make_unique<pls_session>();
        model_retain(target);
        s->target = target;
        if (drafter) {
            model_retain(drafter);
            s->drafter = drafter;
        }
        s->sp = *params;
        s->params = session_common_params(s->sp);
        validate_pair(*s);
        resolve_n_max(*s);
        check_placement(*s);
        create_contexts(*s);
        s->n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(target->model));
        setup_drafting(*s);
        reset_generation(*s);  // also proves the speculative engine accepts this configuration
        publish_stats(*s);
        *out = s.release();
        return PLS_OK;
    });
}

extern "C" int32_t pls_session_close(pls_session * s) {
    if (s == nullptr) {
        return PLS_OK;
    }
    if (s->owner.load() == std::this_thread::get_id()) {
        s->stop_requested.store(true);
        return PLS_ERR_BUSY;
    }
    s->stop_requested.store(true);
    {
        std::lock_guard<std::mutex> wait(s->mu);  // the call in flight ends after its step
    }
    try {
        delete s;
    } catch (...) {
    }
    return PLS_OK;
}

extern "C" int32_t pls_session_get_info(const pls_session * s, pls_session_info * out) {
    if (s == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    memset(out, 0, sizeof(*out));
    const auto & types = s->params.speculative.types;
    for (size_t i = 0; i < types.size() && i < PLS_MAX_SPEC_TYPES; ++i) {
        out->spec_types[i] = (int32_t) types[i];
        out->n_spec_types++;
    }
    out->n_max_requested = s->sp.n_max;
    out->n_max_effective = s->n_max_effective;
    out->block_size = s->block_size;
    out->is_dflash2 = s->drafter ? llama_model_dflash_selector_top_k(s->drafter->model) > 0 : 0;
    out->n_rs_seq = s->n_rs_seq;
    out->ring_bytes = s->ring_bytes;
    out->rollback_target = s->rollback_tgt;
    out->rollback_draft = s->rollback_dft;
    out->n_ctx = (int32_t) llama_n_ctx(s->ctx_tgt.get());
    out->n_batch = (int32_t) llama_n_batch(s->ctx_tgt.get());
    out->n_ubatch = (int32_t) llama_n_ubatch(s->ctx_tgt.get());
    out->n_parallel = s->sp.n_parallel;
    if (s->drafter) {
        const uint32_t n = llama_model_target_layer_ids_n(s->drafter->model);
        const int32_t * ids = llama_model_target_layer_ids(s->drafter->model);
        out->n_target_layers = (int32_t) std::min<uint32_t>(n, 16);
        for (uint32_t i = 0; i < n && i < 16; ++i) {
            out->target_layers[i] = ids[i];
        }
    }
    snprintf(out->target_head_device, sizeof(out->target_head_device), "%s",
             device_name(llama_model_dev_output(s->target->model)).c_str());
    snprintf(out->draft_device, sizeof(out->draft_device), "%s", s->draft_device.c_str());
    out->adaptive = s->sp.adaptive != 0;
    out->synthetic = !s->synth_probs.empty();
    out->drafter_kind = s->drafter_kind;
    out->n_threads = (int32_t) llama_n_threads(s->ctx_tgt.get());
    out->n_threads_batch = (int32_t) llama_n_threads_batch(s->ctx_tgt.get());
    return PLS_OK;
}

extern "C" int32_t pls_begin(pls_session * s, const int32_t * prompt, int32_t n_prompt, int32_t n_predict,
                             char * err, size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
        if (prompt == nullptr) {
            fail(PLS_ERR_INVALID, "no prompt given");
        }
        try {
            begin(*s, prompt, &n_prompt, 1, n_predict);
        } catch (...) {
            end_generation(*s, PLS_FINISH_ERROR);
            throw;
        }
        return PLS_OK;
    });
}

extern "C" int32_t pls_begin_streams(pls_session * s, const int32_t * prompts, const int32_t * n_prompt, int32_t n_streams,
                                     int32_t n_predict, char * err, size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
        if (prompts == nullptr || n_prompt == nullptr) {
            fail(PLS_ERR_INVALID, "no prompts given");
        }
        try {
            begin(*s, prompts, n_prompt, n_streams, n_predict);
        } catch (...) {
            end_generation(*s, PLS_FINISH_ERROR);
            throw;
        }
        return PLS_OK;
    });
}

extern "C" int32_t pls_step(pls_session * s, int32_t * tokens, float * margins, int32_t capacity, int32_t * finish,
                            char * err, size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
        if (tokens == nullptr || finish == nullptr || capacity < PLS_MAX_DRAFT + 1) {
            fail(PLS_ERR_INVALID, "step buffer must hold at least PLS_MAX_DRAFT + 1 tokens");
        }
        if (s->n_begin != 1) {
            fail(PLS_ERR_INVALID, "pls_step drives a single stream; use pls_step_streams after pls_begin_streams");
        }
        std::vector<std::vector<int32_t>> toks;
        std::vector<std::vector<float>> mrg;
        try {
            // a checkpoint restore commits nothing; keep stepping until tokens arrive or generation ends
            do {
                step(*s, toks, mrg);
            } while (toks[0].empty() && s->active);
        } catch (...) {
            end_generation(*s, PLS_FINISH_ERROR);
            *finish = PLS_FINISH_ERROR;
            throw;
        }
        std::copy(toks[0].begin(), toks[0].end(), tokens);
        if (margins != nullptr && !mrg[0].empty()) {
            std::copy(mrg[0].begin(), mrg[0].end(), margins);
        }
        *finish = s->streams[0].finish;
        return (int32_t) toks[0].size();
    });
}

extern "C" int32_t pls_step_streams(pls_session * s, int32_t * tokens, float * margins, int32_t capacity,
                                    int32_t * n_tokens, int32_t * finish, char * err, size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
        if (tokens == nullptr || n_tokens == nullptr || finish == nullptr || capacity < PLS_MAX_DRAFT + 1) {
            fail(PLS_ERR_INVALID, "step buffer rows must hold at least PLS_MAX_DRAFT + 1 tokens");
        }
        std::vector<std::vector<int32_t>> toks;
        std::vector<std::vector<float>> mrg;
        int32_t n_left = 0;
        try {
            n_left = step(*s, toks, mrg);
        } catch (...) {
            end_generation(*s, PLS_FINISH_ERROR);
            for (int32_t k = 0; k < s->n_begin; ++k) {
                n_tokens[k] = 0;
                finish[k] = s->streams[k].finish;
            }
            throw;
        }
        if (s->n_begin == 0) {
            fail(PLS_ERR_INVALID, "no generation was begun; call pls_begin_streams first");
        }
        for (int32_t k = 0; k < s->n_begin; ++k) {
            std::copy(toks[k].begin(), toks[k].end(), tokens + k * capacity);
            if (margins != nullptr) {
                std::copy(mrg[k].begin(), mrg[k].end(), margins + k * capacity);
            }
            n_tokens[k] = (int32_t) toks[k].size();
            finish[k] = s->streams[k].finish;
        }
        return n_left;
    });
}

extern "C" int32_t pls_generate(pls_session * s, const int32_t * prompt, int32_t n_prompt, int32_t n_predict,
                                pls_emit_cb callback, void * user_data, char * err, size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
        if (prompt == nullptr) {
            fail(PLS_ERR_INVALID, "no prompt given");
        }
        std::vector<std::vector<int32_t>> toks;
        std::vector<std::vector<float>> mrg;
        try {
            begin(*s, prompt, &n_prompt, 1, n_predict);
            stream_state & st = s->streams[0];
            while (s->active) {
                step(*s, toks, mrg);
                const int32_t n = (int32_t) toks[0].size();
                if (n > 0 && callback != nullptr &&
                    callback(user_data, toks[0].data(), s->sp.collect_margins ? mrg[0].data() : nullptr, n) != 0 && st.active) {
                    end_generation(*s, PLS_FINISH_STOPPED);
                }
            }
            return st.finish;
        } catch (...) {
            end_generation(*s, PLS_FINISH_ERROR);
            throw;
        }
    });
}

extern "C" int32_t pls_score_margins(pls_session * s, const int32_t * prompt, int32_t n_prompt, const int32_t * cont,
                                     int32_t n_cont, int32_t chunk, float * margins, char * err, size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
        if (prompt == nullptr) {
            fail(PLS_ERR_INVALID, "no prompt given");
        }
        try {
            score_margins(*s, prompt, n_prompt, cont, n_cont, chunk, margins);
        } catch (...) {
            end_generation(*s, PLS_FINISH_ERROR);
            throw;
        }
        return PLS_OK;
    });
}

extern "C" int32_t pls_get_stream_stats(const pls_session * s, int32_t stream, pls_stats * out) {
    if (s == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    std::lock_guard<std::mutex> lock(s->stats_mu);
    if (stream < 0 || stream >= (int32_t) s->stream_stats_pub.size()) {
        return PLS_ERR_INVALID;
    }
    *out = s->stream_stats_pub[stream];
    return PLS_OK;
}

extern "C" void pls_request_stop(pls_session * s) {
    if (s) {
        s->stop_requested.store(true);
    }
}

extern "C" void pls_clear_stop(pls_session * s) {
    if (s) {
        s->stop_requested.store(false);
    }
}

extern "C" void pls_get_stats(const pls_session * s, pls_stats * out) {
    if (s && out) {
        std::lock_guard<std::mutex> lock(s->stats_mu);
        *out = s->stats_pub;
    }
}

extern "C" void pls_reset_stats(pls_session * s) {
    if (s == nullptr) {
        return;
    }
    std::unique_lock<std::mutex> lock(s->mu, std::defer_lock);
    if (s->owner.load() != std::this_thread::get_id() && lock.try_lock()) {
        try {
            reset_stats_now(*s);
        } catch (...) {
        }
    } else {
        s->reset_requested.store(true);  // the call in flight resets before its next step
        std::lock_guard<std::mutex> pub(s->stats_mu);
        s->stats_pub = pls_stats{};
    }
}

extern "C" int32_t pls_get_adaptive_info(const pls_session * s, pls_adaptive_info * out) {
    if (s == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    std::lock_guard<std::mutex> lock(s->stats_mu);
    *out = s->adaptive_pub;
    return PLS_OK;
}

namespace {

// A prefix at least this much longer than the packed slot's is worth a split batch: processing a shorter one
// again costs less than a second pass over the weights at every step of the generation.
constexpr size_t PREFIX_OVER_PACKING = 256;

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

}  // namespace

extern "C" int32_t pls_seq_add(pls_session * s, const int32_t * prompt, int32_t n_prompt, const pls_seq_params * params,
                               int32_t * slot, char * err, size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
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
        s->adds.push_back({ free_slot, llama_tokens(prompt, prompt + n_prompt), *params });
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
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
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

// ---- the controller alone -----------------------------------------------------------------------

struct pls_controller {
    std::unique_ptr<pls::controller> c;
};

extern "C" int32_t pls_controller_new(const pls_controller_params * p, pls_controller ** out, char * err, size_t err_size) {
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        if (p == nullptr || out == nullptr) {
            fail(PLS_ERR_INVALID, "controller parameters are required");
        }
        if (p->n_max < 0 || p->n_max > PLS_MAX_DRAFT || p->n_streams < 1 || p->n_streams > PLS_MAX_STREAMS ||
            p->drafter_kind < PLS_DRAFTER_MODEL || p->drafter_kind > PLS_DRAFTER_NGRAM) {
            fail(PLS_ERR_INVALID, "controller: n_max within 0..64, n_streams within 1..64 and a drafter kind are required");
        }
        controller_params cp;
        cp.n_max = p->n_max;
        cp.n_streams = p->n_streams;
        cp.kind = (drafter_kind) p->drafter_kind;
        cp.adaptive = p->adaptive != 0;
        cp.seed = p->seed;
        auto c = std::make_unique<pls_controller>();
        c->c = std::make_unique<pls::controller>(cp);
        *out = c.release();
        return PLS_OK;
    });
}

extern "C" void pls_controller_free(pls_controller * c) { delete c; }

extern "C" int32_t pls_controller_choose(pls_controller * c, const int32_t * caps, const int32_t * depth, const int32_t * active,
                                         const int32_t * pending, const int32_t * free_len, int32_t * k_out) {
    if (c == nullptr || caps == nullptr || depth == nullptr || active == nullptr || k_out == nullptr) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t {
        const int32_t n = c->c->params().n_streams;
        std::vector<int32_t> cap(caps, caps + n), dep(depth, depth + n), act(active, active + n), pend(n, 0), fr(n, 0), k;
        if (pending) {
            pend.assign(pending, pending + n);
        }
        if (free_len) {
            fr.assign(free_len, free_len + n);
        }
        c->c->choose(cap, dep, act, pend, k, fr);
        std::copy(k.begin(), k.end(), k_out);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_observe(pls_controller * c, const pls_step_observation * o) {
    if (c == nullptr || o == nullptr || o->k == nullptr || o->n_drafted == nullptr || o->n_accepted == nullptr ||
        o->depth == nullptr || o->active == nullptr || o->n_streams != c->c->params().n_streams) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t {
        const int32_t n = o->n_streams;
        step_obs s;
        s.k.assign(o->k, o->k + n);
        s.n_drafted.assign(o->n_drafted, o->n_drafted + n);
        s.n_accepted.assign(o->n_accepted, o->n_accepted + n);
        if (o->n_catchup) {
            s.n_catchup.assign(o->n_catchup, o->n_catchup + n);
        } else {
            s.n_catchup.assign(n, 0);
        }
        s.depth.assign(o->depth, o->depth + n);
        s.active.assign(o->active, o->active + n);
        if (o->source) {
            s.source.assign(o->source, o->source + n);
        } else {
            s.source.assign(n, 0);
        }
        s.t_draft_first_ms = o->t_draft_first_ms;
        s.t_draft_rest_ms = o->t_draft_rest_ms;
        s.n_draft_iters = o->n_draft_iters;
        s.t_draft_call_ms = o->t_draft_call_ms;
        s.t_target_ms = o->t_target_ms;
        s.t_step_ms = o->t_step_ms;
        c->c->observe(s);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_reset_stream(pls_controller * c, int32_t stream) {
    if (c == nullptr || stream < 0 || stream >= c->c->params().n_streams) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t {
        c->c->reset_stream(stream);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_info(const pls_controller * c, pls_adaptive_info * out) {
    if (c == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t {
        fill_adaptive_info(*c->c, *out);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_stats(const pls_controller * c, pls_stats * out) {
    if (c == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    memset(out, 0, sizeof(*out));
    const controller_counters & k = c->c->counters();
    for (size_t i = 0; i < k.k_hist.size() && i < 65; ++i) {
        out->k_hist[i] = k.k_hist[i];
    }
    out->n_probes = k.n_probes;
    out->n_guard = k.n_guard;
    out->est_plain_ms = k.est_plain_ms;
    return PLS_OK;
}

namespace {

static_assert((int) PLS_COST_TARGET == (int) COST_TARGET && (int) PLS_COST_DRAFT_FIRST == (int) COST_DRAFT_FIRST &&
              (int) PLS_COST_DRAFT_REST == (int) COST_DRAFT_REST && (int) PLS_COST_DRAFT_CALL == (int) COST_DRAFT_CALL &&
              (int) PLS_COST_OVERHEAD_PLAIN == (int) COST_OVERHEAD_PLAIN &&
              (int) PLS_COST_OVERHEAD_SPEC == (int) COST_OVERHEAD_SPEC && (int) PLS_COST_COLD == (int) COST_COLD,
              "cost table ids of the header and the controller must agree");

int32_t export_costs(const controller & c, pls_cost_point * out, int32_t capacity) {
    if (capacity < 0 || (capacity > 0 && out == nullptr)) {
        fail(PLS_ERR_INVALID, "export_costs: a buffer of capacity >= 0 is required");
    }
    const std::vector<cost_point> pts = c.export_costs();
    for (int32_t i = 0; i < capacity && i < (int32_t) pts.size(); ++i) {
        out[i] = { pts[i].table, pts[i].bucket, pts[i].n_tokens, pts[i].count, pts[i].ms };
    }
    return (int32_t) pts.size();
}

void import_costs(controller & c, const pls_cost_point * in, int32_t n) {
    if (n < 0 || n > PLS_COST_MAX_POINTS || (n > 0 && in == nullptr)) {
        fail(PLS_ERR_INVALID, "cost points: 0.." + std::to_string(PLS_COST_MAX_POINTS) + " are accepted, " +
                              std::to_string(n) + " given" + (n > 0 && in == nullptr ? " without a buffer" : ""));
    }
    std::vector<cost_point> pts;
    for (int32_t i = 0; i < n; ++i) {
        const pls_cost_point & p = in[i];
        const bool overhead = p.table == PLS_COST_OVERHEAD_PLAIN || p.table == PLS_COST_OVERHEAD_SPEC ||
                              p.table == PLS_COST_COLD;
        const bool ok = p.table >= PLS_COST_TARGET && p.table <= PLS_COST_COLD && p.bucket >= 0 &&
                        p.bucket < cost_table::N_BUCKETS && p.count >= 1 && std::isfinite(p.ms) && p.ms >= 0.0 &&
                        (overhead ? p.n_tokens == 0 : (p.n_tokens >= 1 && p.n_tokens <= cost_table::MAX_T));
        if (!ok) {
            fail(PLS_ERR_INVALID, "cost point " + std::to_string(i) + " is not valid (table " + std::to_string(p.table) +
                                  ", bucket " + std::to_string(p.bucket) + ", n_tokens " + std::to_string(p.n_tokens) +
                                  ", count " + std::to_string(p.count) + ", ms " + std::to_string(p.ms) + ")");
        }
        pts.push_back({ p.table, p.bucket, p.n_tokens, p.count, p.ms });
    }
    c.import_costs(pts);
}

}  // namespace

extern "C" int32_t pls_session_export_costs(pls_session * s, pls_cost_point * out, int32_t capacity, char * err,
                                            size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
        return export_costs(*s->ctl, out, capacity);
    });
}

extern "C" int32_t pls_session_import_costs(pls_session * s, const pls_cost_point * in, int32_t n, char * err,
                                            size_t err_size) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        session_call call(*s);
        import_costs(*s->ctl, in, n);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_export_costs(const pls_controller * c, pls_cost_point * out, int32_t capacity) {
    if (c == nullptr) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t { return export_costs(*c->c, out, capacity); });
}

extern "C" int32_t pls_controller_import_costs(pls_controller * c, const pls_cost_point * in, int32_t n, char * err,
                                               size_t err_size) {
    if (c == nullptr) {
        set_err(err, err_size, "no controller given");
        return PLS_ERR_INVALID;
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        import_costs(*c->c, in, n);
        return PLS_OK;
    });
}
