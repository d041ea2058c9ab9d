// Embeddings: a pooled, embeddings-only llama.cpp context over a model, apart from every session.
#pragma once

#include "shim_common.h"

#include <mutex>

struct pls_embedder {
    pls_model * model = nullptr;          // retained: the embedder holds its model
    llama_context * ctx = nullptr;
    int32_t n_embd = 0;
    int32_t n_ctx = 0;
    int32_t pooling = 0;                  // llama_pooling_type in use (mean, cls or last)
    bool normalize = true;
    std::mutex mu;                        // one embedding at a time over the context
};
