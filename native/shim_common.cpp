#include "shim_common.h"

#include "common.h"
#include "log.h"

#include <atomic>
#include <mutex>
#include <sstream>
#include <stdexcept>

namespace {

std::atomic<int> g_log_level{0};  // errors only; -v raises it
std::atomic<int64_t> g_graph_captures{0};
std::atomic<int64_t> g_graph_resets{0};
thread_local std::string t_last_error;
thread_local pls::thread_log_hook t_log_hook = nullptr;
thread_local void * t_log_hook_user = nullptr;

// our 0..3 scale onto libllama-common's verbosity threshold
int common_verbosity(int level) {
    static const int map[] = { LOG_LEVEL_ERROR, LOG_LEVEL_WARN, LOG_LEVEL_INFO, LOG_LEVEL_DEBUG };
    return map[level < 0 ? 0 : (level > 3 ? 3 : level)];
}

void log_callback(ggml_log_level level, const char * text, void * /*user_data*/) {
    if (t_log_hook != nullptr) {
        t_log_hook(t_log_hook_user, level, text);
    }
    if (level == GGML_LOG_LEVEL_ERROR) {
        // keep the message so a failed call can say why, not only that it failed
        std::string msg(text);
        while (!msg.empty() && (msg.back() == '\n' || msg.back() == ' ')) {
            msg.pop_back();
        }
        if (!msg.empty()) {
            t_last_error = msg;
        }
    }
    if (level == GGML_LOG_LEVEL_DEBUG && strstr(text, "CUDA graph warmup") != nullptr) {
        // ggml-cuda/hip: "warmup complete" precedes a capture, "warmup reset" drops a graph for another shape
        if (strstr(text, "complete") != nullptr) {
            g_graph_captures.fetch_add(1, std::memory_order_relaxed);
        } else if (strstr(text, "reset") != nullptr) {
            g_graph_resets.fetch_add(1, std::memory_order_relaxed);
        }
    }
    int rank = 0;
    switch (level) {
        case GGML_LOG_LEVEL_ERROR: rank = 0; break;
        case GGML_LOG_LEVEL_WARN:  rank = 1; break;
        case GGML_LOG_LEVEL_INFO:  rank = 2; break;
        case GGML_LOG_LEVEL_CONT:  rank = 2; break;
        default:                   rank = 3; break;
    }
    if (rank <= g_log_level.load()) {
        fputs(text, stderr);
    }
}

}  // namespace

namespace pls {

void ensure_init() {
    static std::once_flag once;
    std::call_once(once, [] {
        llama_log_set(log_callback, nullptr);
        common_log_set_verbosity_thold(common_verbosity(g_log_level.load()));
        llama_backend_init();
    });
}

std::string take_last_error() {
    std::string e;
    e.swap(t_last_error);
    return e;
}

void clear_last_error() { t_last_error.clear(); }

void set_thread_log_hook(thread_log_hook hook, void * user) {
    t_log_hook = hook;
    t_log_hook_user = user;
}

void set_err(char * err, size_t err_size, const std::string & msg) {
    if (err == nullptr || err_size == 0) {
        return;
    }
    snprintf(err, err_size, "%s", msg.c_str());
}

int64_t graph_captures() { return g_graph_captures.load(std::memory_order_relaxed); }
int64_t graph_resets() { return g_graph_resets.load(std::memory_order_relaxed); }

void model_retain(pls_model * m) {
    if (m) {
        m->refs.fetch_add(1);
    }
}

void model_release(pls_model * m) {
    if (m && m->refs.fetch_sub(1) == 1) {
        llama_model_free(m->model);
        delete m;
    }
}

int32_t guarded(char * err, size_t err_size, int32_t fallback, const std::function<int32_t()> & fn) {
    try {
        return fn();
    } catch (const status_error & e) {
        set_err(err, err_size, e.what());
        return e.code;
    } catch (const std::length_error & e) {
        set_err(err, err_size, e.what());
        return PLS_ERR_CONTEXT;
    } catch (const std::invalid_argument & e) {
        set_err(err, err_size, e.what());
        return PLS_ERR_INVALID;
    } catch (const std::bad_alloc &) {
        set_err(err, err_size, "out of memory");
        return PLS_ERR_INTERNAL;
    } catch (const std::exception & e) {
        const std::string why = take_last_error();
        set_err(err, err_size, std::string(e.what()) + (why.empty() || why == e.what() ? "" : " (" + why + ")"));
        return fallback;
    } catch (...) {
        set_err(err, err_size, "unexpected failure in the native library");
        return PLS_ERR_INTERNAL;
    }
}

int32_t copy_out(const std::string & s, char * buf, int32_t buf_size) {
    const int32_t n = (int32_t) s.size();
    if (buf == nullptr || buf_size <= n) {
        return -(n + 1);
    }
    memcpy(buf, s.data(), s.size());
    buf[n] = '\0';
    return n;
}

std::string device_name(ggml_backend_dev_t dev) {
    return dev ? ggml_backend_dev_name(dev) : "CPU";
}

std::vector<ggml_backend_dev_t> parse_devices(const char * spec, bool * cpu_only) {
    std::vector<ggml_backend_dev_t> out;
    *cpu_only = false;
    if (spec == nullptr || spec[0] == '\0') {
        return out;
    }
    std::string s(spec);
    if (s == "none") {
        *cpu_only = true;
        return out;
    }
    std::stringstream ss(s);
    std::string name;
    while (std::getline(ss, name, ',')) {
        ggml_backend_dev_t dev = ggml_backend_dev_by_name(name.c_str());
        if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            std::string known;
            for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
                ggml_backend_dev_t d = ggml_backend_dev_get(i);
                if (ggml_backend_dev_type(d) != GGML_BACKEND_DEVICE_TYPE_CPU) {
                    known += (known.empty() ? "" : ", ") + std::string(ggml_backend_dev_name(d));
                }
            }
            fail(PLS_ERR_PLACEMENT, "unknown device '" + name + "' (devices here: " +
                                        (known.empty() ? std::string("none, CPU only") : known) + ")");
        }
        out.push_back(dev);
    }
    return out;
}

std::string json_escape(const std::string & s) {
    std::string o;
    for (char c : s) {
        if (c == '"' || c == '\\') {
            o += '\\';
            o += c;
        } else if ((unsigned char) c < 0x20) {
            char b[8];
            snprintf(b, sizeof(b), "\\u%04x", c);
            o += b;
        } else {
            o += c;
        }
    }
    return o;
}

}  // namespace pls

extern "C" void pls_set_log_level(int32_t level) {
    g_log_level.store(level);
    try {
        common_log_set_verbosity_thold(common_verbosity(level));
    } catch (...) {
    }
}

extern "C" int32_t pls_abi_version(void) { return PLS_ABI_VERSION; }
