// What this build can do here: backends compiled in and the devices they see.
#include "shim_common.h"

#include <sstream>

extern "C" int32_t pls_system_info_json(char * buf, int32_t buf_size) {
    pls::ensure_init();
    std::ostringstream o;
    o << "{\"registries\":[";
    for (size_t i = 0; i < ggml_backend_reg_count(); ++i) {
        o << (i ? "," : "") << "\"" << pls::json_escape(ggml_backend_reg_name(ggml_backend_reg_get(i))) << "\"";
    }
    o << "],\"devices\":[";
    for (size_t i = 0; i < ggml_backend_dev_count(); ++i) {
        ggml_backend_dev_t d = ggml_backend_dev_get(i);
        size_t free = 0, total = 0;
        ggml_backend_dev_memory(d, &free, &total);
        const char * type = "other";
        switch (ggml_backend_dev_type(d)) {
            case GGML_BACKEND_DEVICE_TYPE_CPU:   type = "cpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_GPU:   type = "gpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_IGPU:  type = "igpu"; break;
            case GGML_BACKEND_DEVICE_TYPE_ACCEL: type = "accel"; break;
            default: break;
        }
        o << (i ? "," : "") << "{\"name\":\"" << pls::json_escape(ggml_backend_dev_name(d)) << "\",\"description\":\""
          << pls::json_escape(ggml_backend_dev_description(d)) << "\",\"type\":\"" << type << "\",\"free_bytes\":" << free
          << ",\"total_bytes\":" << total << "}";
    }
    o << "],\"system_info\":\"" << pls::json_escape(llama_print_system_info()) << "\"}";
    return pls::copy_out(o.str(), buf, buf_size);
}
