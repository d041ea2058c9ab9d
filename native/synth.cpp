// Synthetic models: metadata alone goes to upstream's loader (llama_model_init_from_user), which creates
// every tensor the architecture asks for; we fill them with seeded noise and save the result as GGUF.
// A "draft model" is the same model plus a second, smaller noise: it agrees with the target often,
// not always, so partial acceptance and rollback really happen.
#include "shim_common.h"

#include "gguf.h"

#include <cmath>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>

namespace {

struct fill_params {
    uint32_t seed;
    float stddev;
    uint32_t perturb_seed;
    float perturb_stddev;
};

uint64_t hash_name(const char * s) {  // FNV-1a: stable across runs and platforms, unlike std::hash
    uint64_t h = 1469598103934665603ull;
    for (; *s; ++s) {
        h = (h ^ (uint8_t) *s) * 1099511628211ull;
    }
    return h;
}

void fill_tensor(struct ggml_tensor * t, void * ud) {
    const fill_params & p = *(const fill_params *) ud;
    const int64_t ne = ggml_nelements(t);
    std::vector<float> v(ne);
    std::mt19937_64 gen(p.seed ^ hash_name(t->name));
    std::normal_distribution<float> dis(0.0f, p.stddev);
    // norms near 1 keep activations in range through many layers of a realistic-depth model
    const bool is_norm = strstr(t->name, "_norm") != nullptr;
    const bool is_ssm_a = strstr(t->name, "ssm_a") != nullptr;  // state decay must be negative
    for (int64_t i = 0; i < ne; ++i) {
        float x = dis(gen);
        v[i] = is_norm ? 1.0f + x : (is_ssm_a ? -std::fabs(x) : x);
    }
    if (p.perturb_seed != 0) {
        std::mt19937_64 g2(p.perturb_seed ^ hash_name(t->name));
        std::normal_distribution<float> d2(0.0f, p.perturb_stddev);
        for (int64_t i = 0; i < ne; ++i) {
            v[i] += d2(g2);
        }
    }
    if (t->type == GGML_TYPE_F32) {
        ggml_backend_tensor_set(t, v.data(), 0, ggml_nbytes(t));
    } else if (t->type == GGML_TYPE_F16) {
        std::vector<ggml_fp16_t> h(ne);
        ggml_fp32_to_fp16_row(v.data(), h.data(), ne);
        ggml_backend_tensor_set(t, h.data(), 0, ggml_nbytes(t));
    } else {
        throw std::runtime_error(std::string("synthetic tensor ") + t->name + " has unsupported type " + ggml_type_name(t->type));
    }
}

}  // namespace

