// Greedy verification on the device (device_greedy.h).
#include "device_greedy.h"

#include "session.h"

#include "ggml-backend.h"
#include "ggml.h"

#include <cmath>
#include <string>
#include <vector>

namespace pls {

namespace {

// the sampler's state: whether its ops run on the device it was attached for
struct argmax_state {
    bool ready = false;
};

const char * argmax_name(const llama_sampler *) { return "pls-argmax"; }

// on the host (a chain not attached to a context): the first largest logit
void argmax_apply(llama_sampler *, llama_token_data_array * cur_p) {
    cur_p->selected = 0;
    for (size_t i = 1; i < cur_p->size; ++i) {
        if (cur_p->data[i].logit > cur_p->data[cur_p->selected].logit) {
            cur_p->selected = (int64_t) i;
        }
    }
}

void argmax_free(llama_sampler * smpl) { delete (argmax_state *) smpl->ctx; }

// the ops the device must run: the argmax and the sum of a row of the vocabulary's size
bool argmax_backend_init(llama_sampler * smpl, ggml_backend_buffer_type_t buft, uint32_t) {
    auto * st = (argmax_state *) smpl->ctx;
    st->ready = false;
    ggml_backend_dev_t dev = ggml_backend_buft_get_device(buft);
    if (dev == nullptr) {
        st->ready = true;  // the CPU's buffer type names no device: the CPU runs every op
        return true;
    }
    ggml_init_params ip = { 8 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(ip);
    if (ctx == nullptr) {
        return false;
    }
    ggml_tensor * row = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 128 * 1024);
    const bool ok = ggml_backend_dev_supports_op(dev, ggml_argmax(ctx, row)) &&
                    ggml_backend_dev_supports_op(dev, ggml_sum(ctx, row));
    ggml_free(ctx);
    st->ready = ok;
    return ok;
}

void argmax_backend_apply(llama_sampler *, ggml_context * ctx, ggml_cgraph *, llama_sampler_data * data) {
    ggml_tensor * row = ggml_reshape_1d(ctx, data->logits, ggml_nelements(data->logits));
    ggml_tensor * id = ggml_argmax(ctx, row);
    ggml_set_name(id, "pls_argmax");
    ggml_tensor * sum = ggml_sum(ctx, row);
    ggml_set_name(sum, "pls_row_sum");
    data->sampled = id;
    data->logits = sum;  // one number comes back per row, not the vocabulary
    data->probs = nullptr;
    data->candidates = nullptr;
}

llama_sampler_i argmax_iface = {
    /* .name              = */ argmax_name,
    /* .accept            = */ nullptr,
    /* .apply             = */ argmax_apply,
    /* .reset             = */ nullptr,
    /* .clone             = */ nullptr,
    /* .free              = */ argmax_free,
    /* .backend_init      = */ argmax_backend_init,
    /* .backend_accept    = */ nullptr,
    /* .backend_apply     = */ argmax_backend_apply,
    /* .backend_set_input = */ nullptr,
    /* .backend_reset     = */ nullptr,
    /* .copy_state        = */ nullptr,
};

}  // namespace

llama_sampler * device_greedy_chain(int32_t n_vocab, const llama_token * eog, int32_t n_eog) {
    llama_sampler * chain = llama_sampler_chain_init(llama_sampler_chain_default_params());
    if (n_eog > 0) {
        std::vector<llama_logit_bias> bias;
        for (int32_t i = 0; i < n_eog; ++i) {
            bias.push_back({ eog[i], -INFINITY });
        }
        llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(n_vocab, n_eog, bias.data()));
    }
    llama_sampler_chain_add(chain, llama_sampler_init(&argmax_iface, new argmax_state));
    return chain;
}

bool device_greedy_ready(llama_sampler * chain) {
    const int n = llama_sampler_chain_n(chain);
    if (n <= 0) {
        return false;
    }
    // the argmax is last: the chain runs on the device only if every sampler before it does (the bias has no
    // device check of its own: where the device lacks one of its ops, the scheduler runs that op on the CPU)
    llama_sampler * last = llama_sampler_chain_get(chain, n - 1);
    return last != nullptr && last->iface == &argmax_iface && ((const argmax_state *) last->ctx)->ready;
}

bool device_greedy_attach(pls_session & s, int32_t seq) {
    const size_t q = (size_t) seq;
    if (!s.tgt_device_greedy || q >= s.tgt_chains.size()) {
        return false;
    }
    if (s.tgt_chains[q] != nullptr) {
        return true;
    }
    // a chain is initialised once per attach: a new one each time
    llama_context * ctx = s.ctx_tgt.get();
    llama_sampler * chain = device_greedy_chain(s.n_vocab, s.eog_tokens.data(), (int32_t) s.eog_tokens.size());
    if (!llama_set_sampler(ctx, seq, chain) || !device_greedy_ready(chain)) {
        // the device cannot run it: every sequence samples on the host
        llama_set_sampler(ctx, seq, nullptr);
        llama_sampler_free(chain);
        device_greedy_release(s);
        return false;
    }
    s.tgt_chains[q] = chain;
    return true;
}

void device_greedy_detach(pls_session & s, int32_t seq) {
    const size_t q = (size_t) seq;
    if (q < s.tgt_chains.size() && s.tgt_chains[q] != nullptr) {
        llama_set_sampler(s.ctx_tgt.get(), seq, nullptr);
        llama_sampler_free(s.tgt_chains[q]);
        s.tgt_chains[q] = nullptr;
    }
}

void device_greedy_release(pls_session & s) {
    for (size_t q = 0; q < s.tgt_chains.size(); ++q) {
        device_greedy_detach(s, (int32_t) q);
    }
    s.tgt_chains.clear();
    s.tgt_device_greedy = false;
    for (auto & st : s.streams) {
        st.device_greedy = false;
    }
}

bool device_greedy_set(pls_session & s, stream_state & st, bool on) {
    if (on) {
        st.device_greedy = device_greedy_attach(s, st.seq);
    } else {
        device_greedy_detach(s, st.seq);
        st.device_greedy = false;
    }
    return st.device_greedy;
}

llama_token device_greedy_token(pls_session & s, int32_t idx) {
    llama_context * ctx = s.ctx_tgt.get();
    const float * sum = llama_get_sampled_logits_ith(ctx, idx);
    if (sum == nullptr || llama_get_sampled_logits_count_ith(ctx, idx) != 1) {
        fail(PLS_ERR_DECODE, "the device returned no sampled row for output " + std::to_string(idx) +
                             " of the verify batch; open the session with backend_sampling=False");
    }
    if (std::isnan(*sum)) {
        fail_nan_logits();
    }
    const llama_token id = llama_get_sampled_token_ith(ctx, idx);
    if (id < 0 || id >= s.n_vocab) {
        // no logit above -inf (or none a number): logits no token can be trusted from
        fail_nan_logits();
    }
    return id;
}

}  // namespace pls
