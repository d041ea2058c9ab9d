// What the extern "C" files of sessions and of the controller share: the guard that holds a session for one call,
// the answer to a call without a session, and the cost points of the header converted to the controller's.
#pragma once

#include "loop.h"

namespace pls {

// Holds a session for one call, or refuses with PLS_ERR_BUSY; the holder's thread is recorded so a call from
// inside the session's own callback can be told apart from one of another thread.
struct session_call {
    pls_session & s;
    std::unique_lock<std::mutex> lock;
    explicit session_call(pls_session & s) : s(s), lock(s.mu, std::defer_lock) {
        if (s.owner.load() == std::this_thread::get_id()) {
            fail(PLS_ERR_BUSY, "the session cannot be used from inside its own generation callback");
        }
        if (!lock.try_lock()) {
            fail(PLS_ERR_BUSY, "the session is in use by another thread; one call at a time");
        }
        s.owner.store(std::this_thread::get_id());
    }
    ~session_call() { s.owner.store(std::thread::id()); }
};

inline int32_t no_session(char * err, size_t err_size) {
    set_err(err, err_size, "no session given");
    return PLS_ERR_INVALID;
}

// An entry point on a session that may run beside a call in flight: PLS_ERR_INVALID without a session, every
// exception of body turned into a status code and a message.
template <class Body> int32_t session_entry(pls_session * s, char * err, size_t err_size, Body && body) {
    if (s == nullptr) {
        return no_session(err, err_size);
    }
    return guarded(err, err_size, PLS_ERR_INTERNAL, body);
}

// An entry point that holds the session for its call (one call at a time, PLS_ERR_BUSY otherwise).
template <class Body> int32_t session_guarded(pls_session * s, char * err, size_t err_size, Body && body) {
    return session_entry(s, err, err_size, [&]() -> int32_t {
        session_call call(*s);
        // a session on a remote device that went away is unusable: refused before it touches the device
        check_remote(s->target->model);
        if (s->drafter != nullptr) {
            check_remote(s->drafter->model);
        }
        return body();
    });
}

// A generation's work: when it fails, the generation ends with PLS_FINISH_ERROR before the failure is reported.
template <class Work> auto ending_on_failure(pls_session & s, Work && work) -> decltype(work()) {
    try {
        return work();
    } catch (...) {
        end_generation(s, PLS_FINISH_ERROR);
        throw;
    }
}

// the controller's cost table as the header's cost points, and back (refusing points out of range)
int32_t export_costs(const controller & c, pls_cost_point * out, int32_t capacity);
void import_costs(controller & c, const pls_cost_point * in, int32_t n);

}  // namespace pls
