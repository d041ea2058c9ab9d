// Remote devices: ggml RPC servers added to the process's device list, and the check that a model's remote
// devices are still there. A server that cannot be reached, or that goes away while in use, is a failure of its
// devices (patch 0008 records it per endpoint instead of aborting); every session call on a model that uses such a
// device then fails with PLS_ERR_REMOTE, naming the host.
#include "shim_common.h"

#include "ggml-rpc.h"
#include "llama-ext.h"  // llama_model_n_devices / llama_model_get_device

#include <atomic>
#include <cctype>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

namespace {

std::atomic<bool> g_any_remote{false};
std::mutex g_servers_mutex;
struct server_entry {
    std::string endpoint;
    std::vector<std::string> devices;
};
std::vector<server_entry> g_servers;  // in the order added

using add_server_fn = ggml_backend_reg_t (*)(const char *);
using set_timeout_fn = void (*)(int);
using endpoint_failed_fn = bool (*)(const char *, char *, size_t);

struct rpc_functions {
    add_server_fn add_server = nullptr;
    set_timeout_fn set_timeout = nullptr;
    endpoint_failed_fn endpoint_failed = nullptr;
};

const rpc_functions & rpc() {
    static const rpc_functions f = [] {
        rpc_functions r;
        ggml_backend_reg_t reg = ggml_backend_reg_by_name("RPC");
        if (reg != nullptr) {
            r.add_server = (add_server_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_add_server");
            r.set_timeout = (set_timeout_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_set_connect_timeout");
            r.endpoint_failed = (endpoint_failed_fn) ggml_backend_reg_get_proc_address(reg, "ggml_backend_rpc_endpoint_failed");
        }
        return r;
    }();
    return f;
}

bool is_remote(ggml_backend_dev_t dev) {
    return dev != nullptr && strcmp(ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev)), "RPC") == 0;
}

// "host:port": a host name or IPv4 address (the RPC transport speaks IPv4 only) and a port 1..65535
void check_endpoint(const std::string & e) {
    const size_t colon = e.rfind(':');
    if (colon == std::string::npos || colon == 0 || colon + 1 == e.size()) {
        pls::fail(PLS_ERR_INVALID, "RPC server '" + e + "' is not of the form HOST:PORT (e.g. 127.0.0.1:50052)");
    }
    const std::string host = e.substr(0, colon);
    const std::string port = e.substr(colon + 1);
    for (char ch : host) {
        if (!(std::isalnum((unsigned char) ch) || ch == '.' || ch == '-' || ch == '_')) {
            pls::fail(PLS_ERR_INVALID, "RPC server '" + e + "': '" + host + "' is not a host name or IPv4 address" +
                                       (host.find(':') != std::string::npos || host.find('[') != std::string::npos
                                        ? " (the RPC transport speaks IPv4 only)" : ""));
        }
    }
    if (port.size() > 5 || port.find_first_not_of("0123456789") != std::string::npos || std::stoi(port) < 1 ||
        std::stoi(port) > 65535) {
        pls::fail(PLS_ERR_INVALID, "RPC server '" + e + "': port '" + port + "' is not a number within 1..65535");
    }
}

}  // namespace

namespace pls {

void check_remote(const llama_model * model) {
    if (!g_any_remote.load(std::memory_order_relaxed) || model == nullptr || rpc().endpoint_failed == nullptr) {
        return;
    }
    for (int32_t i = 0; i < llama_model_n_devices(model); ++i) {
        ggml_backend_dev_t dev = llama_model_get_device(model, i);
        if (!is_remote(dev)) {
            continue;
        }
        const char * endpoint = ggml_backend_dev_description(dev);  // the RPC backend describes a device by its endpoint
        char why[512] = {0};
        if (rpc().endpoint_failed(endpoint, why, sizeof(why))) {
            fail(PLS_ERR_REMOTE, std::string("remote device ") + ggml_backend_dev_name(dev) + " (rpc-server " + endpoint +
                                 ") failed: " + why + "; this session is unusable: close it, and its models, and open "
                                 "them again once the host is back");
        }
    }
}

void finish_on_device(llama_context * ctx) {
    llama_synchronize(ctx);
    check_remote(llama_get_model(ctx));
}

void check_remote_servers() {
    if (!g_any_remote.load(std::memory_order_relaxed) || rpc().endpoint_failed == nullptr) {
        return;
    }
    std::lock_guard<std::mutex> lock(g_servers_mutex);
    for (const auto & s : g_servers) {
        char why[512] = {0};
        if (rpc().endpoint_failed(s.endpoint.c_str(), why, sizeof(why))) {
            fail(PLS_ERR_REMOTE, "rpc-server " + s.endpoint + " failed: " + why);
        }
    }
}

}  // namespace pls

