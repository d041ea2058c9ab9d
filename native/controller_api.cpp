// The controller alone, behind the C API: what tests and tools drive without a model (choose, observe, reset,
// info, stats), and the conversion of its cost table to and from the header's cost points.
#include "api_guard.h"

#include <cmath>

using namespace pls;

namespace pls {

static_assert((int) PLS_COST_TARGET == (int) COST_TARGET && (int) PLS_COST_DRAFT_FIRST == (int) COST_DRAFT_FIRST &&
              (int) PLS_COST_DRAFT_REST == (int) COST_DRAFT_REST && (int) PLS_COST_DRAFT_CALL == (int) COST_DRAFT_CALL &&
              (int) PLS_COST_OVERHEAD_PLAIN == (int) COST_OVERHEAD_PLAIN &&
              (int) PLS_COST_OVERHEAD_SPEC == (int) COST_OVERHEAD_SPEC && (int) PLS_COST_COLD == (int) COST_COLD &&
              (int) PLS_COST_WHOLE == (int) COST_WHOLE,
              "cost table ids of the header and the controller must agree");

int32_t export_costs(const controller & c, pls_cost_point * out, int32_t capacity) {
    if (capacity < 0 || (capacity > 0 && out == nullptr)) {
        fail(PLS_ERR_INVALID, "export_costs: a buffer of capacity >= 0 is required");
    }
    const std::vector<cost_point> pts = c.export_costs();
    for (int32_t i = 0; i < capacity && i < (int32_t) pts.size(); ++i) {
        out[i] = { pts[i].table, pts[i].bucket, pts[i].n_tokens, pts[i].count, pts[i].ms };
    }
    return (int32_t) pts.size();
}

void import_costs(controller & c, const pls_cost_point * in, int32_t n) {
    if (n < 0 || n > PLS_COST_MAX_POINTS || (n > 0 && in == nullptr)) {
        fail(PLS_ERR_INVALID, "cost points: 0.." + std::to_string(PLS_COST_MAX_POINTS) + " are accepted, " +
                              std::to_string(n) + " given" + (n > 0 && in == nullptr ? " without a buffer" : ""));
    }
    std::vector<cost_point> pts;
    for (int32_t i = 0; i < n; ++i) {
        const pls_cost_point & p = in[i];
        const bool overhead = p.table == PLS_COST_OVERHEAD_PLAIN || p.table == PLS_COST_OVERHEAD_SPEC ||
                              p.table == PLS_COST_COLD;
        const bool ok = p.table >= PLS_COST_TARGET && p.table <= PLS_COST_WHOLE && p.bucket >= 0 &&
                        p.bucket < cost_table::N_BUCKETS && p.count >= 1 && std::isfinite(p.ms) && p.ms >= 0.0 &&
                        (overhead ? p.n_tokens == 0 : (p.n_tokens >= 1 && p.n_tokens <= cost_table::MAX_T));
        if (!ok) {
            fail(PLS_ERR_INVALID, "cost point " + std::to_string(i) + " is not valid (table " + std::to_string(p.table) +
                                  ", bucket " + std::to_string(p.bucket) + ", n_tokens " + std::to_string(p.n_tokens) +
                                  ", count " + std::to_string(p.count) + ", ms " + std::to_string(p.ms) + ")");
        }
        pts.push_back({ p.table, p.bucket, p.n_tokens, p.count, p.ms });
    }
    c.import_costs(pts);
}

}  // namespace pls

struct pls_controller {
    std::unique_ptr<pls::controller> c;
};

extern "C" int32_t pls_controller_new(const pls_controller_params * p, pls_controller ** out, char * err, size_t err_size) {
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        if (p == nullptr || out == nullptr) {
            fail(PLS_ERR_INVALID, "controller parameters are required");
        }
        if (p->n_max < 0 || p->n_max > PLS_MAX_DRAFT || p->n_streams < 1 || p->n_streams > PLS_MAX_STREAMS ||
            p->drafter_kind < PLS_DRAFTER_MODEL || p->drafter_kind > PLS_DRAFTER_NGRAM) {
            fail(PLS_ERR_INVALID, "controller: n_max within 0..64, n_streams within 1..64 and a drafter kind are required");
        }
        controller_params cp;
        cp.n_max = p->n_max;
        cp.n_streams = p->n_streams;
        cp.kind = (drafter_kind) p->drafter_kind;
        cp.adaptive = p->adaptive != 0;
        cp.seed = p->seed;
        if (p->kv_window != 0 && !pls::valid_kv_window(p->kv_window)) {
            fail(PLS_ERR_INVALID, "controller: kv_window must be 0 (256) or a power of two from 256 to 65536");
        }
        cp.kv_window = p->kv_window != 0 ? p->kv_window : 256;
        auto c = std::make_unique<pls_controller>();
        c->c = std::make_unique<pls::controller>(cp);
        *out = c.release();
        return PLS_OK;
    });
}