extern "C" int32_t pls_synth_model(const pls_synth_params * p, const char * path_out, char * err, size_t err_size) {
    pls::ensure_init();
    if (p == nullptr || p->arch == nullptr || path_out == nullptr) {
        pls::set_err(err, err_size, "synthetic model: arch and output path are required");
        return -1;
    }
    if (p->n_vocab < 8 || p->n_embd < 8 || p->n_layer < 1 || p->n_head < 1 || p->n_embd % p->n_head != 0) {
        pls::set_err(err, err_size, "synthetic model: need n_vocab >= 8, n_embd >= 8, n_layer >= 1 and n_embd divisible by n_head");
        return -1;
    }
    const std::string a = p->arch;
    auto key = [&](const char * k) { return a + "." + k; };
    gguf_context * g = gguf_init_empty();
    std::unique_ptr<gguf_context, void (*)(gguf_context *)> guard(g, gguf_free);

    const uint32_t n_head_kv = p->n_head_kv > 0 ? p->n_head_kv : p->n_head;
    const uint32_t head_dim = p->n_embd / p->n_head;
    gguf_set_val_str(g, "general.architecture", a.c_str());
    gguf_set_val_str(g, "general.name", ("pyllamaspec synthetic " + a).c_str());
    gguf_set_val_u32(g, "general.file_type", 0);  // F32: requantize the result for other types
    gguf_set_val_u32(g, key("vocab_size").c_str(), p->n_vocab);
    gguf_set_val_u32(g, key("context_length").c_str(), p->n_ctx_train > 0 ? p->n_ctx_train : 4096);
    gguf_set_val_u32(g, key("embedding_length").c_str(), p->n_embd);
    gguf_set_val_u32(g, key("block_count").c_str(), p->n_layer + std::max(0, p->n_layer_nextn));
    gguf_set_val_u32(g, key("feed_forward_length").c_str(), p->n_ff > 0 ? p->n_ff : 4 * p->n_embd);
    gguf_set_val_u32(g, key("attention.head_count").c_str(), p->n_head);
    gguf_set_val_u32(g, key("attention.head_count_kv").c_str(), n_head_kv);
    gguf_set_val_f32(g, key("attention.layer_norm_rms_epsilon").c_str(), 1e-6f);
    gguf_set_val_f32(g, key("rope.freq_base").c_str(), 1000000.0f);
    if (p->n_layer_nextn > 0) {
        gguf_set_val_u32(g, key("nextn_predict_layers").c_str(), p->n_layer_nextn);
    }
    if (p->full_attention_interval > 0) {
        // gated-DeltaNet hybrids (qwen35 family)
        const uint32_t d_inner = p->ssm_d_inner > 0 ? p->ssm_d_inner : 2 * p->n_embd;
        const uint32_t d_state = p->ssm_d_state > 0 ? p->ssm_d_state : 128;
        gguf_set_val_u32(g, key("full_attention_interval").c_str(), p->full_attention_interval);
        gguf_set_val_u32(g, key("ssm.inner_size").c_str(), d_inner);
        gguf_set_val_u32(g, key("ssm.state_size").c_str(), d_state);
        gguf_set_val_u32(g, key("ssm.conv_kernel").c_str(), p->ssm_d_conv > 0 ? p->ssm_d_conv : 4);
        gguf_set_val_u32(g, key("ssm.time_step_rank").c_str(), d_inner / d_state);
        gguf_set_val_u32(g, key("ssm.group_count").c_str(), p->ssm_n_group > 0 ? p->ssm_n_group : 2);
        gguf_set_val_u32(g, key("attention.key_length").c_str(), head_dim);
        gguf_set_val_u32(g, key("attention.value_length").c_str(), head_dim);
        gguf_set_val_u32(g, key("rope.dimension_count").c_str(), head_dim / 4);
        const int32_t sections[4] = { (int32_t) head_dim / 16, (int32_t) head_dim / 16, (int32_t) head_dim / 16, 0 };
        gguf_set_arr_data(g, key("rope.dimension_sections").c_str(), GGUF_TYPE_INT32, sections, 4);
    }
    // upstream's test tokenizer: tokens tok_<i>, no BOS/EOS, detokenizes to readable ids
    gguf_set_val_str(g, "tokenizer.ggml.model", "test");
    std::vector<std::string> names(p->n_vocab);
    std::vector<const char *> cnames(p->n_vocab);
    std::vector<float> scores(p->n_vocab, 0.0f);
    for (int32_t i = 0; i < p->n_vocab; ++i) {
        names[i] = "tok_" + std::to_string(i);
        cnames[i] = names[i].c_str();
    }
    gguf_set_arr_str(g, "tokenizer.ggml.tokens", cnames.data(), cnames.size());
    gguf_set_arr_data(g, "tokenizer.ggml.scores", GGUF_TYPE_FLOAT32, scores.data(), scores.size());

    fill_params fp = { p->seed, p->stddev > 0 ? p->stddev : 0.02f, p->perturb_seed, p->perturb_stddev };
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    mp.load_mtp = p->n_layer_nextn > 0;
    pls::clear_last_error();
    llama_model * m = nullptr;
    try {
        m = llama_model_init_from_user(g, fill_tensor, &fp, mp);
    } catch (const std::exception & e) {
        pls::set_err(err, err_size, std::string("synthetic model: ") + e.what());
        return -1;
    }
    if (m == nullptr) {
        pls::set_err(err, err_size, "synthetic model: upstream refused the metadata: " + pls::take_last_error());
        return -1;
    }
    llama_model_save_to_file(m, path_out);
    llama_model_free(m);
    return 0;
}
