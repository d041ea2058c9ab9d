// The speculative loop: begin (prefill), then steps of draft -> verify -> settle for every active stream.
//
// The loop follows upstream's reference driver (examples/speculative-simple) and the server's rule for
// recurrent targets: a target with a snapshot ring rolls back in place when the draft fits the ring, and
// falls back to checkpoint + replay when it does not (or when the arch keeps no ring at all). How many
// tokens each stream drafts in a step is the controller's choice (adaptive.h), made from measured costs.
#include "loop.h"

#include "device_greedy.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace pls {

namespace {

// one verify step that committed tokens: a replay after a checkpoint restore is not a new step
void count_step(pls_stats & st, size_t n_draft, size_t n_accepted) {
    st.n_steps++;
    st.n_drafts += n_draft > 0;
    st.n_drafted += n_draft;
    st.n_accepted += n_accepted;
    for (size_t i = 0; i < n_draft && i < PLS_MAX_DRAFT; ++i) {
        st.drafted_per_pos[i]++;
    }
    for (size_t i = 0; i < n_accepted && i < PLS_MAX_DRAFT; ++i) {
        st.accepted_per_pos[i]++;
    }
    st.k_hist[std::min<size_t>(n_draft, PLS_MAX_DRAFT)]++;
}

// target top-1 minus top-2 logit: how close the target's own choice was to a tie at this position
float top2_margin(const float * logits, int32_t n_vocab) {
    float a = -INFINITY, b = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) {
        const float v = logits[i];
        if (v > a) {
            b = a;
            a = v;
        } else if (v > b) {
            b = v;
        }
    }
    return a - b;
}

// synthetic acceptance draws by position: the token drafted for position pos of a stream lands when this uniform
// number is below its rate, so arms that share a prompt and a seed face the same acceptance along the text however
// they split it into drafts (common random numbers: two arms differ by their choices, not by their luck)
uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

double synth_uniform(uint64_t key, int32_t pos) {
    return (double) (mix64(key ^ mix64((uint64_t) (uint32_t) pos)) >> 11) * (1.0 / 9007199254740992.0);
}

uint64_t synth_key_of(uint32_t seed, llama_seq_id seq, const int32_t * prompt, int32_t n_prompt) {
    uint64_t h = mix64(((uint64_t) seed << 32) | (uint32_t) seq);
    for (int32_t i = 0; i < n_prompt; ++i) {
        h = mix64(h ^ (uint32_t) prompt[i]);
    }
    return h;
}

void finish_stream(stream_state & st, int32_t why) {
    st.finish = why;
    st.active = false;
}

}  // namespace

void decode_or_throw(llama_context * ctx, common_batch & batch, const char * what) {
    const int32_t rc = llama_process(ctx, LLAMA_PROCESS_TYPE_DECODE, batch.get());
    check_remote(llama_get_model(ctx));  // a remote device that went away: its replies were zeros, not logits
    if (rc != 0) {
        const std::string why = take_last_error();
        fail(PLS_ERR_DECODE, std::string(what) + " failed (llama_process returned " + std::to_string(rc) + ")" +
                             (why.empty() ? std::string() : ": " + why));
    }
}

void reset_generation(pls_session & s) {
    llama_memory_clear(llama_get_memory(s.ctx_tgt.get()), true);
    if (s.ctx_dft) {
        llama_memory_clear(llama_get_memory(s.ctx_dft.get()), true);
    }
    // Drafters that read the target's features are kept from one generation to the next: creating one switches
    // feature extraction on in the target, which re-plans the target's compute graphs (on a GPU every batch shape is
    // then run eagerly and captured again). Each sequence's state is reset where its prompt starts
    // (common_speculative_defer, common_speculative_begin), as for a slot's next request. After a failed step the
    // engine is built anew. Other engines (n-gram lookups) start every generation fresh.
    if (s.spec && !(s.process_every_batch && s.spec_reusable)) {
        common_speculative_free(s.spec);
        s.spec = nullptr;
    }
    s.spec_reusable = true;
    const auto types = engine_types(s);
    if (s.spec == nullptr && !types.empty() && !has_type(types, COMMON_SPECULATIVE_TYPE_NONE)) {
        // one drafting state per sequence the contexts hold, whether or not this generation uses them all
        common_params_speculative sp = s.params.speculative;
        sp.types = types;
        s.spec = common_speculative_init(sp, s.sp.n_parallel);
        if (s.spec == nullptr) {
            fail(PLS_ERR_INVALID, "failed to initialize speculative decoding for " + common_speculative_type_name_str(types));
        }
        common_speculative_defer_pass(s.spec, s.catchup_pass);
        // the target keeps the features such a drafter reads on its device, and they are read when it processes
        // them: a step that drafts nothing copies none to the host (patch 0015). Where the device has no room for
        // them, or the drafter reads no layer features, they are copied after every batch as before
        s.feature_rows = 0;
        const int32_t rows = feature_ring_rows((int32_t) llama_n_ubatch(s.ctx_tgt.get()));
        if (!s.sp.host_features && common_speculative_defer_ring(s.spec, rows)) {
            s.feature_rows = rows;
        }
    }
    s.streams.clear();
    s.streams.resize(s.sp.n_parallel);
    for (int32_t i = 0; i < s.sp.n_parallel; ++i) {
        s.streams[i].seq = i;
        s.ctl->reset_stream(i);
    }
    {
        std::lock_guard<std::mutex> lock(s.ops_mu);
        s.adds.clear();
        s.cancels.clear();
        s.reserved.assign(s.sp.n_parallel, 0);
        s.slot_kv.assign(s.sp.n_parallel, llama_tokens());
    }
    s.n_begin = 0;
    s.continuous = false;
    s.active = false;
}

void check_prompt(const pls_session & s, const int32_t * prompt, int32_t n_prompt, const std::string & who) {
    const int32_t n_ctx_seq = (int32_t) llama_n_ctx_seq(s.ctx_tgt.get());
    if (n_prompt < 1 || prompt == nullptr) {
        fail(PLS_ERR_INVALID, who + "the prompt is empty");
    }
    if (n_prompt + 1 > n_ctx_seq) {
        fail(PLS_ERR_CONTEXT, who + "the prompt has " + std::to_string(n_prompt) + " tokens, but the context holds " +
                              std::to_string(n_ctx_seq) + (s.sp.n_parallel > 1 ? " per stream (n_ctx / n_parallel)" : " (n_ctx)") +
                              "; raise n_ctx or shorten the prompt");
    }
    for (int32_t i = 0; i < n_prompt; ++i) {
        if (prompt[i] < 0 || prompt[i] >= s.n_vocab) {
            fail(PLS_ERR_INVALID, who + "prompt token " + std::to_string(prompt[i]) + " at position " + std::to_string(i) +
                                  " is outside the vocab (" + std::to_string(s.n_vocab) + ")");
        }
    }
}

bool prefix_reusable(const pls_session & s) {
    // a target whose memory drops tokens from any position, and no drafter that reads the target's batches (it
    // would miss the reused ones); a draft model of our own catches up on its first draft instead
    return s.rollback_tgt == ROLLBACK_KV && !s.process_every_batch;
}

