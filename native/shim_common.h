// Internal helpers shared by the shim's translation units.
#pragma once

#include "pyllamaspec.h"

#include "llama.h"

#include <atomic>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#define PLS_ABI_VERSION 16

struct pls_model {
    llama_model * model = nullptr;
    std::string   path;
    std::vector<ggml_backend_dev_t> devices;  // as requested (empty = all)
    int32_t       split_mode = LLAMA_SPLIT_MODE_LAYER;
    std::atomic<int32_t> refs{1};             // the caller's reference plus one per session using it
};

namespace pls {

// An error with the status code the C API reports for it (std::invalid_argument reports PLS_ERR_INVALID,
// std::length_error PLS_ERR_CONTEXT).
struct status_error : std::runtime_error {
    int32_t code;
    status_error(int32_t c, const std::string & m) : std::runtime_error(m), code(c) {}
};
[[noreturn]] inline void fail(int32_t code, const std::string & msg) { throw status_error(code, msg); }

// NaN logits (broken weights, a quantization that overflowed) make every choice arbitrary and every margin
// meaningless: the generation stops with an error instead of producing text nobody can trust
[[noreturn]] inline void fail_nan_logits() {
    fail(PLS_ERR_DECODE, "the target produced NaN logits: its weights (or their quantization) are broken, so "
                         "nothing it generates can be trusted");
}

// one-time backend init and log routing; safe to call from every entry point
void ensure_init();

// the last error-level message llama.cpp logged on this thread (cleared by take_last_error)
std::string take_last_error();
void clear_last_error();

void set_err(char * err, size_t err_size, const std::string & msg);
// an observer of the log lines llama.cpp writes on the calling thread (e.g. the quantizer's per-tensor lines);
// nullptr removes it
using thread_log_hook = void (*)(void * user, ggml_log_level level, const char * text);
void set_thread_log_hook(thread_log_hook hook, void * user);

// process-wide counts of GPU graph captures and invalidations, read from ggml's debug log
int64_t graph_captures();
int64_t graph_resets();

// reference counting of models: a session retains its models, pls_model_free releases the caller's share
void model_retain(pls_model * m);
void model_release(pls_model * m);

// run fn, turning every exception into a status code and a message: no C++ exception crosses the C API
int32_t guarded(char * err, size_t err_size, int32_t fallback, const std::function<int32_t()> & fn);

// copy a std::string into a C buffer; returns length, or -(needed) when it does not fit
int32_t copy_out(const std::string & s, char * buf, int32_t buf_size);

// "CUDA0,CUDA1" -> device handles; "none" -> empty list meaning CPU only; throws on unknown names
std::vector<ggml_backend_dev_t> parse_devices(const char * spec, bool * cpu_only);

std::string device_name(ggml_backend_dev_t dev);

// text as the inside of a JSON string (quotes, backslashes and control characters escaped)
std::string json_escape(const std::string & s);

// remote devices (rpc.cpp): throws status_error(PLS_ERR_REMOTE) naming the host when a remote device the model uses
// has failed; free when no rpc-server was added
void check_remote(const llama_model * model);
// the same for every rpc-server added (a load that failed cannot say which devices it used)
void check_remote_servers();
// the context's queued work finished on its devices (on a GPU a decode call only queues it), then check_remote for
// its model: a wait that belongs to the caller's clock, not to whatever synchronises next
void finish_on_device(llama_context * ctx);

// llama_model_params from our POD params, with the storage they point into (device list, split, overrides)
struct model_load_params {
    struct storage;
    model_load_params();
    llama_model_params mp;
    std::vector<ggml_backend_dev_t> requested_devices;  // empty: all
    std::shared_ptr<storage> own;
};
model_load_params make_model_params(const pls_model_params * p);  // throws std::invalid_argument

}  // namespace pls
