// Models: load once, share between sessions; metadata, tokenizer and chat template.
#include "shim_common.h"

#include "common.h"
#include "chat.h"
#include "llama-ext.h"   // staging API (C++ linkage): target layer ids, DFlash2 selector, output device
#include "llama-arch.h"  // llm_arch_supports_rs_rollback
#include "llama-model.h" // whether the model has its own LM head
#include "gguf.h"

#include <memory>
#include <sys/stat.h>
#include <stdexcept>

namespace {

// parse "regex=BUFT,regex=BUFT" (llama.cpp's -ot) into overrides; the pattern strings must outlive the model load
struct tensor_overrides {
    std::vector<std::string> patterns;
    std::vector<llama_model_tensor_buft_override> list;

    void parse(const char * spec) {
        if (spec == nullptr || spec[0] == '\0') {
            return;
        }
        std::string s(spec);
        size_t start = 0;
        while (start <= s.size()) {
            size_t end = s.find(',', start);
            if (end == std::string::npos) {
                end = s.size();
            }
            std::string item = s.substr(start, end - start);
            start = end + 1;
            if (item.empty()) {
                continue;
            }
            const size_t eq = item.rfind('=');
            if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
                throw std::invalid_argument("tensor override '" + item + "' is not of the form PATTERN=BUFFER_TYPE");
            }
            const std::string buft_name = item.substr(eq + 1);
            ggml_backend_buffer_type_t buft = nullptr;
            for (size_t i = 0; i < ggml_backend_dev_count() && buft == nullptr; ++i) {
                ggml_backend_dev_t dev = ggml_backend_dev_get(i);
                ggml_backend_buffer_type_t b = ggml_backend_dev_buffer_type(dev);
                if (b && buft_name == ggml_backend_buft_name(b)) {
                    buft = b;
                }
            }
            if (buft == nullptr) {
                pls::fail(PLS_ERR_PLACEMENT, "tensor override '" + item + "': unknown buffer type '" + buft_name + "'");
            }
            patterns.push_back(item.substr(0, eq));
            list.push_back({ nullptr, buft });
        }
    }

    void add_cpu_moe(int32_t n_layers) {
        // the same rule as llama.cpp's --n-cpu-moe: expert tensors of the first N layers stay on the CPU
        ggml_backend_buffer_type_t cpu = ggml_backend_dev_buffer_type(ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU));
        for (int32_t il = 0; il < n_layers; ++il) {
            patterns.push_back("blk\\." + std::to_string(il) + "\\.ffn_(up|down|gate|gate_up)_(ch|)exps");
            list.push_back({ nullptr, cpu });
        }
    }

    const llama_model_tensor_buft_override * finish() {
        if (list.empty()) {
            return nullptr;
        }
        for (size_t i = 0; i < list.size(); ++i) {
            list[i].pattern = patterns[i].c_str();
        }
        list.push_back({ nullptr, nullptr });
        return list.data();
    }
};

std::string meta_str(const llama_model * model, const char * key) {
    char buf[256];
    const int32_t n = llama_model_meta_val_str(model, key, buf, sizeof(buf));
    return n < 0 ? std::string() : std::string(buf);
}

// whether a GGUF carries NextN (MTP) layers, from its metadata alone
bool gguf_has_nextn(const char * path) {
    gguf_init_params gp = { /* .no_alloc = */ true, /* .ctx = */ nullptr };
    gguf_context * g = gguf_init_from_file(path, gp);
    if (g == nullptr) {
        return false;  // the real load reports what is wrong with the file
    }
    bool has = false;
    const int64_t arch_id = gguf_find_key(g, "general.architecture");
    if (arch_id >= 0 && gguf_get_kv_type(g, arch_id) == GGUF_TYPE_STRING) {
        const std::string key = std::string(gguf_get_val_str(g, arch_id)) + ".nextn_predict_layers";
        const int64_t id = gguf_find_key(g, key.c_str());
        has = id >= 0 && gguf_get_kv_type(g, id) == GGUF_TYPE_UINT32 && gguf_get_val_u32(g, id) > 0;
    }
    gguf_free(g);
    return has;
}

}  // namespace

// everything llama_model_params points into must outlive the load: this struct owns it
struct pls::model_load_params::storage {
    std::vector<ggml_backend_dev_t> devices;
    std::vector<float> split;
    tensor_overrides overrides;
};

pls::model_load_params::model_load_params() : own(std::make_shared<storage>()) {}

