// Memory estimate before anything is loaded: upstream's fit code loads each model and context with
// no_alloc and reports what every device would hold (weights, KV + recurrent ring, compute buffers).
#include "session_plan.h"

#include "fit.h"
#include "llama-ext.h"  // llama_model_n_devices / llama_model_get_device / llama_model_dev_layer
#include "gguf.h"

#include <algorithm>
#include <map>
#include <stdexcept>

namespace {

using device_totals = std::map<std::string, pls_device_memory>;

void add_measured(device_totals & totals, const std::vector<ggml_backend_dev_t> & devs,
                  const common_device_memory_data_vec & data, bool weights) {
    // entries follow devs; the last one is host memory
    for (size_t i = 0; i < data.size(); ++i) {
        const std::string name = i < devs.size() ? pls::device_name(devs[i]) : std::string("Host");
        pls_device_memory & d = totals[name];
        snprintf(d.name, sizeof(d.name), "%s", name.c_str());
        d.free = data[i].free > 0 ? (uint64_t) data[i].free : d.free;
        d.total = data[i].total > 0 ? (uint64_t) data[i].total : d.total;
        d.model += weights ? data[i].model : 0;
        d.context += data[i].context;
        d.compute += data[i].compute;
    }
}

common_device_memory_data_vec measure(const char * path, const llama_model_params & mp, const llama_context_params & cp,
                                      std::vector<ggml_backend_dev_t> & devs) {
    uint32_t ngl = 0, n_ctx_train = 0, n_expert = 0;
    llama_model_params m = mp;
    llama_context_params c = cp;
    return common_get_device_memory_data(path, &m, &c, devs, ngl, n_ctx_train, n_expert, GGML_LOG_LEVEL_ERROR);
}

bool gguf_has_ssm(const char * path) {
    gguf_init_params gp = { /* .no_alloc = */ true, /* .ctx = */ nullptr };
    gguf_context * g = gguf_init_from_file(path, gp);
    if (g == nullptr) {
        return false;  // the measurement below reports what is wrong with the file
    }
    bool has = false;
    const int64_t arch_id = gguf_find_key(g, "general.architecture");
    if (arch_id >= 0 && gguf_get_kv_type(g, arch_id) == GGUF_TYPE_STRING) {
        const std::string arch = gguf_get_val_str(g, arch_id);
        // present and non-zero: savers write these keys for every arch, zero where there is no SSM
        for (const char * key : { ".ssm.state_size", ".ssm.conv_kernel" }) {
            const int64_t id = gguf_find_key(g, (arch + key).c_str());
            has = has || (id >= 0 && gguf_get_kv_type(g, id) == GGUF_TYPE_UINT32 && gguf_get_val_u32(g, id) > 0);
        }
    }
    gguf_free(g);
    return has;
}

struct block_layout {
    int32_t block_size = 0;
    bool sample_from_anchor = true;
};

block_layout gguf_block_layout(const char * path) {
    gguf_init_params gp = { /* .no_alloc = */ true, /* .ctx = */ nullptr };
    gguf_context * g = gguf_init_from_file(path, gp);
    block_layout out;
    if (g == nullptr) {
        return out;
    }
    const int64_t id = gguf_find_key(g, "dflash.block_size");
    out.block_size = id >= 0 ? (int32_t) gguf_get_val_u32(g, id) : 16;  // upstream's default
    const int64_t ia = gguf_find_key(g, "dflash.sample_from_anchor");
    out.sample_from_anchor = ia < 0 || gguf_get_kv_type(g, ia) != GGUF_TYPE_BOOL || gguf_get_val_bool(g, ia);
    gguf_free(g);
    return out;
}

// a model's parameters as the session would load it, for a load that reads the file's layout and allocates nothing
llama_model_params probe_params(const pls::model_load_params & lp) {
    llama_model_params p = lp.mp;
    p.no_alloc = true;
    p.load_mode = LLAMA_LOAD_MODE_NONE;
    return p;
}

// the features a DFlash, DSpark or EAGLE3 drafter reads, kept on the target's layers' devices (patch 0014): per layer
// read, feature_ring_rows(n_ubatch) + 1 rows of n_embd floats per sequence, made after the contexts (so the
// measurement above does not see it). Both models are read as the session would place them, nothing allocated.
void add_feature_ring(device_totals & totals, const char * target_path, const pls::model_load_params & mt,
                      const char * drafter_path, const pls::model_load_params & md, bool eagle3,
                      const llama_context_params & cp) {
    llama_model * dft = llama_model_load_from_file(drafter_path, probe_params(md));
    if (dft == nullptr) {
        return;  // a drafter llama cannot read is refused when the session opens, with its reason
    }
    std::vector<int32_t> ids(llama_model_target_layer_ids(dft),
                             llama_model_target_layer_ids(dft) + llama_model_target_layer_ids_n(dft));
    llama_model_free(dft);
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());  // a layer read twice is kept once
    if (ids.empty()) {
        return;
    }
    llama_model * tgt = llama_model_load_from_file(target_path, probe_params(mt));
    if (tgt == nullptr) {
        return;
    }
    const int32_t n_layer = llama_model_n_layer(tgt);
    // the context's ubatch: the one asked for, bounded by n_batch and (the target is causal) n_ctx, as llama does
    const uint32_t n_ubatch = std::min({ cp.n_ubatch, cp.n_batch, cp.n_ctx > 0 ? cp.n_ctx : cp.n_batch });
    const int32_t rows = pls::feature_ring_rows((int32_t) n_ubatch);
    const uint64_t per_layer = (uint64_t) llama_model_n_embd(tgt) * (rows + 1) * cp.n_seq_max * sizeof(float);
    for (const int32_t il : ids) {
        // EAGLE3 reads the output layer's input as the nextn embeddings, copied to the host as before
        if (il < 0 || il > n_layer || (eagle3 && il == n_layer)) {
            continue;
        }
        ggml_backend_dev_t dev = llama_model_dev_layer(tgt, il);
        const std::string where = dev != nullptr ? pls::device_name(dev) : std::string("Host");
        pls_device_memory & d = totals[where];
        snprintf(d.name, sizeof(d.name), "%s", where.c_str());
        d.context += per_layer;
    }
    llama_model_free(tgt);
}

}  // namespace