extern "C" void pls_controller_free(pls_controller * c) { delete c; }

extern "C" int32_t pls_controller_choose(pls_controller * c, const int32_t * caps, const int32_t * depth, const int32_t * active,
                                         const int32_t * pending, const int32_t * free_len, int32_t * k_out) {
    if (c == nullptr || caps == nullptr || depth == nullptr || active == nullptr || k_out == nullptr) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t {
        const int32_t n = c->c->params().n_streams;
        std::vector<int32_t> cap(caps, caps + n), dep(depth, depth + n), act(active, active + n), pend(n, 0), fr(n, 0), k;
        if (pending) {
            pend.assign(pending, pending + n);
        }
        if (free_len) {
            fr.assign(free_len, free_len + n);
        }
        c->c->choose(cap, dep, act, pend, k, fr);
        std::copy(k.begin(), k.end(), k_out);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_observe(pls_controller * c, const pls_step_observation * o) {
    if (c == nullptr || o == nullptr || o->k == nullptr || o->n_drafted == nullptr || o->n_accepted == nullptr ||
        o->depth == nullptr || o->active == nullptr || o->n_streams != c->c->params().n_streams) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t {
        const int32_t n = o->n_streams;
        step_obs s;
        s.k.assign(o->k, o->k + n);
        s.n_drafted.assign(o->n_drafted, o->n_drafted + n);
        s.n_accepted.assign(o->n_accepted, o->n_accepted + n);
        if (o->n_catchup) {
            s.n_catchup.assign(o->n_catchup, o->n_catchup + n);
        } else {
            s.n_catchup.assign(n, 0);
        }
        s.depth.assign(o->depth, o->depth + n);
        s.active.assign(o->active, o->active + n);
        if (o->source) {
            s.source.assign(o->source, o->source + n);
        } else {
            s.source.assign(n, 0);
        }
        s.t_draft_first_ms = o->t_draft_first_ms;
        s.t_draft_rest_ms = o->t_draft_rest_ms;
        s.n_draft_iters = o->n_draft_iters;
        s.t_draft_call_ms = o->t_draft_call_ms;
        s.t_target_ms = o->t_target_ms;
        s.t_step_ms = o->t_step_ms;
        c->c->observe(s);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_reset_stream(pls_controller * c, int32_t stream) {
    if (c == nullptr || stream < 0 || stream >= c->c->params().n_streams) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t {
        c->c->reset_stream(stream);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_info(const pls_controller * c, pls_adaptive_info * out) {
    if (c == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t {
        fill_adaptive_info(*c->c, *out);
        return PLS_OK;
    });
}

extern "C" int32_t pls_controller_stats(const pls_controller * c, pls_stats * out) {
    if (c == nullptr || out == nullptr) {
        return PLS_ERR_INVALID;
    }
    memset(out, 0, sizeof(*out));
    const controller_counters & k = c->c->counters();
    for (size_t i = 0; i < k.k_hist.size() && i < 65; ++i) {
        out->k_hist[i] = k.k_hist[i];
    }
    out->n_probes = k.n_probes;
    out->n_guard = k.n_guard;
    out->est_plain_ms = k.est_plain_ms;
    return PLS_OK;
}

extern "C" int32_t pls_controller_export_costs(const pls_controller * c, pls_cost_point * out, int32_t capacity) {
    if (c == nullptr) {
        return PLS_ERR_INVALID;
    }
    return guarded(nullptr, 0, PLS_ERR_INTERNAL, [&]() -> int32_t { return export_costs(*c->c, out, capacity); });
}

extern "C" int32_t pls_controller_import_costs(pls_controller * c, const pls_cost_point * in, int32_t n, char * err,
                                               size_t err_size) {
    if (c == nullptr) {
        set_err(err, err_size, "no controller given");
        return PLS_ERR_INVALID;
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, [&]() -> int32_t {
        import_costs(*c->c, in, n);
        return PLS_OK;
    });
}