namespace {

// A prefix another slot holds is copied from there when it is at least this much longer than the slot's own: the
// other stream's memory is copied whole, and a few tokens of prompt are processed with the batch's other rows anyway.
constexpr int32_t MIN_SHARED = 8;

struct prefix_source {
    int32_t seq = -1;      // the slot whose target memory holds it
    int32_t n_tokens = 0;  // its length, at most the prompt's but one token
};

// The tokens another slot's target memory holds from position 0 on: a generating sequence's committed tokens, or
// what a finished one left (the caller holds s.ops_mu). A sequence still processing its prompt offers none.
const llama_tokens * held_by(const pls_session & s, int32_t j) {
    const stream_state & o = s.streams[j];
    if (o.used) {
        return o.active ? &o.prompt_tgt : nullptr;
    }
    return j < (int32_t) s.slot_kv.size() ? &s.slot_kv[j] : nullptr;
}

int32_t common_prefix(const llama_tokens & kv, const int32_t * prompt, int32_t n_prompt) {
    const int32_t most = std::min<int32_t>((int32_t) kv.size(), n_prompt - 1);  // the last token is verified
    int32_t n = 0;
    while (n < most && kv[n] == prompt[n]) {
        n++;
    }
    return n;
}

// The longest prefix of a prompt (but its last token) that the target's memory holds in a slot other than seq.
prefix_source shared_prefix(const pls_session & s, llama_seq_id seq, const int32_t * prompt, int32_t n_prompt) {
    prefix_source best;
    for (int32_t j = 0; j < (int32_t) s.streams.size(); ++j) {
        const llama_tokens * kv = j == seq ? nullptr : held_by(s, j);
        const int32_t n = kv ? common_prefix(*kv, prompt, n_prompt) : 0;
        if (n > best.n_tokens) {
            best = { j, n };
        }
    }
    return best;
}

}  // namespace

// A sequence takes a slot: its memory cleared - but for the longest prefix of its prompt that the target's memory
// holds, when it joins a running batch: what the slot's last sequence left, or, at least MIN_SHARED tokens longer,
// what another slot holds (its memory copied: n choices of one prompt, a prompt shared by clients) - its own
// sampler, its prompt queued.
void start_stream(pls_session & s, stream_state & st, const int32_t * prompt, int32_t n_prompt, const pls_seq_params * p,
                  const sampling_spec * spec) {
    const llama_seq_id seq = st.seq;
    int32_t keep = 0;
    prefix_source other;
    {
        std::lock_guard<std::mutex> lock(s.ops_mu);
        if (p != nullptr && prefix_reusable(s) && seq < (int32_t) s.slot_kv.size()) {
            keep = common_prefix(s.slot_kv[seq], prompt, n_prompt);
            other = shared_prefix(s, seq, prompt, n_prompt);
        }
        if (seq < (int32_t) s.slot_kv.size()) {
            s.slot_kv[seq].clear();
        }
    }
    llama_memory_t mem = llama_get_memory(s.ctx_tgt.get());
    bool dft_copied = false;
    if (other.seq >= 0 && other.n_tokens >= keep + MIN_SHARED) {
        // a stream's memory is copied whole (llama.cpp copies across KV streams no other way), then cut to the prefix
        llama_memory_seq_rm(mem, seq, -1, -1);
        llama_memory_seq_cp(mem, other.seq, seq, -1, -1);
        keep = other.n_tokens;
        // the draft model's memory too, where the other sequence's holds the prefix from position 0 and can be cut
        const stream_state & o = s.streams[other.seq];
        if (s.ctx_dft && s.own_draft_model && !s.use_ckpt_dft && o.used && o.active && o.dft.skipped_to == 0 &&
            o.dft.pos >= keep) {
            llama_memory_t mem_dft = llama_get_memory(s.ctx_dft.get());
            llama_memory_seq_rm(mem_dft, seq, -1, -1);
            llama_memory_seq_cp(mem_dft, other.seq, seq, -1, -1);
            dft_copied = llama_memory_seq_rm(mem_dft, seq, keep, -1);
            if (!dft_copied) {
                llama_memory_seq_rm(mem_dft, seq, -1, -1);
            }
        }
    }
    if (keep == 0 || !llama_memory_seq_rm(mem, seq, keep, -1)) {
        llama_memory_seq_rm(mem, seq, -1, -1);
        keep = 0;
        dft_copied = false;
    }
    if (s.ctx_dft && !dft_copied) {
        llama_memory_seq_rm(llama_get_memory(s.ctx_dft.get()), seq, -1, -1);
    }
    if (s.spec) {
        common_speculative_defer(s.spec, seq, 0);  // its prompt is processed as it is decoded
    }
    st = stream_state{};
    st.seq = seq;
    st.n_prefilled = keep;
    st.used = true;
    st.prefilling = true;
    st.prompt_in.assign(prompt, prompt + n_prompt);
    common_params_sampling sampling = s.params.sampling;
    st.n_max_cap = s.n_max_effective;
    st.p_min = s.params.speculative.draft.p_min;
    st.n_min = s.params.speculative.draft.n_min;
    if (p != nullptr) {
        sampling.temp = p->temp;
        sampling.top_k = p->top_k;
        sampling.top_p = p->top_p;
        sampling.min_p = p->min_p;
        sampling.seed = p->seed;
        st.n_predict = p->n_predict;
        if (p->n_max >= 0) {
            st.n_max_cap = std::min(p->n_max, s.n_max_effective);
        }
        if (p->n_min >= 0) {
            st.n_min = std::min(p->n_min, st.n_max_cap);
        }
        if (p->p_min >= 0.0f) {
            st.p_min = p->p_min;
        }
    } else if (seq > 0 && sampling.seed != LLAMA_DEFAULT_SEED) {
        sampling.seed += (uint32_t) seq;  // streams of one seeded run sample differently, reproducibly
    }
    const sampling_spec & shape = spec != nullptr ? *spec : s.sampling_begin;
    apply_sampling(shape, (int32_t) llama_n_ctx_seq(s.ctx_tgt.get()), sampling);
    st.n_probs = shape.n_probs;
    st.greedy = s.greedy && sampling.temp <= 0.0f && !shape.shapes_choice();
    if (s.tgt_device_greedy) {
        // raw logits are read on the host where log-probabilities are asked for (margins keep it off altogether)
        device_greedy_set(s, st, st.greedy && st.n_probs < 0);
    }
    st.synth_key = s.synth_probs.empty() ? 0 : synth_key_of(s.sp.synth_seed, seq, prompt, n_prompt);
    st.smpl.reset(common_sampler_init(s.target->model, sampling));
    if (shape.penalties()) {
        // the penalties look back on the prompt too, as llama-server's do (the grammar only on generated text)
        for (int32_t i = 0; i < n_prompt; ++i) {
            common_sampler_accept(st.smpl.get(), prompt[i], false);
        }
    }
    st.prompt_tgt.reserve(llama_n_ctx_seq(s.ctx_tgt.get()));
    st.stats.n_prompt = n_prompt;
    s.stats.n_prompt += n_prompt;
    s.ctl->reset_stream(seq);
    // where costs measured on this machine say drafting could not pay even if every token landed, the draft model
    // does not read the prompt now: it catches up on the recent context should that change
    st.dft.reads_prompt = !s.own_draft_model || dft_copied || (keep == 0 && s.ctl->worth_drafting(n_prompt));
    s.active = true;
}

