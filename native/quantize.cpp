// Requantization through upstream's quantizer, with per-tensor type overrides.
#include "shim_common.h"

#include <cstdio>
#include <sstream>
#include <strings.h>

namespace {

struct progress_sink {
    pls_progress_cb cb;
    void * user_data;
};

// the quantizer logs "[   i/   n] name - [shape], type = ..." on the calling thread as it starts tensor i
void on_quantize_log(void * user, ggml_log_level /*level*/, const char * text) {
    int done = 0;
    int total = 0;
    if (text != nullptr && text[0] == '[' && sscanf(text, "[%d/%d]", &done, &total) == 2 && total > 0) {
        const progress_sink * sink = static_cast<const progress_sink *>(user);
        sink->cb(sink->user_data, done - 1, total);
    }
}

// removes the hook however the quantizer returns
struct scoped_log_hook {
    scoped_log_hook(pls::thread_log_hook hook, void * user) { pls::set_thread_log_hook(hook, user); }
    ~scoped_log_hook() { pls::set_thread_log_hook(nullptr, nullptr); }
};

}  // namespace

extern "C" int32_t pls_quantize(const char * path_in, const char * path_out, int32_t ftype, int32_t n_threads,
                                int32_t allow_requantize, const char * tensor_types, pls_progress_cb progress,
                                void * user_data, char * err, size_t err_size) {
    if (path_in == nullptr || path_out == nullptr) {
        pls::set_err(err, err_size, "no input or output path given");
        return -1;
    }
    pls::ensure_init();
    pls::clear_last_error();
    llama_model_quantize_params qp = llama_model_quantize_default_params();
    qp.ftype = (llama_ftype) ftype;
    qp.nthread = n_threads;
    qp.allow_requantize = allow_requantize != 0;

    // "regex=TYPE,...": tensors a drafter needs at full precision keep a safe type of the caller's choice
    std::vector<std::string> patterns;
    std::vector<llama_model_tensor_override> overrides;
    if (tensor_types != nullptr && tensor_types[0] != '\0') {
        std::stringstream ss(tensor_types);
        std::string item;
        while (std::getline(ss, item, ',')) {
            if (item.empty()) {
                continue;
            }
            const size_t eq = item.rfind('=');
            const std::string tname = eq == std::string::npos ? std::string() : item.substr(eq + 1);
            ggml_type type = GGML_TYPE_COUNT;
            for (int t = 0; t < GGML_TYPE_COUNT; ++t) {
                const char * n = ggml_type_name((ggml_type) t);
                if (n != nullptr && strcasecmp(n, tname.c_str()) == 0) {
                    type = (ggml_type) t;
                }
            }
            if (eq == std::string::npos || eq == 0 || type == GGML_TYPE_COUNT) {
                pls::set_err(err, err_size, "tensor type override '" + item + "' is not PATTERN=TYPE with a known ggml type");
                return PLS_ERR_INVALID;
            }
            patterns.push_back(item.substr(0, eq));
            overrides.push_back({ nullptr, type });
        }
    }
    for (size_t i = 0; i < overrides.size(); ++i) {
        overrides[i].pattern = patterns[i].c_str();
    }
    if (!overrides.empty()) {
        overrides.push_back({ nullptr, GGML_TYPE_COUNT });
        qp.tt_overrides = overrides.data();
    }
    uint32_t rc = 1;
    progress_sink sink = { progress, user_data };
    try {
        scoped_log_hook hook(progress != nullptr ? on_quantize_log : nullptr, &sink);
        rc = llama_model_quantize(path_in, path_out, &qp);
    } catch (const std::exception & e) {
        pls::set_err(err, err_size, e.what());
        return PLS_ERR_INTERNAL;
    } catch (...) {
        pls::set_err(err, err_size, "quantization failed");
        return PLS_ERR_INTERNAL;
    }
    if (rc != 0) {
        const std::string why = pls::take_last_error();
        pls::set_err(err, err_size, why.empty() ? std::string("quantization failed") : why);
        return PLS_ERR_INTERNAL;
    }
    return PLS_OK;
}

extern "C" int32_t pls_ftype_name(int32_t ftype, char * buf, int32_t buf_size) {
    const char * name = llama_ftype_name((llama_ftype) ftype);
    return pls::copy_out(name ? name : "", buf, buf_size);
}