pls::model_load_params pls::make_model_params(const pls_model_params * p) {
    if (p == nullptr || p->path == nullptr || p->path[0] == '\0') {
        throw std::invalid_argument("no model path given");
    }
    struct stat sb;
    if (stat(p->path, &sb) != 0) {
        throw std::invalid_argument(std::string("cannot open '") + p->path + "': " + strerror(errno));
    }
    if (!S_ISREG(sb.st_mode)) {
        // a FIFO or device would block or stream forever; a directory is not a model
        throw std::invalid_argument(std::string("'") + p->path + "' is not a regular file" +
                                    (S_ISDIR(sb.st_mode) ? " (a directory)" : ""));
    }
    FILE * f = fopen(p->path, "rb");
    if (f == nullptr) {
        throw std::invalid_argument(std::string("cannot open '") + p->path + "': " + strerror(errno));
    }
    char magic[4] = {0};
    const size_t n_magic = fread(magic, 1, 4, f);
    fclose(f);
    if (n_magic != 4 || memcmp(magic, "GGUF", 4) != 0) {
        throw std::invalid_argument(std::string("'") + p->path + "' is not a GGUF file (bad magic)");
    }

    model_load_params out;
    model_load_params::storage & st = *out.own;
    bool cpu_only = false;
    st.devices = parse_devices(p->devices, &cpu_only);
    out.requested_devices = st.devices;
    st.overrides.parse(p->tensor_overrides);
    if (p->n_cpu_moe > 0) {
        st.overrides.add_cpu_moe(p->n_cpu_moe);
    }
    llama_model_params & mp = out.mp;
    mp = llama_model_default_params();
    mp.n_gpu_layers = cpu_only ? 0 : (p->n_gpu_layers < 0 ? 999 : p->n_gpu_layers);
    if (cpu_only || !st.devices.empty()) {
        st.devices.push_back(nullptr);
        mp.devices = st.devices.data();
    }
    mp.split_mode = (llama_split_mode) p->split_mode;
    mp.main_gpu = p->main_gpu;
    st.split.assign(llama_max_devices(), 0.0f);
    if (p->tensor_split != nullptr && p->n_tensor_split > 0) {
        if ((size_t) p->n_tensor_split > st.split.size()) {
            throw std::invalid_argument("tensor split has more entries than devices supported");
        }
        std::copy(p->tensor_split, p->tensor_split + p->n_tensor_split, st.split.begin());
        mp.tensor_split = st.split.data();
    }
    mp.tensor_buft_overrides = st.overrides.finish();
    if (p->use_mmap == 0) {
        mp.load_mode = LLAMA_LOAD_MODE_NONE;
    }
    // MTP heads are only loaded when asked; "auto" looks at the GGUF's metadata first
    mp.load_mtp = p->load_mtp < 0 ? gguf_has_nextn(p->path) : p->load_mtp > 0;
    return out;
}

extern "C" int32_t pls_model_load(const pls_model_params * p, pls_model ** out, char * err, size_t err_size) {
    return pls::guarded(err, err_size, PLS_ERR_LOAD, [&]() -> int32_t {
        pls::ensure_init();
        pls::clear_last_error();
        if (out == nullptr) {
            pls::fail(PLS_ERR_INVALID, "no place for the model given");
        }
        *out = nullptr;
        pls::model_load_params lp;
        try {
            lp = pls::make_model_params(p);
        } catch (const pls::status_error &) {
            throw;
        } catch (const std::invalid_argument & e) {
            // a missing or unreadable file, not GGUF, an unknown device or override
            const std::string m = e.what();
            const bool file = m.rfind("cannot open", 0) == 0 || m.find("is not a GGUF") != std::string::npos ||
                              m.find("not a regular file") != std::string::npos || m.rfind("no model path", 0) == 0;
            pls::fail(file ? PLS_ERR_LOAD : PLS_ERR_INVALID, m);
        }
        auto m = std::make_unique<pls_model>();
        m->path = p->path;
        m->devices = lp.requested_devices;
        m->split_mode = p->split_mode;
        m->model = llama_model_load_from_file(p->path, lp.mp);
        if (m->model == nullptr) {
            const std::string why = pls::take_last_error();
            pls::check_remote_servers();  // a remote device that failed while loading: PLS_ERR_REMOTE, naming it
            pls::fail(PLS_ERR_LOAD, std::string("failed to load '") + p->path + "'" +
                                    (why.empty() ? std::string(" (truncated, corrupt or of an unsupported architecture)") : ": " + why));
        }
        try {
            pls::check_remote(m->model);  // loaded onto a host that went away meanwhile
        } catch (...) {
            llama_model_free(m->model);
            throw;
        }
        *out = m.release();
        return PLS_OK;
    });
}

extern "C" void pls_model_free(pls_model * model) {
    pls::model_release(model);
}

