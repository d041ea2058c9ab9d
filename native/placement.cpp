// Where a model's placement puts its output layer, before anything is loaded: upstream's loader run without
// allocating (metadata and tensor placement only). The drafter goes where the target's head is (pyllamaspec.placement).
#include "shim_common.h"

#include "llama-ext.h"

extern "C" int32_t pls_plan_head_device(const pls_model_params * params, char * out, int32_t out_size, char * err,
                                        size_t err_size) {
    pls::ensure_init();
    pls::clear_last_error();
    return pls::guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        if (out == nullptr || out_size < 1) {
            pls::fail(PLS_ERR_INVALID, "no output buffer given");
        }
        const pls::model_load_params mp = pls::make_model_params(params);
        llama_model_params probe = mp.mp;
        probe.no_alloc = true;
        probe.load_mode = LLAMA_LOAD_MODE_NONE;
        llama_model * m = llama_model_load_from_file(params->path, probe);
        if (m == nullptr) {
            const std::string why = pls::take_last_error();
            pls::fail(PLS_ERR_LOAD, std::string("cannot read '") + params->path + "'" + (why.empty() ? "" : ": " + why));
        }
        const std::string name = pls::device_name(llama_model_dev_output(m));
        llama_model_free(m);
        return pls::copy_out(name, out, out_size) < 0 ? (pls::fail(PLS_ERR_INVALID, "output buffer too small"), 0) : PLS_OK;
    });
}
