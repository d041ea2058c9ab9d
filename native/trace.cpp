// The per-step trace of a session (pls_take_trace): what each step was and what it cost, recorded by the loop
// (loop.cpp, record_trace) when the session was opened with trace_steps > 0.
#include "session.h"

#include <algorithm>

extern "C" int32_t pls_take_trace(pls_session * s, pls_trace_step * out, int32_t capacity, int64_t * n_dropped) {
    if (n_dropped != nullptr) {
        *n_dropped = 0;
    }
    if (s == nullptr || out == nullptr || capacity <= 0) {
        return 0;
    }
    std::lock_guard<std::mutex> lock(s->stats_mu);
    const int32_t n = std::min<int32_t>(capacity, (int32_t) s->trace.size());
    std::copy(s->trace.begin(), s->trace.begin() + n, out);
    s->trace.erase(s->trace.begin(), s->trace.begin() + n);
    if (n_dropped != nullptr) {
        *n_dropped = s->trace_dropped;
    }
    s->trace_dropped = 0;
    return n;
}