namespace {

// Prompt chunks of the sequences still processing theirs, after whatever the batch already holds, up to n_batch.
// All but each prompt's last token are decoded here; the last becomes the first token the sequence verifies.
void add_prompt_chunks(pls_session & s, common_batch & batch) {
    const int32_t n_batch = (int32_t) llama_n_batch(s.ctx_tgt.get());
    for (auto & st : s.streams) {
        st.n_prompt_step = 0;
        if (!st.prefilling) {
            continue;
        }
        const int32_t n_body = (int32_t) st.prompt_in.size() - 1;
        while (st.n_prefilled < n_body && (int32_t) batch.size() < n_batch &&
               (s.feature_rows == 0 || st.n_prompt_step < s.feature_rows)) {
            batch.add(st.prompt_in[st.n_prefilled], st.n_prefilled, st.seq, false);
            st.n_prefilled++;
            st.n_prompt_step++;
        }
    }
}

// Sequences whose whole prompt is in the contexts now start generating.
void finish_prompts(pls_session & s) {
    for (auto & st : s.streams) {
        if (!st.prefilling || st.n_prefilled < (int32_t) st.prompt_in.size() - 1) {
            continue;
        }
        st.prefilling = false;
        st.prompt_tgt.assign(st.prompt_in.begin(), st.prompt_in.end() - 1);
        st.id_last = st.prompt_in.back();
        st.n_past = (int32_t) st.prompt_tgt.size();
        st.dft.pos = st.dft.reads_prompt ? st.n_past : 0;  // the draft model saw the prompt with the target, or nothing
        llama_tokens().swap(st.prompt_in);
        if (s.spec) {
            common_speculative_begin(s.spec, st.seq, st.prompt_tgt);
            // drafters that read the target's features keep the rows of its steps and process them when it drafts:
            // a step without a draft costs them nothing (patch 0005)
            common_speculative_defer(s.spec, st.seq, KEPT_ROWS);
        }
        st.active = true;
    }
}

// the decoded batch to the drafters that read the target's batches (engine) or the prompt (the draft model)
void feed_drafters(pls_session & s, common_batch & batch, int32_t prompt_from) {
    if (s.spec && !common_speculative_process(s.spec, batch)) {
        fail(PLS_ERR_DECODE, "the drafter failed to process the target's batch");
    }
    if (s.own_draft_model && prompt_from < batch.size()) {
        common_batch & b = s.batch_dft;
        b.clear();
        for (int32_t i = prompt_from; i < batch.size(); ++i) {
            const auto & t = batch.tokens[i];
            if (s.streams[t.seq_id].dft.reads_prompt) {
                b.add(t.id >= 0 && t.id < s.n_vocab_dft ? t.id : 0, t.pos[0], t.seq_id, false);
            }
        }
        draft_model_feed_batch(s);
    }
}

}  // namespace

void begin(pls_session & s, const int32_t * prompts, const int32_t * n_prompt, int32_t n_streams, int32_t n_predict) {
    if (n_streams < 1 || n_streams > s.sp.n_parallel) {
        fail(PLS_ERR_INVALID, std::to_string(n_streams) + " prompts for a session of n_parallel=" + std::to_string(s.sp.n_parallel) +
                              " streams");
    }
    if (s.continuous && s.active) {
        fail(PLS_ERR_BUSY, "sequences added with pls_seq_add are running; a begin would drop them");
    }
    int64_t off = 0;
    for (int32_t k = 0; k < n_streams; ++k) {
        check_prompt(s, prompts + off, n_prompt[k], n_streams > 1 ? "prompt " + std::to_string(k) + ": " : std::string());
        off += n_prompt[k];
    }
    reset_generation(s);
    s.n_begin = n_streams;
    off = 0;
    for (int32_t k = 0; k < n_streams; ++k) {
        start_stream(s, s.streams[k], prompts + off, n_prompt[k], nullptr);
        s.streams[k].n_predict = n_predict;
        off += n_prompt[k];
    }
    {
        std::lock_guard<std::mutex> lock(s.ops_mu);
        std::fill(s.reserved.begin(), s.reserved.begin() + n_streams, 1);
    }
    // every prompt but its last token, packed into as few target batches as fit
    scoped_timer t(s.stats.t_prefill_ms);
    common_batch & batch = s.batch;
    for (;;) {
        batch.clear();
        add_prompt_chunks(s, batch);
        if (batch.size() == 0) {
            break;
        }
        decode_or_throw(s.ctx_tgt.get(), batch, "prompt processing");
        feed_drafters(s, batch, 0);
    }
    // the prompt finished on the device here, inside the prefill's time: on a GPU its last micro-batch (and the draft
    // model's copy of it) was only queued, and its wait would land in the first step, counted as decoding
    finish_on_device(s.ctx_tgt.get());
    if (s.ctx_dft) {
        finish_on_device(s.ctx_dft.get());
    }
    finish_prompts(s);
}

