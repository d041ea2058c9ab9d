// The C API of sampling beyond temperature and truncation: JSON schemas to grammars, grammar checks, a begin's
// sampling, and the log-probabilities of the last step.
#include "api_guard.h"

#include "json-schema-to-grammar.h"

using namespace pls;

extern "C" int32_t pls_json_schema_to_grammar(const char * schema, char * buf, int32_t buf_size, int32_t * n_out,
                                              char * err, size_t err_size) {
    if (n_out != nullptr) {
        *n_out = 0;
    }
    if (schema == nullptr || n_out == nullptr) {
        set_err(err, err_size, "invalid arguments: a schema and n_out are required");
        return PLS_ERR_INVALID;
    }
    ensure_init();
    return guarded(err, err_size, PLS_ERR_INVALID, [&]() -> int32_t {
        common_json parsed;
        try {
            parsed = common_json::parse(schema);
        } catch (const std::exception & e) {
            fail(PLS_ERR_INVALID, std::string("the JSON schema is not valid JSON: ") + e.what());
        }
        std::string grammar;
        try {
            grammar = json_schema_to_grammar(parsed, true);
        } catch (const std::exception & e) {
            std::string why = e.what();
            const std::string lead = "JSON schema conversion failed:\n";
            if (why.compare(0, lead.size(), lead) == 0) {
                why = why.substr(lead.size());
            }
            while (!why.empty() && why.back() == '\n') {
                why.pop_back();
            }
            fail(PLS_ERR_INVALID, "the JSON schema cannot be converted to a grammar: " + why);
        }
        if (grammar.size() >= (size_t) INT32_MAX) {
            fail(PLS_ERR_INVALID, "the JSON schema's grammar is larger than 2 GiB");
        }
        *n_out = (int32_t) grammar.size();
        if (buf != nullptr && buf_size > (int32_t) grammar.size()) {
            memcpy(buf, grammar.data(), grammar.size());
            buf[grammar.size()] = '\0';
        }
        return PLS_OK;
    });
}

extern "C" int32_t pls_grammar_check(const pls_model * model, const char * grammar, char * err, size_t err_size) {
    if (model == nullptr || grammar == nullptr) {
        set_err(err, err_size, "invalid arguments: a model and a grammar are required");
        return PLS_ERR_INVALID;
    }
    ensure_init();
    return guarded(err, err_size, PLS_ERR_INVALID, [&]() -> int32_t {
        check_grammar(model->model, grammar);
        return PLS_OK;
    });
}

extern "C" int32_t pls_session_set_sampling(pls_session * s, const pls_sampling_params * sampling, char * err,
                                            size_t err_size) {
    return session_guarded(s, err, err_size, [&]() -> int32_t {
        s->sampling_begin = read_sampling(s->target->model, sampling);
        return PLS_OK;
    });
}

extern "C" int32_t pls_step_logprobs(pls_session * s, int32_t stream, pls_token_logprob * out, int32_t capacity) {
    char err[8];
    return session_guarded(s, err, sizeof(err), [&]() -> int32_t {
        if (stream < 0 || stream >= (int32_t) s->logprobs_step.size() || capacity < 0 || (capacity > 0 && out == nullptr)) {
            return (stream >= 0 && stream < s->sp.n_parallel && capacity >= 0) ? 0 : PLS_ERR_INVALID;
        }
        const auto & lp = s->logprobs_step[stream];
        const int32_t n = (int32_t) lp.size();
        std::copy(lp.begin(), lp.begin() + std::min(n, capacity), out);
        return n;
    });
}
