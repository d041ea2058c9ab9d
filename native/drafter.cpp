// The draft model (draft-simple), driven by the shim token by token.
//
// Upstream's draft-simple re-decodes every verify batch in the draft model (process) and then drafts from the
// target's last token. Here the draft model keeps what it decoded while drafting: after a verify that accepted
// a tokens, the tokens it drafted and decoded are already in its KV, so only what it never saw is fed to it -
// folded into the first decode of its next draft. A stream that drafts nothing for a while (k = 0) leaves the
// draft model alone and catches up when it drafts again; far behind, it restarts from the recent context so
// one catch-up never costs more than a bounded number of plain steps.
// Draft models that cannot drop tokens (recurrent or hybrid) are checkpointed after the catch-up and
// restored after a partial accept; the restored-over tokens become the next catch-up.
#include "loop.h"

#include "log.h"

#include <algorithm>

namespace pls {

namespace {

void decode_dft(pls_session & s, const char * what) {
    const int32_t rc = llama_process(s.ctx_dft.get(), LLAMA_PROCESS_TYPE_DECODE, s.batch_dft.get());
    check_remote(llama_get_model(s.ctx_dft.get()));
    if (rc != 0) {
        const std::string why = take_last_error();
        fail(PLS_ERR_DECODE, std::string("draft model ") + what + " failed (llama_process returned " + std::to_string(rc) +
                             ")" + (why.empty() ? std::string() : ": " + why));
    }
}

void save_ckpt(pls_session & s, stream_state & st) {
    st.ckpt.update_dft(s.ctx_dft.get(), st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    st.dft.ckpt_valid = true;
    st.dft.ckpt_pos = st.dft.pos;
}

// a target token the draft model can read: a pair may differ in vocabulary size by a few padding tokens, which
// the target can still produce; the draft model sees token 0 there (only its guesses suffer, never the output)
llama_token dft_token(const pls_session & s, llama_token t) {
    return t >= 0 && t < s.n_vocab_dft ? t : 0;
}

}  // namespace

void draft_model_feed_batch(pls_session & s) {
    // the prompt goes to the draft model as it goes to the target: the same tokens, no outputs
    if (s.batch_dft.size() > 0) {
        decode_dft(s, "prompt processing");
    }
}

void draft_model_truncate(pls_session & s, stream_state & st, int32_t pos) {
    if (st.dft.pos <= pos) {
        return;
    }
    llama_memory_t mem = llama_get_memory(s.ctx_dft.get());
    if (!s.use_ckpt_dft && llama_memory_seq_rm(mem, st.seq, pos, -1)) {
        st.dft.pos = pos;
        return;
    }
    if (st.dft.ckpt_valid && st.dft.ckpt_pos <= pos) {
        st.ckpt.load_dft(s.ctx_dft.get(), st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        llama_memory_seq_rm(mem, st.seq, st.dft.ckpt_pos, -1);
        st.dft.pos = st.dft.ckpt_pos;
        return;
    }
    // nothing to go back to: start the stream's draft model over (its next draft catches up)
    llama_memory_seq_rm(mem, st.seq, -1, -1);
    st.dft.pos = 0;
    st.dft.ckpt_valid = false;
    st.dft.skipped_to = 0;
}

int32_t draft_model_pending(const stream_state & st) {
    return std::max(0, st.n_past - st.dft.pos);
}

namespace {

// The catch-up (what the draft model has not seen) and each drafting stream's last token, in as few decodes as fit;
// out_idx[seq] receives the row of the stream's first draft logits.
void draft_model_first(pls_session & s, const std::vector<stream_state *> & drafting, std::vector<int32_t> & out_idx) {
    llama_memory_t mem = llama_get_memory(s.ctx_dft.get());
    const int32_t n_batch = (int32_t) llama_n_batch(s.ctx_dft.get());
    const int32_t limit = s.ctl->catchup_limit(s.ctl->last_bucket());
    common_batch & batch = s.batch_dft;
    batch.clear();
    for (stream_state * st : drafting) {
        int32_t from = st->dft.pos;
        if (st->n_past - from > limit) {
            // too far behind to catch up cheaply: restart from the recent context
            llama_memory_seq_rm(mem, st->seq, -1, -1);
            from = std::max(0, st->n_past - limit);
            st->dft.skipped_to = from;
            st->dft.ckpt_valid = false;
        }
        st->catchup = st->n_past - from;
        for (int32_t p = from; p < st->n_past; ++p) {
            if (batch.size() >= n_batch) {
                decode_dft(s, "catch-up");
                batch.clear();
            }
            batch.add(dft_token(s, st->prompt_tgt[p]), p, st->seq, false);
        }
        st->dft.pos = st->n_past;
        if (s.use_ckpt_dft) {
            // a state to come back to after a partial accept: the catch-up decoded, the draft not yet
            if (batch.size() > 0) {
                decode_dft(s, "catch-up");
                batch.clear();
            }
            save_ckpt(s, *st);
        }
    }
    for (stream_state * st : drafting) {
        if (batch.size() >= n_batch) {
            decode_dft(s, "catch-up");
            batch.clear();
        }
        out_idx[st->seq] = batch.add(dft_token(s, st->id_last), st->n_past, st->seq, true);
        st->dft.pos = st->n_past + 1;
        common_sampler_reset(s.dft_smpl[st->seq].get());
    }
    decode_dft(s, "draft");
    // the device finishing the decode (on a GPU the call only queued it): the wait belongs to this decode's cost,
    // not to whatever synchronises next (the sampling below, after the clock has moved on)
    finish_on_device(s.ctx_dft.get());
}

// The first of the draft model's candidates (best first) that the grammar allows in its present state; n when
// none is (a token outside the target's vocabulary never is).
size_t first_allowed(const pls_session & s, llama_sampler * grammar, const llama_token_data_array * cur_p,
                     std::vector<llama_token_data> & scratch) {
    scratch.assign(cur_p->data, cur_p->data + cur_p->size);
    for (auto & c : scratch) {
        if (c.id < 0 || c.id >= s.n_vocab) {
            c.id = 0;
            c.logit = -INFINITY;
        }
    }
    llama_token_data_array arr = { scratch.data(), scratch.size(), -1, false };
    llama_sampler_apply(grammar, &arr);
    for (size_t i = 0; i < scratch.size(); ++i) {
        if (scratch[i].logit != -INFINITY) {
            return i;
        }
    }
    return cur_p->size;
}

// One token per decode for every stream still drafting; each stops at its k, below p_min, or where none of the
// draft model's top candidates is one the sequence's grammar allows (draft_grammar: the grammar in the state of the
// committed text, a clone of the target's sampler, followed token by token through the draft).
void draft_model_rest(pls_session & s, const std::vector<stream_state *> & drafting, std::vector<int32_t> & out_idx,
                      step_timing & tm) {
    llama_context * ctx = s.ctx_dft.get();
    common_batch & batch = s.batch_dft;
    size_t n_left = drafting.size();
    std::vector<common_sampler_ptr> grammar(s.streams.size());
    if (s.sp.draft_grammar) {
        for (stream_state * st : drafting) {
            if (common_sampler_get_grammar(st->smpl.get()) != nullptr) {
                grammar[st->seq].reset(common_sampler_clone(st->smpl.get()));
            }
        }
    }
    std::vector<llama_token_data> scratch;
    while (n_left > 0) {
        const int64_t t1 = now_us();
        batch.clear();
        for (stream_state * st : drafting) {
            if (out_idx[st->seq] < 0) {
                continue;
            }
            common_sampler * smpl = s.dft_smpl[st->seq].get();
            common_sampler_sample(smpl, ctx, out_idx[st->seq], true);
            const auto * cur_p = common_sampler_get_candidates(smpl, true);
            out_idx[st->seq] = -1;
            llama_sampler * g = grammar[st->seq] ? common_sampler_get_grammar(grammar[st->seq].get()) : nullptr;
            const size_t pick = g != nullptr ? first_allowed(s, g, cur_p, scratch) : 0;
            if (pick >= cur_p->size || cur_p->data[pick].p < st->p_min) {
                n_left--;
                continue;
            }
            const llama_token id = cur_p->data[pick].id;
            if (g != nullptr) {
                try {
                    llama_sampler_accept(g, id);
                } catch (const std::exception &) {
                    n_left--;  // the grammar cannot follow this token: the draft ends before it
                    continue;
                }
            }
            common_sampler_accept(smpl, id, true);
            st->draft.push_back(id);
            if ((int32_t) st->draft.size() >= st->k) {
                n_left--;
                continue;
            }
            const int32_t pos = st->n_past + (int32_t) st->draft.size();
            out_idx[st->seq] = batch.add(id, pos, st->seq, true);
            st->dft.pos = pos + 1;
        }
        if (batch.size() == 0) {
            break;
        }
        decode_dft(s, "draft");
        finish_on_device(ctx);
        tm.draft_rest_ms += (now_us() - t1) / 1000.0;
        tm.draft_iters++;
    }
}

}  // namespace

void draft_model_run(pls_session & s, step_timing & tm) {
    std::vector<stream_state *> drafting;
    for (auto & st : s.streams) {
        if (st.active && !st.replay && st.k > 0 && st.draft.empty()) {
            drafting.push_back(&st);
        }
    }
    if (drafting.empty()) {
        return;
    }
    std::vector<int32_t> out_idx(s.streams.size(), -1);
    const int64_t t0 = now_us();
    draft_model_first(s, drafting, out_idx);
    tm.draft_first_ms += (now_us() - t0) / 1000.0;
    draft_model_rest(s, drafting, out_idx, tm);
    for (stream_state * st : drafting) {
        if ((int32_t) st->draft.size() < st->n_min) {
            st->draft.clear();
        }
    }
}

void draft_model_settle(pls_session & s, stream_state & st) {
    // the draft model is right up to the token before the new last one; anything it decoded beyond is dropped
    draft_model_truncate(s, st, st.n_past);
}

}  // namespace pls