namespace {

// The engine's drafts (n-gram lookups, upstream drafters) for the streams with k[seq] > 0, cut to that length.
void engine_draft(pls_session & s, const std::vector<int32_t> & k, step_timing & tm) {
    const int64_t t0 = now_us();
    bool any = false;
    for (int32_t q = 0; q < s.sp.n_parallel; ++q) {
        common_speculative_get_draft_params(s.spec, q).drafting = false;
    }
    for (auto & st : s.streams) {
        if (!st.active || st.replay || k[st.seq] <= 0) {
            continue;
        }
        st.draft.clear();
        common_speculative_get_draft_params(s.spec, st.seq) = {
            /* .drafting = */ true,
            /* .n_max    = */ k[st.seq],
            /* .pos0     = */ st.n_past,
            /* .id_last  = */ st.id_last,
            /* .prompt   = */ &st.prompt_tgt,
            /* .result   = */ &st.draft,
        };
        any = true;
    }
    if (!any) {
        return;  // no call: a step without a draft costs the engine's drafters nothing
    }
    common_speculative_draft(s.spec);
    if (s.ctx_dft) {
        check_remote(llama_get_model(s.ctx_dft.get()));  // the engine's drafters decode on their own
    }
    for (auto & st : s.streams) {
        if (st.active && !st.replay && k[st.seq] > 0 && (int32_t) st.draft.size() > k[st.seq]) {
            st.draft.resize(k[st.seq]);
        }
    }
    tm.draft_call_ms += (now_us() - t0) / 1000.0;
}

// The drafts of upstream's drafters (model drafters and n-gram lookups) for the lengths chosen; what they cannot
// drop is checkpointed first.
void engine_drafts(pls_session & s, step_timing & tm) {
    llama_context * ctx_dft = s.ctx_dft.get();
    llama_memory_t mem_tgt = llama_get_memory(s.ctx_tgt.get());
    for (auto & st : s.streams) {
        if (!st.active || st.replay) {
            continue;
        }
        // the engine's drafters keep their own state: checkpoint what they cannot drop (a stream that drafts
        // nothing leaves its drafter's state as it is)
        st.ckpt.update_pos(st.prompt_tgt.size(), llama_memory_seq_pos_min(mem_tgt, st.seq),
                           llama_memory_seq_pos_max(mem_tgt, st.seq));
        if (s.use_ckpt_dft && ctx_dft && st.k > 0) {
            st.ckpt.update_dft(ctx_dft, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        }
    }
    std::vector<int32_t> want(s.sp.n_parallel, 0);
    for (auto & st : s.streams) {
        if (st.active && !st.replay) {
            want[st.seq] = st.k;
            // the rows a deferred drafter processes before this draft (those of the steps since its last one)
            st.catchup = st.k > 0 ? common_speculative_n_deferred(s.spec, st.seq, st.n_past) : 0;
        }
    }
    engine_draft(s, want, tm);
    for (auto & st : s.streams) {
        st.engine_draft = !st.draft.empty();
    }
}

// Before the verify: a target checkpoint where a partial accept cannot roll back in place, and the engine's drafter
// cleared of what it wrote while drafting.
void prepare_verify(pls_session & s) {
    llama_context * ctx_tgt = s.ctx_tgt.get();
    llama_context * ctx_dft = s.ctx_dft.get();
    llama_memory_t mem_tgt = llama_get_memory(ctx_tgt);
    for (auto & st : s.streams) {
        if (!st.active || st.replay) {
            continue;
        }
        st.ckpt_valid = false;
        if (!st.draft.empty() && (s.use_ckpt_tgt_always || (s.n_rs_seq > 0 && (int32_t) st.draft.size() > s.n_rs_seq))) {
            scoped_timer tr(s.stats.t_rollback_ms);
            st.ckpt.update_pos(st.prompt_tgt.size(), llama_memory_seq_pos_min(mem_tgt, st.seq),
                               llama_memory_seq_pos_max(mem_tgt, st.seq));
            st.ckpt.update_tgt(ctx_tgt, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            st.ckpt_valid = true;
        }
        if (ctx_dft && !s.own_draft_model) {
            // drop what the engine's drafter wrote while drafting (e.g. the DFlash noise block) before the verify
            if (s.use_ckpt_dft && st.k > 0) {
                st.ckpt.load_dft(ctx_dft, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
            }
            llama_memory_seq_rm(llama_get_memory(ctx_dft), st.seq, st.ckpt.pos_max + 1, -1);
        }
    }
}

// Choose each stream's draft length, then draft. With the shim's draft model and n-gram lookups together, the
// lookups run first (nearly free) and the controller sees which streams have a free draft and how long it is;
// the draft model drafts for the streams that draft and have none.
void draft_phase(pls_session & s, int32_t n_ctx_seq, step_timing & tm) {
    std::vector<int32_t> caps(s.sp.n_parallel, 0), depth(s.sp.n_parallel, 0), active(s.sp.n_parallel, 0),
                         pending(s.sp.n_parallel, 0), free_len(s.sp.n_parallel, 0), k(s.sp.n_parallel, 0);
    for (auto & st : s.streams) {
        st.k = 0;
        st.catchup = 0;
        st.engine_draft = false;
        st.draft.clear();
        if (!st.active || st.replay) {
            continue;
        }
        // n_max caps every type; the context and n_predict cap each stream
        int32_t cap = std::min(st.n_max_cap, n_ctx_seq - st.n_past - 2);
        if (st.n_predict >= 0) {
            cap = std::min<int32_t>(cap, st.n_predict - (int32_t) st.n_emitted - 1);
        }
        caps[st.seq] = std::max(cap, 0);
        depth[st.seq] = st.n_past;
        active[st.seq] = 1;
        pending[st.seq] = s.own_draft_model ? draft_model_pending(st) : 0;
    }

    const bool lookups_first = s.own_draft_model && s.spec != nullptr;
    if (lookups_first) {
        engine_draft(s, caps, tm);
        for (auto & st : s.streams) {
            if (active[st.seq]) {
                free_len[st.seq] = (int32_t) st.draft.size();
            }
        }
    }
    s.ctl->choose(caps, depth, active, pending, k, free_len);
    for (auto & st : s.streams) {
        if (!active[st.seq]) {
            continue;
        }
        st.k = k[st.seq];
        if (lookups_first) {
            // a free draft is used when it is what the controller asked for; else the draft model drafts
            st.engine_draft = st.k > 0 && free_len[st.seq] > 0;
            st.draft.resize(st.engine_draft ? std::min<size_t>(st.draft.size(), st.k) : 0);
        }
    }

    if (s.spec && !s.own_draft_model) {
        engine_drafts(s, tm);
    }
    if (s.own_draft_model) {
        draft_model_run(s, tm);  // the streams with k > 0 and no draft yet
    }
    prepare_verify(s);
}

// 1 when x is a NaN: all-ones exponent and a mantissa; an integer test the compiler vectorizes
inline uint32_t is_nan_bits(const float & x) {
    uint32_t bits;
    std::memcpy(&bits, &x, sizeof(bits));
    return (bits & 0x7fffffffu) > 0x7f800000u ? 1u : 0u;
}

void require_numbers(const float * logits, int32_t n_vocab) {
    uint32_t nan = 0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        nan |= is_nan_bits(logits[i]);
    }
    if (nan) {
        fail_nan_logits();
    }
}

// index of the largest logit, the first one on a tie (as llama.cpp's greedy and temperature-0 samplers pick), in one
// pass of 8 independent lanes - each keeps its maximum, where it rose and whether it saw a NaN - so that no chain of
// dependent comparisons bounds it (a 152k row on a 2-core x86-64 machine: 250-300 us as one running maximum, 100-140
// in lanes; on an H200's host the 7B's plain step samples in 0.21-0.27 ms instead of 0.27-0.38)
llama_token argmax(const float * logits, int32_t n_vocab) {
    constexpr int32_t L = 8;
    float m[L];
    int32_t at[L];
    uint32_t nan[L];
    for (int32_t j = 0; j < L; ++j) {
        m[j] = -INFINITY;
        at[j] = 0;
        nan[j] = 0;
    }
    int32_t i = 0;
    for (; i + L <= n_vocab; i += L) {
        for (int32_t j = 0; j < L; ++j) {
            const float x = logits[i + j];
            nan[j] |= is_nan_bits(x);
            const bool up = x > m[j];  // strictly: a lane keeps the first position of its maximum
            m[j] = up ? x : m[j];
            at[j] = up ? i : at[j];
        }
    }
    float best = -INFINITY;
    int32_t best_i = 0;  // every logit -inf (all masked): the first position
    uint32_t any_nan = 0;
    for (int32_t j = 0; j < L; ++j) {
        any_nan |= nan[j];
        const int32_t idx = at[j] + j;
        if (m[j] > best || (m[j] == best && m[j] != -INFINITY && idx < best_i)) {
            best = m[j];
            best_i = idx;
        }
    }
    for (; i < n_vocab; ++i) {  // the tail, after every lane's positions
        any_nan |= is_nan_bits(logits[i]);
        if (logits[i] > best) {
            best = logits[i];
            best_i = i;
        }
    }
    if (any_nan) {
        fail_nan_logits();
    }
    return best_i;
}

// The target's verdict on one stream's draft: the committed tokens (accepted drafts + the target's own).
llama_tokens sample_stream(pls_session & s, stream_state & st) {
    const size_t n_draft = st.draft.size();
    std::vector<int> idxs(n_draft + 1);
    for (size_t i = 0; i <= n_draft; ++i) {
        idxs[i] = st.i_batch + (int) i;
    }
    common_sampler * smpl = st.smpl.get();
    llama_context * ctx = s.ctx_tgt.get();
    if (!s.synth_probs.empty() && n_draft > 0) {
        // synthetic acceptance: position i lands with its conditional probability (a replay re-commits all)
        size_t a = 0;
        if (st.replay) {
            a = n_draft;
        } else {
            // draft token a is at position n_past + 1 + a
            while (a < n_draft && a < s.synth_probs.size() &&
                   synth_uniform(st.synth_key, st.n_past + 1 + (int32_t) a) < s.synth_probs[a]) {
                a++;
            }
        }
        llama_tokens ids(st.draft.begin(), st.draft.begin() + a);
        for (llama_token t : ids) {
            common_sampler_accept(smpl, t, true);
        }
        llama_token id;
        if (st.device_greedy) {
            id = device_greedy_token(s, idxs[a]);
        } else {
            require_numbers(llama_get_logits_ith(ctx, idxs[a]), s.n_vocab);
            id = common_sampler_sample(smpl, ctx, idxs[a], false);
        }
        common_sampler_accept(smpl, id, true);
        ids.push_back(id);
        return ids;
    }
    // force_reject: the zero-acceptance cost model - the target's own token at the first position only
    const bool refuse = s.sp.force_reject && !st.replay;
    if (st.greedy) {
        // temperature 0 with nothing else in the chain: the largest logit, without building and sorting a
        // candidate list of the whole vocabulary for every verified row
        llama_tokens ids;
        const size_t n_check = refuse ? 0 : n_draft;
        for (size_t i = 0; i <= n_check; ++i) {
            llama_token id;
            if (st.device_greedy) {
                id = device_greedy_token(s, idxs[i]);  // masked and chosen on the device
            } else {
                float * logits = llama_get_logits_ith(ctx, idxs[i]);
                for (llama_token t : s.eog_tokens) {
                    logits[t] = -INFINITY;  // ignore_eos: what the sampler's logit bias would do
                }
                id = argmax(logits, s.n_vocab);
            }
            common_sampler_accept(smpl, id, true);
            ids.push_back(id);
            if (i == n_check || id != st.draft[i]) {
                break;
            }
        }
        return ids;
    }
    for (size_t i = 0; i <= (refuse ? 0 : n_draft); ++i) {
        require_numbers(llama_get_logits_ith(ctx, idxs[i]), s.n_vocab);
    }
    return common_sampler_sample_and_accept_n(smpl, ctx, refuse ? std::vector<int>{ idxs[0] } : idxs,
                                              refuse ? llama_tokens() : st.draft);
}

// A partial accept on a checkpointed verify: restore the state before it and replay the accepted tokens as the
// next "draft"; the checkpoint stays valid, so a replay that disagrees at a near-tie is restored and replayed again.
void restore_for_replay(pls_session & s, stream_state & st, llama_tokens & ids, common_sampler_ptr & smpl_save,
                        size_t n_draft, size_t n_accepted, bool replay) {
    scoped_timer t(s.stats.t_rollback_ms);
    for (pls_stats * c : { &s.stats, &st.stats }) {
        c->n_rollback_checkpoint++;
        c->n_replayed += ids.size();
        if (!replay) {
            count_step(*c, n_draft, n_accepted);
        }
    }
    // the drafters hear about acceptance after the replay, whose verify batch they will have processed
    st.draft = std::move(ids);
    st.replay = true;
    st.ckpt.load_tgt(s.ctx_tgt.get(), st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
    llama_memory_seq_rm(llama_get_memory(s.ctx_tgt.get()), st.seq, st.ckpt.pos_max + 1, -1);
    st.prompt_tgt.resize(st.ckpt.n_tokens);
    st.smpl = std::move(smpl_save);
    st.n_past = (int32_t) st.prompt_tgt.size();
    if (s.own_draft_model) {
        draft_model_truncate(s, st, st.n_past);
    } else if (s.ctx_dft) {
        st.ckpt.load_dft(s.ctx_dft.get(), st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        llama_memory_seq_rm(llama_get_memory(s.ctx_dft.get()), st.seq, st.ckpt.pos_max + 1, -1);
    }
}

// The committed tokens into the stream's text and out_tokens (and margins), up to an end of generation or n_predict.
void commit_tokens(pls_session & s, stream_state & st, const llama_tokens & ids, std::vector<int32_t> & out_tokens,
                   std::vector<float> & out_margins) {
    const llama_vocab * vocab = llama_model_get_vocab(s.target->model);
    for (size_t i = 0; i < ids.size(); ++i) {
        st.prompt_tgt.push_back(st.id_last);
        st.id_last = ids[i];
        if (llama_vocab_is_eog(vocab, st.id_last)) {
            st.finish = PLS_FINISH_EOG;
            break;
        }
        if (st.n_predict >= 0 && st.n_emitted >= st.n_predict) {
            st.finish = PLS_FINISH_LENGTH;
            break;
        }
        out_tokens.push_back(st.id_last);
        if (st.n_probs >= 0) {
            auto & lp = s.logprobs_step[st.seq];
            lp.emplace_back();
            token_logprob(llama_get_logits_ith(s.ctx_tgt.get(), st.i_batch + (int32_t) i), s.n_vocab, st.id_last, st.n_probs,
                          lp.back());
        }
        if (s.sp.collect_margins) {
            out_margins.push_back(top2_margin(llama_get_logits_ith(s.ctx_tgt.get(), st.i_batch + (int32_t) i), s.n_vocab));
        }
        st.n_emitted++;
    }
}

// Target and drafters back to what the stream committed: positions from n_past on are dropped.
void roll_back(pls_session & s, stream_state & st, size_t n_draft, size_t n_accepted, bool replay) {
    llama_context * ctx_dft = s.ctx_dft.get();
    scoped_timer t(s.stats.t_rollback_ms);
    if (!llama_memory_seq_rm(llama_get_memory(s.ctx_tgt.get()), st.seq, st.n_past, -1)) {
        fail(PLS_ERR_DECODE, "rollback of the target to position " + std::to_string(st.n_past) + " was refused");
    }
    if (s.own_draft_model) {
        draft_model_settle(s, st);
    } else if (ctx_dft && s.use_ckpt_dft && n_accepted < n_draft && !replay) {
        // a drafter that cannot drop tokens saw the whole verify batch: restore its state from before the draft and
        // feed it only what the target kept
        st.ckpt.load_dft(ctx_dft, st.seq, LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY);
        llama_memory_seq_rm(llama_get_memory(ctx_dft), st.seq, st.ckpt.pos_max + 1, -1);
        common_batch kept(ctx_dft);
        for (size_t i = 0; i <= n_accepted; ++i) {
            kept.add(s.batch.tokens[st.i_batch + i].id, st.ckpt.pos_max + 1 + (int32_t) i, st.seq, false);
        }
        decode_or_throw(ctx_dft, kept, "drafter catch-up");
    } else if (ctx_dft) {
        llama_memory_seq_rm(llama_get_memory(ctx_dft), st.seq, st.n_past, -1);
    }
}

// After the shared verify: commit and roll back one stream. Appends its committed tokens (and margins).
void settle(pls_session & s, stream_state & st, llama_tokens & ids, common_sampler_ptr & smpl_save,
            std::vector<int32_t> & out_tokens, std::vector<float> & out_margins) {
    const size_t n_draft = st.draft.size();
    const bool replay = st.replay;
    const size_t n_accepted = ids.size() - 1;
    st.n_accepted_step = (int32_t) n_accepted;

    st.n_past += 1;
    if (st.ckpt_valid && n_accepted < n_draft) {
        restore_for_replay(s, st, ids, smpl_save, n_draft, n_accepted, replay);
        return;  // nothing committed yet: the next step replays and commits
    }
    if (!replay) {
        count_step(s.stats, n_draft, n_accepted);
        count_step(st.stats, n_draft, n_accepted);
    }
    if (s.spec && (!s.own_draft_model || st.engine_draft)) {
        // a replay commits exactly what the checkpointed step accepted; drafters still need to hear it
        common_speculative_accept(s.spec, st.seq, (uint16_t) (st.engine_draft || !s.own_draft_model ? n_accepted : 0));
    }
    st.n_past += (int32_t) n_accepted;
    commit_tokens(s, st, ids, out_tokens, out_margins);
    st.replay = false;
    if (n_accepted < n_draft && !replay) {
        for (pls_stats * c : { &s.stats, &st.stats }) {
            (s.n_rs_seq > 0 ? c->n_rollback_ring : c->n_rollback_kv)++;
        }
    }
    roll_back(s, st, n_draft, n_accepted, replay);
    st.draft.clear();
    st.stats.n_generated += (int64_t) (out_tokens.size());
    s.stats.n_generated += (int64_t) (out_tokens.size());
    if (st.finish == PLS_FINISH_NONE && st.n_predict >= 0 && st.n_emitted >= st.n_predict) {
        st.finish = PLS_FINISH_LENGTH;
    }
    if (st.finish != PLS_FINISH_NONE) {
        st.active = false;
    }
}

}  // namespace

void fill_adaptive_info(const controller & c, pls_adaptive_info & out) {
    out = pls_adaptive_info{};
    const controller_params & p = c.params();
    const int32_t b = c.last_bucket();
    out.enabled = p.adaptive;
    out.n_max = p.n_max;
    out.depth_bucket = b;
    out.n_target_points = std::min(65, p.n_streams * (p.n_max + 1));
    for (int32_t t = 1; t <= out.n_target_points; ++t) {
        out.target_ms[t - 1] = c.target_cost(t, b);
    }
    out.draft_first_ms = c.draft_first_ms(b);
    out.draft_token_ms = c.draft_token_ms(b);
    out.draft_call_ms = c.draft_call_ms();
    out.catchup_token_ms = c.catchup_token_ms(b);
    out.catchup_limit = c.catchup_limit(b);
    out.overhead_ms = c.overhead_ms();
    out.cold_ms = c.cold_ms();
    const std::vector<double> h = c.pooled_hazards();
    out.n_hazard = std::min<int32_t>((int32_t) h.size(), 64);
    for (int32_t i = 0; i < out.n_hazard; ++i) {
        out.hazard[i] = h[i];
    }
    out.plain_ms_per_token = c.plain_ms_per_token(b);
    out.n_streams = std::min<int32_t>((int32_t) c.last_k().size(), 64);
    for (int32_t i = 0; i < out.n_streams; ++i) {
        out.last_k[i] = c.last_k()[i];
    }
}

// batches of the session's contexts that ran a graph built earlier (llama's count, kept per context)
static int64_t graphs_reused(const pls_session & s) {
    int64_t n = llama_perf_context(s.ctx_tgt.get()).n_reused;
    if (s.ctx_dft) {
        n += llama_perf_context(s.ctx_dft.get()).n_reused;
    }
    return n;
}

void publish_stats(pls_session & s) {
    s.stats.n_graph_captures = graph_captures() - s.graph_captures0;
    s.stats.n_graph_resets = graph_resets() - s.graph_resets0;
    s.stats.n_graph_reused = graphs_reused(s) - s.graph_reused0;
    pls_adaptive_info info{};
    if (s.ctl) {
        const controller_counters & c = s.ctl->counters();
        s.stats.n_probes = c.n_probes;
        s.stats.n_guard = c.n_guard;
        s.stats.est_plain_ms = c.est_plain_ms;
        fill_adaptive_info(*s.ctl, info);
    }
    std::lock_guard<std::mutex> lock(s.stats_mu);
    s.adaptive_pub = info;
    s.stats_pub = s.stats;
    s.stream_stats_pub.resize(s.streams.size());
    for (size_t i = 0; i < s.streams.size(); ++i) {
        s.stream_stats_pub[i] = s.streams[i].stats;
    }
}

void reset_stats_now(pls_session & s) {
    s.stats = pls_stats{};
    s.graph_captures0 = graph_captures();
    s.graph_resets0 = graph_resets();
    s.graph_reused0 = graphs_reused(s);
    for (auto & st : s.streams) {
        const int64_t n_prompt = st.stats.n_prompt;
        st.stats = pls_stats{};
        st.stats.n_prompt = n_prompt;
    }
    if (s.ctl) {
        s.ctl->reset_counters();
    }
    publish_stats(s);
}

namespace {

// one step as the controller saw it, kept for pls_take_trace (plain sessions too: their steps are the baseline)
void record_trace(pls_session & s, const step_obs & obs, const step_timing & tm, int32_t n_tokens, int32_t n_prompt,
                  double step_ms, int64_t captures) {
    pls_trace_step t{};
    for (int32_t i = 0; i < (int32_t) obs.active.size() && i < PLS_MAX_STREAMS; ++i) {
        if (!obs.active[i]) {
            continue;
        }
        t.n_streams = i + 1;
        t.active[i] = 1;
        t.k[i] = obs.k[i];
        t.n_drafted[i] = obs.n_drafted[i];
        t.n_accepted[i] = obs.n_accepted[i];
        t.n_catchup[i] = obs.n_catchup[i];
        t.depth[i] = obs.depth[i];
        t.draft_hash[i] = i < (int32_t) s.streams.size() ? s.streams[i].draft_hash : 0;
    }
    t.n_tokens = n_tokens;
    t.n_prompt = n_prompt;
    t.n_draft_iters = tm.draft_iters;
    t.n_graph_captures = (int32_t) captures;
    t.t_draft_first_ms = tm.draft_first_ms;
    t.t_draft_rest_ms = tm.draft_rest_ms;
    t.t_draft_call_ms = tm.draft_call_ms;
    t.t_target_ms = tm.target_ms;
    t.t_step_ms = step_ms;
    std::lock_guard<std::mutex> lock(s.stats_mu);
    if ((int32_t) s.trace.size() < s.sp.trace_steps) {
        s.trace.push_back(t);
    } else {
        s.trace_dropped++;
    }
}

}  // namespace

namespace {

// Streams that are asked to stop or whose context is full finish; false when none is left to step.
bool end_finished_streams(pls_session & s, int32_t n_ctx_seq, bool stop) {
    bool any = false;
    for (auto & st : s.streams) {
        if ((st.active || st.prefilling) && stop) {
            st.prefilling = false;
            finish_stream(st, PLS_FINISH_STOPPED);
        } else if (st.active && st.n_past + 1 >= n_ctx_seq) {
            finish_stream(st, PLS_FINISH_CONTEXT);
        }
        any = any || st.active || st.prefilling;
    }
    return any;
}

// One target batch: every active stream's [id_last, draft...], then chunks of prompts still being processed; the
// drafters that read it, the device's finish, and each stream's verdict (ids[k], with its sampler saved in saved[k]
// where a checkpoint may restore it). Returns the prompt rows in the batch.
int32_t verify_batch(pls_session & s, std::vector<llama_tokens> & ids, std::vector<common_sampler_ptr> & saved,
                     step_timing & tm) {
    llama_context * ctx_tgt = s.ctx_tgt.get();
    common_batch & batch = s.batch;
    const int64_t t0 = now_us();
    batch.clear();
    for (auto & st : s.streams) {
        if (!st.active) {
            continue;
        }
        st.i_batch = (int32_t) batch.size();
        batch.add(st.id_last, st.n_past, st.seq, true);
        for (size_t i = 0; i < st.draft.size(); ++i) {
            batch.add(st.draft[i], st.n_past + 1 + (int32_t) i, st.seq, true);
        }
    }
    const int32_t prompt_from = batch.size();
    add_prompt_chunks(s, batch);
    if (batch.size() > 0) {
        decode_or_throw(ctx_tgt, batch, prompt_from > 0 ? "verification" : "prompt processing");
    }
    const int64_t t1 = now_us();
    feed_drafters(s, batch, prompt_from);
    if (s.process_every_batch) {
        s.stats.t_process_ms += (now_us() - t1) / 1000.0;
    }
    // the device finishing the batch (on a GPU the decode call only queued it)
    const int64_t t_sync0 = now_us();
    finish_on_device(ctx_tgt);
    const int64_t t2 = now_us();
    s.stats.t_sync_ms += (t2 - t_sync0) / 1000.0;
    s.stats.t_verify_ms += (t2 - t0) / 1000.0 - (s.process_every_batch ? (t_sync0 - t1) / 1000.0 : 0.0);
    for (size_t k = 0; k < s.streams.size(); ++k) {
        stream_state & st = s.streams[k];
        if (!st.active) {
            continue;
        }
        if (st.ckpt_valid) {
            saved[k].reset(common_sampler_clone(st.smpl.get()));
        }
        ids[k] = sample_stream(s, st);
    }
    s.stats.t_sample_ms += (now_us() - t2) / 1000.0;
    tm.target_ms = (now_us() - t0) / 1000.0;
    return batch.size() - prompt_from;
}

// The controller's observation of the step, taken before settling changes the streams (its times are added after).
step_obs observation(pls_session & s, const std::vector<llama_tokens> & ids) {
    step_obs obs;
    obs.k.assign(s.sp.n_parallel, 0);
    obs.n_drafted.assign(s.sp.n_parallel, 0);
    obs.n_accepted.assign(s.sp.n_parallel, 0);
    obs.n_catchup.assign(s.sp.n_parallel, 0);
    obs.depth.assign(s.sp.n_parallel, 0);
    obs.active.assign(s.sp.n_parallel, 0);
    obs.source.assign(s.sp.n_parallel, 0);
    for (size_t k = 0; k < s.streams.size(); ++k) {
        stream_state & st = s.streams[k];
        st.n_drafted_step = 0;
        st.n_accepted_step = 0;
        if (!st.active || st.replay) {
            continue;
        }
        obs.active[st.seq] = 1;
        obs.k[st.seq] = st.k;
        obs.n_drafted[st.seq] = (int32_t) st.draft.size();
        obs.n_accepted[st.seq] = (int32_t) ids[k].size() - 1;
        obs.n_catchup[st.seq] = st.catchup;
        obs.depth[st.seq] = st.n_past;
        obs.source[st.seq] = st.engine_draft && s.own_draft_model ? 1 : 0;
        s.stats.n_free_drafts += obs.source[st.seq];
        st.stats.n_free_drafts += obs.source[st.seq];
        st.n_drafted_step = (int32_t) st.draft.size();
        if (s.own_draft_model) {
            s.stats.n_catchup += st.catchup;
            st.stats.n_catchup += st.catchup;
        }
    }
    return obs;
}

// Every active stream commits and rolls back; prompts now fully processed start generating. Returns the streams
// still generating or processing their prompt.
int32_t settle_streams(pls_session & s, std::vector<llama_tokens> & ids, std::vector<common_sampler_ptr> & saved,
                       std::vector<std::vector<int32_t>> & out_tokens, std::vector<std::vector<float>> & out_margins) {
    for (size_t k = 0; k < s.streams.size(); ++k) {
        stream_state & st = s.streams[k];
        if (st.active) {
            settle(s, st, ids[k], saved[k], out_tokens[k], out_margins[k]);
        }
    }
    finish_prompts(s);
    int32_t n_left = 0;
    for (auto & st : s.streams) {
        n_left += st.active || st.prefilling;
    }
    return n_left;
}

}  // namespace

int32_t step(pls_session & s, std::vector<std::vector<int32_t>> & out_tokens, std::vector<std::vector<float>> & out_margins) {
    // reused across steps: clear, keep the capacity
    out_tokens.resize(s.streams.size());
    out_margins.resize(s.streams.size());
    for (size_t k = 0; k < s.streams.size(); ++k) {
        out_tokens[k].clear();
        out_margins[k].clear();
    }
    s.logprobs_step.resize(s.streams.size());
    for (auto & lp : s.logprobs_step) {
        lp.clear();
    }
    if (s.reset_requested.exchange(false)) {
        reset_stats_now(s);
    }
    if (!s.active) {
        return 0;
    }
    const int32_t n_ctx_seq = (int32_t) llama_n_ctx_seq(s.ctx_tgt.get());
    const int64_t t_step0 = now_us();
    const int64_t captures0 = graph_captures();
    const bool stop = s.stop_requested.load();
    if (!end_finished_streams(s, n_ctx_seq, stop)) {
        s.active = false;
        if (stop) {
            s.stop_requested.store(false);  // consumed
        }
        publish_stats(s);
        return 0;
    }

    step_timing tm;
    bool drafting = false;
    for (auto & st : s.streams) {
        drafting = drafting || st.active;
    }
    if (s.drafter_kind != DRAFTER_NONE && drafting) {
        const int64_t t0 = now_us();
        draft_phase(s, n_ctx_seq, tm);
        s.stats.t_draft_ms += (now_us() - t0) / 1000.0;
    }
    if (s.sp.trace_steps > 0) {
        for (auto & st : s.streams) {
            uint32_t h = 0;
            if (st.active && !st.draft.empty()) {
                h = 2166136261u;
                for (llama_token t : st.draft) {
                    h = (h ^ (uint32_t) t) * 16777619u;
                }
            }
            st.draft_hash = h;
        }
    }
    std::vector<llama_tokens> ids(s.streams.size());
    std::vector<common_sampler_ptr> saved(s.streams.size());
    const int32_t n_prompt_rows = verify_batch(s, ids, saved, tm);
    step_obs obs = observation(s, ids);
    const int32_t n_left = settle_streams(s, ids, saved, out_tokens, out_margins);
    s.active = n_left > 0;
    const double step_ms = (now_us() - t_step0) / 1000.0;
    s.stats.t_decode_ms += step_ms;

    if (s.drafter_kind != DRAFTER_NONE && drafting) {
        obs.t_draft_first_ms = tm.draft_first_ms;
        obs.t_draft_rest_ms = tm.draft_rest_ms;
        obs.n_draft_iters = tm.draft_iters;
        obs.t_draft_call_ms = tm.draft_call_ms;
        // prompt chunks in the batch make its cost no verify cost: acceptance is learnt, costs are not
        obs.t_target_ms = n_prompt_rows > 0 ? -1.0 : tm.target_ms;
        obs.t_step_ms = n_prompt_rows > 0 ? -1.0 : step_ms;
        s.ctl->observe(obs);
    }
    if (s.sp.trace_steps > 0) {
        record_trace(s, obs, tm, s.batch.size(), n_prompt_rows, step_ms, graph_captures() - captures0);
    }
    if (!s.active && stop) {
        s.stop_requested.store(false);
    }
    publish_stats(s);
    return n_left;
}

namespace {

// A sequence whose prompt starts like that of one processing its prompt now, by at least MIN_SHARED tokens more than
// any slot holds, waits for that prompt to be processed and then copies it: n choices of one prompt, or clients
// sending one prompt together, process it once.
bool waits_for_prefix(pls_session & s, const pls_session::pending_add & a) {
    if (!prefix_reusable(s)) {
        return false;
    }
    const int32_t n_prompt = (int32_t) a.prompt.size();
    int32_t lead = 0;
    for (const auto & o : s.streams) {
        if (o.used && o.prefilling && o.seq != a.slot) {
            lead = std::max(lead, std::min(common_prefix(o.prompt_in, a.prompt.data(), n_prompt),
                                           (int32_t) o.prompt_in.size() - 1));
        }
    }
    if (lead < MIN_SHARED) {
        return false;
    }
    std::lock_guard<std::mutex> lock(s.ops_mu);
    const int32_t own = a.slot < (int32_t) s.slot_kv.size() ? common_prefix(s.slot_kv[a.slot], a.prompt.data(), n_prompt) : 0;
    return lead >= std::max(own, shared_prefix(s, a.slot, a.prompt.data(), n_prompt).n_tokens) + MIN_SHARED;
}

}  // namespace

int32_t step_seqs(pls_session & s, std::vector<pls_seq_event> & events) {
    events.clear();
    // what other threads asked for since the last step
    std::vector<pls_session::pending_add> adds;
    std::vector<int32_t> cancels;
    {
        std::lock_guard<std::mutex> lock(s.ops_mu);
        adds.swap(s.adds);
        cancels.swap(s.cancels);
    }
    std::vector<pls_session::pending_add> later;
    for (auto & a : adds) {
        const bool cancelled = std::find(cancels.begin(), cancels.end(), a.slot) != cancels.end();
        if (!cancelled && waits_for_prefix(s, a)) {
            later.push_back(std::move(a));
            continue;
        }
        start_stream(s, s.streams[a.slot], a.prompt.data(), (int32_t) a.prompt.size(), &a.params, &a.sampling);
    }
    if (!later.empty()) {
        std::lock_guard<std::mutex> lock(s.ops_mu);
        s.adds.insert(s.adds.begin(), std::make_move_iterator(later.begin()), std::make_move_iterator(later.end()));
    }
    for (int32_t slot : cancels) {
        stream_state & st = s.streams[slot];
        if (st.used && (st.active || st.prefilling)) {
            st.prefilling = false;
            finish_stream(st, PLS_FINISH_STOPPED);
        }
    }
    std::vector<std::vector<int32_t>> toks;
    std::vector<std::vector<float>> mrg;
    step(s, toks, mrg);
    for (size_t k = 0; k < s.streams.size(); ++k) {
        stream_state & st = s.streams[k];
        if (!st.used) {
            continue;
        }
        const bool done = !st.active && !st.prefilling;
        if (toks[k].empty() && st.n_prompt_step == 0 && !done) {
            continue;
        }
        pls_seq_event e{};
        e.slot = st.seq;
        e.finish = done ? (st.finish == PLS_FINISH_NONE ? PLS_FINISH_STOPPED : st.finish) : PLS_FINISH_NONE;
        e.n_tokens = (int32_t) toks[k].size();
        std::copy(toks[k].begin(), toks[k].end(), e.tokens);
        e.n_drafted = st.n_drafted_step;
        e.n_accepted = st.n_accepted_step;
        e.n_prompt = st.n_prompt_step;
        events.push_back(e);
        if (done) {
            // the slot is free at once: its ring planes and draft state are cleared for the next sequence, and its
            // target memory too - but for the tokens the sequence verified, which a later prompt may start with
            llama_memory_t mem = llama_get_memory(s.ctx_tgt.get());
            const int32_t n_kv = (int32_t) st.prompt_tgt.size();
            const bool keep = prefix_reusable(s) && st.finish != PLS_FINISH_ERROR && n_kv > 0 &&
                              llama_memory_seq_rm(mem, st.seq, n_kv, -1);
            if (!keep) {
                llama_memory_seq_rm(mem, st.seq, -1, -1);
            }
            if (s.ctx_dft) {
                llama_memory_seq_rm(llama_get_memory(s.ctx_dft.get()), st.seq, -1, -1);
            }
            llama_tokens kv = keep ? std::move(st.prompt_tgt) : llama_tokens();
            const llama_seq_id seq = st.seq;
            st = stream_state{};
            st.seq = seq;
            std::lock_guard<std::mutex> lock(s.ops_mu);
            s.reserved[seq] = 0;
            s.slot_kv[seq] = std::move(kv);
        }
    }
    int32_t n = 0;
    std::lock_guard<std::mutex> lock(s.ops_mu);
    for (char r : s.reserved) {
        n += r != 0;
    }
    return n;
}

void end_generation(pls_session & s, int32_t why) {
    s.active = false;
    if (why == PLS_FINISH_ERROR) {
        s.spec_reusable = false;  // its per-sequence state may be half-updated: the next generation builds it anew
    }
    for (auto & st : s.streams) {
        if (st.active) {
            finish_stream(st, why);
        }
    }
    publish_stats(s);
}

void score_margins(pls_session & s, const int32_t * prompt, int32_t n_prompt, const int32_t * cont, int32_t n_cont,
                   int32_t chunk, float * margins) {
    if (n_cont < 1 || cont == nullptr || margins == nullptr) {
        fail(PLS_ERR_INVALID, "nothing to score: the continuation is empty");
    }
    // the context keeps logits for n_max + 1 tokens of a sequence per batch (a verify batch's worth)
    const int32_t max_chunk = s.params.n_outputs_max_per_seq;
    if (chunk < 1 || chunk > max_chunk) {
        fail(PLS_ERR_INVALID, "chunk=" + std::to_string(chunk) + " must be within 1.." + std::to_string(max_chunk) +
                              " (n_max + 1: open the session with n_max >= chunk - 1)");
    }
    for (int32_t i = 0; i < n_cont; ++i) {
        if (cont[i] < 0 || cont[i] >= s.n_vocab) {
            fail(PLS_ERR_INVALID, "continuation token " + std::to_string(cont[i]) + " at position " + std::to_string(i) +
                                  " is outside the vocab (" + std::to_string(s.n_vocab) + ")");
        }
    }
    if (n_prompt + n_cont > (int32_t) llama_n_ctx_seq(s.ctx_tgt.get())) {
        fail(PLS_ERR_CONTEXT, "prompt and continuation hold " + std::to_string(n_prompt + n_cont) +
                              " tokens, but a stream's context holds " + std::to_string(llama_n_ctx_seq(s.ctx_tgt.get())));
    }
    // the prefill of a generation, then [last prompt token, continuation...] with every logit kept;
    // scoring is not generation, so the session's counters are left as they were
    const pls_stats saved = s.stats;
    begin(s, prompt, &n_prompt, 1, 0);
    stream_state & st = s.streams[0];
    st.n_predict = 0;
    device_greedy_set(s, st, false);  // every row's logits come back to the host
    llama_tokens seq(1, st.id_last);
    seq.insert(seq.end(), cont, cont + n_cont - 1);
    common_batch & batch = s.batch;
    for (int32_t i0 = 0; i0 < n_cont; i0 += chunk) {
        batch.clear();
        const int32_t i1 = std::min(n_cont, i0 + chunk);
        for (int32_t i = i0; i < i1; ++i) {
            batch.add(seq[i], st.n_past + i, st.seq, true);
        }
        decode_or_throw(s.ctx_tgt.get(), batch, "scoring");
        for (int32_t i = i0; i < i1; ++i) {
            margins[i] = top2_margin(llama_get_logits_ith(s.ctx_tgt.get(), i - i0), s.n_vocab);
        }
    }
    finish_stream(st, PLS_FINISH_LENGTH);
    s.active = false;
    s.stats = saved;
    publish_stats(s);
}

}  // namespace pls
