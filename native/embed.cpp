// The C API of embeddings: a context of its own with embeddings on and pooling (the model's, mean for a causal LM
// that names none), each input decoded alone in one batch and its pooled vector normalized as llama-server's
// /v1/embeddings does (unit L2 norm).
#include "embed.h"

#include "common.h"

#include <cstdlib>

using namespace pls;

namespace {

// The pooling a model's GGUF names (<arch>.pooling_type), or -1 when it names none.
int32_t model_pooling(const llama_model * model) {
    char arch[128] = {0};
    if (llama_model_meta_val_str(model, "general.architecture", arch, sizeof(arch)) < 0) {
        return -1;
    }
    char value[32] = {0};
    const std::string key = std::string(arch) + ".pooling_type";
    if (llama_model_meta_val_str(model, key.c_str(), value, sizeof(value)) < 0) {
        return -1;
    }
    char * end = nullptr;
    const long v = std::strtol(value, &end, 10);
    return end != value ? (int32_t) v : -1;
}

}  // namespace

extern "C" int32_t pls_embedder_open(pls_model * model, const pls_embed_params * p, pls_embedder ** out, char * err,
                                     size_t err_size) {
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        ensure_init();
        if (model == nullptr || p == nullptr || out == nullptr) {
            fail(PLS_ERR_INVALID, "a model, parameters and a place for the embedder are required");
        }
        *out = nullptr;
        const int32_t n_ctx_train = llama_model_n_ctx_train(model->model);
        if (p->n_ctx < 1 || (n_ctx_train > 0 && p->n_ctx > n_ctx_train)) {
            fail(PLS_ERR_INVALID, "n_ctx=" + std::to_string(p->n_ctx) + " must be within 1.." +
                                  std::to_string(n_ctx_train) + " (the model's training context)");
        }
        if (p->n_threads < 0 || p->n_threads > 4096) {
            fail(PLS_ERR_INVALID, "n_threads=" + std::to_string(p->n_threads) + " must be within 0..4096");
        }
        int32_t pooling = p->pooling;
        if (pooling == PLS_POOLING_MODEL) {
            pooling = model_pooling(model->model);
            if (pooling == LLAMA_POOLING_TYPE_RANK) {
                fail(PLS_ERR_INVALID, "the model pools by rank (a reranker): it scores pairs, it does not embed");
            }
            if (pooling != LLAMA_POOLING_TYPE_CLS && pooling != LLAMA_POOLING_TYPE_LAST) {
                pooling = LLAMA_POOLING_TYPE_MEAN;  // none named (a causal LM): the mean over the input's tokens
            }
        }
        if (pooling != LLAMA_POOLING_TYPE_MEAN && pooling != LLAMA_POOLING_TYPE_CLS &&
            pooling != LLAMA_POOLING_TYPE_LAST) {
            fail(PLS_ERR_INVALID, "pooling=" + std::to_string(p->pooling) + " is not one of -1 (the model's), 1 (mean), "
                                  "2 (cls), 3 (last)");
        }
        check_remote(model->model);
        llama_context_params cp = llama_context_default_params();
        cp.n_ctx = (uint32_t) p->n_ctx;
        cp.n_batch = cp.n_ubatch = (uint32_t) p->n_ctx;  // pooling needs the whole input in one batch
        cp.n_seq_max = 1;
        cp.embeddings = true;
        cp.pooling_type = (enum llama_pooling_type) pooling;
        cp.n_threads = cp.n_threads_batch = p->n_threads > 0 ? p->n_threads : common_cpu_get_num_math();
        clear_last_error();
        llama_context * ctx = llama_init_from_model(model->model, cp);
        if (ctx == nullptr) {
            const std::string why = take_last_error();
            fail(PLS_ERR_MEMORY, "cannot create the embedding context (n_ctx " + std::to_string(p->n_ctx) + ")" +
                                 (why.empty() ? std::string() : ": " + why));
        }
        auto * e = new pls_embedder();
        e->model = model;
        model_retain(model);
        e->ctx = ctx;
        e->n_embd = llama_model_n_embd_out(model->model);
        e->n_ctx = p->n_ctx;
        e->pooling = (int32_t) llama_pooling_type(ctx);
        e->normalize = p->normalize != 0;
        *out = e;
        return PLS_OK;
    });
}