static int32_t model_info(const pls_model * pm, pls_model_info * out);

extern "C" int32_t pls_model_get_info(const pls_model * pm, pls_model_info * out) {
    if (pm == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    return pls::guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t { return model_info(pm, out); });
}

static int32_t model_info(const pls_model * pm, pls_model_info * out) {
    const llama_model * m = pm->model;
    const llama_vocab * vocab = llama_model_get_vocab(m);
    memset(out, 0, sizeof(*out));
    const std::string arch = meta_str(m, "general.architecture");
    snprintf(out->arch, sizeof(out->arch), "%s", arch.c_str());
    llama_model_desc(m, out->desc, sizeof(out->desc));
    out->n_vocab = llama_vocab_n_tokens(vocab);
    out->n_embd = llama_model_n_embd(m);
    out->n_layer = llama_model_n_layer(m);
    out->n_layer_nextn = llama_model_n_layer_nextn(m);
    out->n_ctx_train = llama_model_n_ctx_train(m);
    out->n_head = llama_model_n_head(m);
    out->n_head_kv = llama_model_n_head_kv(m);
    out->n_swa = llama_model_n_swa(m);
    out->is_recurrent = llama_model_is_recurrent(m);
    out->is_hybrid = llama_model_is_hybrid(m);
    out->supports_rs_rollback = llm_arch_supports_rs_rollback(llm_arch_from_string(arch));
    out->has_encoder = llama_model_has_encoder(m);
    out->token_bos = llama_vocab_bos(vocab);
    out->token_eos = llama_vocab_eos(vocab);
    out->token_eot = llama_vocab_eot(vocab);
    out->token_mask = llama_vocab_mask(vocab);
    out->add_bos = llama_vocab_get_add_bos(vocab);
    if (arch == "dflash") {
        const std::string bs = meta_str(m, "dflash.block_size");
        out->dflash_block_size = bs.empty() ? 16 : std::stoi(bs);  // upstream's default
        out->dflash_selector_top_k = llama_model_dflash_selector_top_k(m);
    }
    const uint32_t n_ids = llama_model_target_layer_ids_n(m);
    const int32_t * ids = llama_model_target_layer_ids(m);
    out->n_target_layers = (int32_t) n_ids;
    for (uint32_t i = 0; i < n_ids && i < 16; ++i) {
        out->target_layers[i] = ids[i];
    }
    out->size_bytes = llama_model_size(m);
    out->n_params = llama_model_n_params(m);
    // a model without output.weight borrows the one of its target (DFlash/EAGLE3 heads)
    out->has_output = m->output != nullptr;
    snprintf(out->head_device, sizeof(out->head_device), "%s", pls::device_name(llama_model_dev_output(m)).c_str());
    return 0;
}

extern "C" int32_t pls_model_meta(const pls_model * model, const char * key, char * buf, int32_t buf_size) {
    if (model == nullptr || key == nullptr) {
        return -1;
    }
    try {
    const int32_t n = llama_model_meta_val_str(model->model, key, nullptr, 0);
    if (n < 0) {
        return -1;
    }
    std::vector<char> tmp(n + 1);
    llama_model_meta_val_str(model->model, key, tmp.data(), tmp.size());
    const int32_t r = pls::copy_out(std::string(tmp.data(), n), buf, buf_size);
    return r;
    } catch (...) {
        return -1;
    }
}

extern "C" int32_t pls_tokenize(const pls_model * model, const char * text, int32_t text_len, int32_t * tokens,
                                int32_t n_tokens_max, int32_t add_special, int32_t parse_special) {
    if (model == nullptr || text == nullptr || text_len < 0) {
        return 0;
    }
    try {
        const llama_vocab * vocab = llama_model_get_vocab(model->model);
        return llama_tokenize(vocab, text, text_len, tokens, n_tokens_max, add_special != 0, parse_special != 0);
    } catch (...) {
        return INT32_MIN;  // tokenization failed
    }
}

extern "C" int32_t pls_token_to_piece(const pls_model * model, int32_t token, char * buf, int32_t buf_size,
                                      int32_t special) {
    if (model == nullptr) {
        return 0;
    }
    try {
        const llama_vocab * vocab = llama_model_get_vocab(model->model);
        if (token < 0 || token >= llama_vocab_n_tokens(vocab)) {
            return 0;
        }
        return llama_token_to_piece(vocab, token, buf, buf_size, 0, special != 0);
    } catch (...) {
        return 0;
    }
}