extern "C" int32_t pls_estimate_memory(const pls_model_params * target, const pls_model_params * drafter,
                                       const pls_session_params * params, pls_memory_estimate * out,
                                       char * err, size_t err_size) {
    pls::ensure_init();
    pls::clear_last_error();
    if (target == nullptr || params == nullptr || out == nullptr) {
        pls::set_err(err, err_size, "memory estimate: target and session parameters are required");
        return PLS_ERR_INVALID;
    }
    memset(out, 0, sizeof(*out));
    try {
        common_params c = pls::session_common_params(*params);
        const auto & types = c.speculative.types;
        const bool block = pls::has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH) ||
                           pls::has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK);
        const block_layout layout = block && drafter != nullptr ? gguf_block_layout(drafter->path) : block_layout{};
        const int32_t n_max = pls::effective_n_max(types, params->n_max, layout.block_size, layout.sample_from_anchor);
        // recurrent state (and so a ring) only where the GGUF declares an SSM; upstream drops the ring for
        // recurrent archs that keep none
        pls::context_plan plan = pls::plan_contexts(c, *params, n_max, gguf_has_ssm(target->path));

        device_totals totals;
        const pls::model_load_params mt = pls::make_model_params(target);
        std::vector<ggml_backend_dev_t> devs;
        add_measured(totals, devs, measure(target->path, mt.mp, plan.target, devs), true);

        if (plan.has_draft) {
            // an MTP context runs on the target's own weights; anything else is a second model
            const bool mtp_only = drafter == nullptr;
            const pls::model_load_params md = pls::make_model_params(mtp_only ? target : drafter);
            std::vector<ggml_backend_dev_t> ddevs;
            try {
                add_measured(totals, ddevs, measure(mtp_only ? target->path : drafter->path, md.mp, plan.draft, ddevs),
                             !mtp_only);
            } catch (const std::exception &) {
                // a drafter that borrows the target's head needs the target's context to be built at all:
                // count its weights where its first device (or the host) would hold them
                if (mtp_only) {
                    throw;
                }
                llama_model * m = llama_model_load_from_file(drafter->path, probe_params(md));
                if (m == nullptr) {
                    throw std::runtime_error("cannot read the drafter '" + std::string(drafter->path) + "'");
                }
                const std::string where = llama_model_n_devices(m) > 0 && md.mp.n_gpu_layers != 0
                                        ? pls::device_name(llama_model_get_device(m, 0)) : std::string("Host");
                totals[where].model += llama_model_size(m);
                snprintf(totals[where].name, sizeof(totals[where].name), "%s", where.c_str());
                llama_model_free(m);
                out->drafter_approximate = 1;
            }
            if (!mtp_only && !params->host_features && pls::reads_layer_inputs(types)) {
                add_feature_ring(totals, target->path, mt, drafter->path, md,
                                 pls::has_type(types, COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3), plan.target);
            }
        }
        for (const auto & [name, d] : totals) {
            if (out->n_devices < 16) {
                out->devices[out->n_devices++] = d;
            }
        }
    } catch (const std::invalid_argument & e) {
        pls::set_err(err, err_size, std::string("memory estimate: ") + e.what());
        return PLS_ERR_INVALID;
    } catch (const std::exception & e) {
        const std::string why = pls::take_last_error();
        pls::set_err(err, err_size, std::string("memory estimate: ") + e.what() + (why.empty() ? "" : " (" + why + ")"));
        return PLS_ERR_INTERNAL;
    } catch (...) {
        pls::set_err(err, err_size, "memory estimate failed");
        return PLS_ERR_INTERNAL;
    }
    return PLS_OK;
}