extern "C" void pls_embedder_free(pls_embedder * e) {
    if (e == nullptr) {
        return;
    }
    {
        std::lock_guard<std::mutex> lock(e->mu);  // a call still running finishes first
        llama_free(e->ctx);
        e->ctx = nullptr;
    }
    model_release(e->model);
    delete e;
}

extern "C" int32_t pls_embedder_get_info(const pls_embedder * e, pls_embedder_info * out) {
    if (e == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    out->n_embd = e->n_embd;
    out->n_ctx = e->n_ctx;
    out->pooling = e->pooling;
    return PLS_OK;
}

extern "C" int32_t pls_embed(pls_embedder * e, const int32_t * tokens, const int32_t * n_tokens, int32_t n_inputs,
                             float * out, char * err, size_t err_size) {
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        if (e == nullptr || n_tokens == nullptr || out == nullptr || n_inputs < 0 || (tokens == nullptr && n_inputs > 0)) {
            fail(PLS_ERR_INVALID, "an embedder, the inputs and a place for the vectors are required");
        }
        const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(e->model->model));
        // every input is checked before any is decoded
        size_t at = 0;
        for (int32_t i = 0; i < n_inputs; ++i) {
            const int32_t n = n_tokens[i];
            if (n < 1) {
                fail(PLS_ERR_INVALID, "input " + std::to_string(i) + " is empty");
            }
            if (n > e->n_ctx) {
                fail(PLS_ERR_CONTEXT, "input " + std::to_string(i) + " has " + std::to_string(n) + " tokens, but "
                                      "the embedder takes at most " + std::to_string(e->n_ctx));
            }
            for (int32_t j = 0; j < n; ++j) {
                if (tokens[at + j] < 0 || tokens[at + j] >= n_vocab) {
                    fail(PLS_ERR_INVALID, "input " + std::to_string(i) + ": token " + std::to_string(tokens[at + j]) +
                                          " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
                }
            }
            at += (size_t) n;
        }
        std::lock_guard<std::mutex> lock(e->mu);
        check_remote(e->model->model);
        llama_memory_t mem = llama_get_memory(e->ctx);
        llama_batch batch = llama_batch_init(e->n_ctx, 0, 1);
        std::unique_ptr<llama_batch, void (*)(llama_batch *)> own(&batch, [](llama_batch * b) { llama_batch_free(*b); });
        at = 0;
        for (int32_t i = 0; i < n_inputs; ++i) {
            const int32_t n = n_tokens[i];
            if (mem != nullptr) {
                llama_memory_clear(mem, true);
            }
            batch.n_tokens = n;
            for (int32_t j = 0; j < n; ++j) {
                batch.token[j] = tokens[at + j];
                batch.pos[j] = j;
                batch.n_seq_id[j] = 1;
                batch.seq_id[j][0] = 0;
                batch.logits[j] = 1;  // every token's output goes into the pooling
            }
            clear_last_error();
            const int32_t rc = llama_decode(e->ctx, batch);
            if (rc != 0) {
                check_remote(e->model->model);
                const std::string why = take_last_error();
                fail(PLS_ERR_DECODE, "decoding input " + std::to_string(i) + " failed (llama_decode returned " +
                                     std::to_string(rc) + ")" + (why.empty() ? std::string() : ": " + why));
            }
            const float * v = llama_get_embeddings_seq(e->ctx, 0);
            if (v == nullptr) {
                fail(PLS_ERR_INTERNAL, "no pooled embedding for input " + std::to_string(i));
            }
            common_embd_normalize(v, out + (size_t) i * e->n_embd, e->n_embd, e->normalize ? 2 : -1);
            at += (size_t) n;
        }
        if (mem != nullptr) {
            llama_memory_clear(mem, true);
        }
        return PLS_OK;
    });
}