extern "C" int32_t pls_token_is_eog(const pls_model * model, int32_t token) {
    if (model == nullptr || token < 0 || token >= llama_vocab_n_tokens(llama_model_get_vocab(model->model))) {
        return 0;
    }
    return llama_vocab_is_eog(llama_model_get_vocab(model->model), token);
}

namespace {

// role/content pairs as upstream's chat messages
std::vector<common_chat_msg> chat_messages(const char * const * roles, const char * const * contents, int32_t n) {
    std::vector<common_chat_msg> msgs(n);
    for (int32_t i = 0; i < n; ++i) {
        if (roles[i] == nullptr || contents[i] == nullptr) {
            throw std::invalid_argument("message " + std::to_string(i) + " has no role or no content");
        }
        msgs[i].role = roles[i];
        msgs[i].content = contents[i];
    }
    return msgs;
}

}  // namespace

extern "C" int32_t pls_chat_format(const pls_model * model, const char * tmpl, const char * const * roles,
                                   const char * const * contents, int32_t n_messages, int32_t add_generation_prompt,
                                   int32_t enable_thinking, char * buf, int32_t buf_size, int32_t * n_out,
                                   char * err, size_t err_size) {
    if (n_out != nullptr) {
        *n_out = 0;
    }
    if (model == nullptr || n_out == nullptr || n_messages < 0 || (n_messages > 0 && (roles == nullptr || contents == nullptr))) {
        pls::set_err(err, err_size, "invalid arguments: a model, n_out, and roles and contents for n_messages >= 0");
        return PLS_ERR_INVALID;
    }
    pls::ensure_init();
    const bool has_override = tmpl != nullptr && tmpl[0] != '\0';
    const char * own = llama_model_chat_template(model->model, nullptr);
    const char * own_tool_use = llama_model_chat_template(model->model, "tool_use");
    if (!has_override && own == nullptr && own_tool_use == nullptr) {
        // upstream would fall back to ChatML; a prompt in a format the model never saw is worse than an error
        pls::set_err(err, err_size, "the model has no chat template");
        return PLS_ERR_NO_TEMPLATE;
    }
    const std::string src = has_override ? tmpl : (own != nullptr ? own : own_tool_use);
    try {
        // parse first: upstream's init logs a parse error and rethrows it without its message
        common_chat_template probe(src, "", "");
    } catch (const std::exception & e) {
        pls::set_err(err, err_size, std::string("cannot parse the chat template: ") + e.what());
        return PLS_ERR_TEMPLATE;
    } catch (...) {
        pls::set_err(err, err_size, "cannot parse the chat template");
        return PLS_ERR_TEMPLATE;
    }
    std::string prompt;
    try {
        common_chat_templates_ptr tmpls = common_chat_templates_init(model->model, has_override ? src : std::string());
        common_chat_templates_inputs inputs;
        inputs.messages = chat_messages(roles, contents, n_messages);
        inputs.add_generation_prompt = add_generation_prompt != 0;
        inputs.use_jinja = true;
        if (enable_thinking >= 0) {
            // as llama.cpp's --reasoning on|off: the flag and the template argument
            inputs.enable_thinking = enable_thinking != 0;
            inputs.chat_template_kwargs["enable_thinking"] = enable_thinking != 0 ? "true" : "false";
        }
        try {
            // the path llama-server takes (a few model families adjust their messages there)
            prompt = common_chat_templates_apply(tmpls.get(), inputs).prompt;
        } catch (const std::exception &) {
            // the output-parser generation can fail for a template that renders fine: render it as it is
            inputs.force_pure_content = true;
            prompt = common_chat_templates_apply(tmpls.get(), inputs).prompt;
        }
    } catch (const std::bad_alloc &) {
        pls::set_err(err, err_size, "out of memory while rendering the chat template");
        return PLS_ERR_MEMORY;
    } catch (const std::exception & e) {
        pls::set_err(err, err_size, std::string("cannot render the chat template: ") + e.what());
        return PLS_ERR_TEMPLATE;
    } catch (...) {
        pls::set_err(err, err_size, "cannot render the chat template");
        return PLS_ERR_TEMPLATE;
    }
    if (prompt.size() >= (size_t) INT32_MAX) {
        pls::set_err(err, err_size, "the rendered prompt is larger than 2 GiB");
        return PLS_ERR_TEMPLATE;
    }
    if (n_out != nullptr) {
        *n_out = (int32_t) prompt.size();
    }
    if (buf == nullptr || buf_size <= (int32_t) prompt.size()) {
        return PLS_OK;  // too small: the caller asks again with *n_out + 1 bytes
    }
    memcpy(buf, prompt.data(), prompt.size());
    buf[prompt.size()] = '\0';
    return PLS_OK;
}