extern "C" int32_t pls_rpc_add_servers(const char * endpoints, int32_t timeout_ms, char * err, size_t err_size) {
    pls::ensure_init();
    return pls::guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        if (endpoints == nullptr || endpoints[0] == '\0') {
            pls::fail(PLS_ERR_INVALID, "no RPC server given");
        }
        if (timeout_ms < 1 || timeout_ms > 3600 * 1000) {
            pls::fail(PLS_ERR_INVALID, "RPC connect timeout " + std::to_string(timeout_ms) + " ms must be within 1..3600000");
        }
        const rpc_functions & f = rpc();
        if (f.add_server == nullptr || f.set_timeout == nullptr || f.endpoint_failed == nullptr) {
            pls::fail(PLS_ERR_INTERNAL, "this build has no RPC backend (GGML_RPC)");
        }
        std::vector<std::string> list;
        std::stringstream ss(endpoints);
        std::string item;
        while (std::getline(ss, item, ',')) {
            if (item.empty()) {
                pls::fail(PLS_ERR_INVALID, std::string("RPC server list '") + endpoints + "' has an empty entry");
            }
            check_endpoint(item);
            list.push_back(item);
        }
        std::lock_guard<std::mutex> lock(g_servers_mutex);
        f.set_timeout(timeout_ms);
        for (const std::string & e : list) {
            bool known = false;
            for (const auto & s : g_servers) {
                known = known || s.endpoint == e;
            }
            if (known) {
                continue;
            }
            ggml_backend_reg_t reg = f.add_server(e.c_str());
            if (reg == nullptr || ggml_backend_reg_dev_count(reg) == 0) {
                char why[512] = {0};
                f.endpoint_failed(e.c_str(), why, sizeof(why));
                pls::fail(PLS_ERR_REMOTE, "rpc-server " + e + ": " + (why[0] ? std::string(why) : std::string("it has no devices")));
            }
            server_entry entry{ e, {} };
            for (size_t i = 0; i < ggml_backend_reg_dev_count(reg); ++i) {
                ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, i);
                ggml_backend_device_register(dev);
                entry.devices.push_back(ggml_backend_dev_name(dev));
            }
            g_servers.push_back(entry);
            g_any_remote = true;
        }
        return PLS_OK;
    });
}

extern "C" int32_t pls_rpc_servers_json(char * buf, int32_t buf_size) {
    pls::ensure_init();
    std::ostringstream o;
    o << "[";
    std::lock_guard<std::mutex> lock(g_servers_mutex);
    for (size_t i = 0; i < g_servers.size(); ++i) {
        const auto & s = g_servers[i];
        char why[512] = {0};
        const bool failed = rpc().endpoint_failed != nullptr && rpc().endpoint_failed(s.endpoint.c_str(), why, sizeof(why));
        o << (i ? "," : "") << "{\"endpoint\":\"" << pls::json_escape(s.endpoint) << "\",\"devices\":[";
        for (size_t k = 0; k < s.devices.size(); ++k) {
            o << (k ? "," : "") << "\"" << pls::json_escape(s.devices[k]) << "\"";
        }
        o << "],\"failed\":" << (failed ? "true" : "false") << ",\"error\":\"" << pls::json_escape(why) << "\"}";
    }
    o << "]";
    return pls::copy_out(o.str(), buf, buf_size);
}
