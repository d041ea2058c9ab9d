// The C API of sessions: open, close, info, generation (begin, step, generate, scoring), stats and the cost table.
// One call at a time per session (a concurrent call gets PLS_ERR_BUSY), status codes for every failure, and no C++
// exception crossing into the caller (api_guard.h). Sequences joining a running batch: session_seqs.cpp; the
// controller alone: controller_api.cpp.
#include "api_guard.h"
#include "session_open.h"

#include "llama-ext.h"

using namespace pls;

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
    // all at once: up to the drafter context's batch
    out->catchup_rows = !s->process_every_batch || !s->ctx_dft ? 0
                        : s->catchup_pass > 0                 ? s->catchup_pass
                                                              : (int32_t) llama_n_batch(s->ctx_dft.get());
    out->feature_rows = s->feature_rows;
    out->ring_bytes = s->ring_bytes;
    out->backend_sampling = s->tgt_device_greedy ? 1 : 0;
    out->kv_window = s->kv_window;
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
    return session_guarded(s, err, err_size, [&]() -> int32_t {
        if (prompt == nullptr) {
            fail(PLS_ERR_INVALID, "no prompt given");
        }
        ending_on_failure(*s, [&] { begin(*s, prompt, &n_prompt, 1, n_predict); });
        return PLS_OK;
    });
}

extern "C" int32_t pls_begin_streams(pls_session * s, const int32_t * prompts, const int32_t * n_prompt, int32_t n_streams,
                                     int32_t n_predict, char * err, size_t err_size) {
    return session_guarded(s, err, err_size, [&]() -> int32_t {
        if (prompts == nullptr || n_prompt == nullptr) {
            fail(PLS_ERR_INVALID, "no prompts given");
        }
        ending_on_failure(*s, [&] { begin(*s, prompts, n_prompt, n_streams, n_predict); });
        return PLS_OK;
    });
}

extern "C" int32_t pls_step(pls_session * s, int32_t * tokens, float * margins, int32_t capacity, int32_t * finish,
                            char * err, size_t err_size) {
    return session_guarded(s, err, err_size, [&]() -> int32_t {
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
    return session_guarded(s, err, err_size, [&]() -> int32_t {
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
    return session_guarded(s, err, err_size, [&]() -> int32_t {
        if (prompt == nullptr) {
            fail(PLS_ERR_INVALID, "no prompt given");
        }
        return ending_on_failure(*s, [&]() -> int32_t {
            std::vector<std::vector<int32_t>> toks;
            std::vector<std::vector<float>> mrg;
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
        });
    });
}

extern "C" int32_t pls_score_margins(pls_session * s, const int32_t * prompt, int32_t n_prompt, const int32_t * cont,
                                     int32_t n_cont, int32_t chunk, float * margins, char * err, size_t err_size) {
    return session_guarded(s, err, err_size, [&]() -> int32_t {
        if (prompt == nullptr) {
            fail(PLS_ERR_INVALID, "no prompt given");
        }
        ending_on_failure(*s, [&] { score_margins(*s, prompt, n_prompt, cont, n_cont, chunk, margins); });
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

extern "C" int32_t pls_session_export_costs(pls_session * s, pls_cost_point * out, int32_t capacity, char * err,
                                            size_t err_size) {
    return session_guarded(s, err, err_size, [&]() -> int32_t {
        return export_costs(*s->ctl, out, capacity);
    });
}

extern "C" int32_t pls_session_import_costs(pls_session * s, const pls_cost_point * in, int32_t n, char * err,
                                            size_t err_size) {
    return session_guarded(s, err, err_size, [&]() -> int32_t {
        import_costs(*s->ctl, in, n);
        return PLS_OK;
    });
}

extern "C" int32_t pls_session_health(pls_session * s, char * err, size_t err_size) {
    // beside a call in flight: reads only what the RPC client recorded about the session's devices
    return session_entry(s, err, err_size, [&]() -> int32_t {
        check_remote(s->target->model);
        if (s->drafter != nullptr) {
            check_remote(s->drafter->model);
        }
        return PLS_OK;
    });
}
