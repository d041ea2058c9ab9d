// A sequence's grammar, penalties and logit biases, checked and applied; the log-probabilities of committed tokens.
#include "sampling_ext.h"

#include "llama-grammar.h"  // the GBNF parser, for its message on a grammar that does not parse

#include <algorithm>
#include <cmath>
#include <numeric>
#include <regex>

namespace pls {

namespace {

// a parser message quotes the rest of the grammar from where it failed: keep its start
std::string short_message(const std::string & m) {
    constexpr size_t MAX = 240;
    return m.size() <= MAX ? m : m.substr(0, MAX) + "...";
}

const char * skip_space(const char * pos) {
    while (*pos == ' ' || *pos == '\t' || *pos == '#' || *pos == '\r' || *pos == '\n') {
        if (*pos == '#') {
            while (*pos && *pos != '\r' && *pos != '\n') {
                pos++;
            }
        } else {
            pos++;
        }
    }
    return pos;
}

}  // namespace

void check_grammar(const llama_model * model, const std::string & grammar,
                   const std::vector<common_grammar_trigger> & triggers) {
    if (grammar.find('\0') != std::string::npos) {
        fail(PLS_ERR_INVALID, "grammar: the text holds a NUL character");
    }
    // the parser's own rules, with the message it would only print: every rule parses, every reference is defined
    llama_grammar_parser parser;
    try {
        const char * pos = skip_space(grammar.c_str());
        while (*pos) {
            pos = parser.parse_rule(pos);
        }
        for (const auto & rule : parser.rules) {
            if (rule.empty()) {
                throw std::runtime_error("undefined rule");
            }
            for (const auto & elem : rule) {
                if (elem.type == LLAMA_GRETYPE_RULE_REF && (elem.value >= parser.rules.size() || parser.rules[elem.value].empty())) {
                    for (const auto & kv : parser.symbol_ids) {
                        if (kv.second == elem.value) {
                            throw std::runtime_error("undefined rule identifier '" + kv.first + "'");
                        }
                    }
                    throw std::runtime_error("undefined rule");
                }
            }
        }
    } catch (const std::exception & e) {
        fail(PLS_ERR_INVALID, "grammar does not parse: " + short_message(e.what()));
    }
    if (parser.symbol_ids.find("root") == parser.symbol_ids.end()) {
        fail(PLS_ERR_INVALID, "grammar has no 'root' rule (the rule generation starts from)");
    }
    // what the sampler will do with it, through the call that makes a sequence's sampler: left recursion and the like
    // are refused there (with a logged reason), and a lazy grammar's trigger patterns compiled
    common_params_sampling sp;
    sp.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, grammar);
    sp.grammar_lazy = !triggers.empty();
    sp.grammar_triggers = triggers;
    clear_last_error();
    common_sampler * smpl = nullptr;
    try {
        smpl = common_sampler_init(model, sp);
    } catch (const std::regex_error & e) {
        fail(PLS_ERR_INVALID, "grammar_triggers: a pattern is not a regular expression: " + short_message(e.what()));
    } catch (const std::exception & e) {
        std::string why = take_last_error();
        while (!why.empty() && (why.back() == '\n' || why.back() == ' ')) {
            why.pop_back();
        }
        fail(PLS_ERR_INVALID, "grammar cannot be used: " + short_message(why.empty() ? e.what() : why));
    }
    if (smpl == nullptr) {
        fail(PLS_ERR_INVALID, "grammar cannot be used");
    }
    common_sampler_free(smpl);
}

sampling_spec read_sampling(const llama_model * model, const pls_sampling_params * p) {
    sampling_spec s;
    if (p == nullptr) {
        return s;
    }
    if (!std::isfinite(p->penalty_repeat) || p->penalty_repeat <= 0.0f || !std::isfinite(1.0f / p->penalty_repeat)) {
        fail(PLS_ERR_INVALID, "repeat_penalty=" + std::to_string(p->penalty_repeat) + " must be a finite number > 0 (1: off)");
    }
    if (!std::isfinite(p->penalty_freq)) {
        fail(PLS_ERR_INVALID, "frequency_penalty must be a finite number");
    }
    if (!std::isfinite(p->penalty_present)) {
        fail(PLS_ERR_INVALID, "presence_penalty must be a finite number");
    }
    if (p->penalty_last_n < -1) {
        fail(PLS_ERR_INVALID, "repeat_last_n=" + std::to_string(p->penalty_last_n) + " must be >= -1 (-1: the context)");
    }
    if (p->n_probs < -1 || p->n_probs > PLS_MAX_TOP_LOGPROBS) {
        fail(PLS_ERR_INVALID, "n_probs=" + std::to_string(p->n_probs) + " must be within -1.." +
                              std::to_string(PLS_MAX_TOP_LOGPROBS) + " (-1: no log-probabilities)");
    }
    if (p->n_logit_bias < 0 || (p->n_logit_bias > 0 && p->logit_bias == nullptr)) {
        fail(PLS_ERR_INVALID, "logit_bias: a count >= 0 and the biases it counts");
    }
    const int32_t n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    for (int32_t i = 0; i < p->n_logit_bias; ++i) {
        const pls_logit_bias & b = p->logit_bias[i];
        if (b.token < 0 || b.token >= n_vocab) {
            fail(PLS_ERR_INVALID, "logit_bias: token " + std::to_string(b.token) + " is outside the vocabulary (0.." +
                                  std::to_string(n_vocab - 1) + ")");
        }
        if (std::isnan(b.bias) || b.bias == INFINITY) {
            fail(PLS_ERR_INVALID, "logit_bias: the bias of token " + std::to_string(b.token) +
                                  " must be a finite number (or -inf, a ban)");
        }
        s.logit_bias.push_back({ b.token, b.bias });
    }
    s.penalty_repeat = p->penalty_repeat;
    s.penalty_freq = p->penalty_freq;
    s.penalty_present = p->penalty_present;
    s.penalty_last_n = p->penalty_last_n;
    s.n_probs = p->n_probs;
    if (p->n_triggers < 0 || (p->n_triggers > 0 && p->triggers == nullptr)) {
        fail(PLS_ERR_INVALID, "grammar_triggers: a count >= 0 and the triggers it counts");
    }
    if (p->n_triggers > 0 && (p->grammar == nullptr || p->grammar[0] == '\0')) {
        fail(PLS_ERR_INVALID, "grammar_triggers: triggers start a grammar, and none is given");
    }
    for (int32_t i = 0; i < p->n_triggers; ++i) {
        const pls_grammar_trigger & t = p->triggers[i];
        common_grammar_trigger c;
        switch (t.type) {
            case PLS_TRIGGER_TOKEN:
                if (t.token < 0 || t.token >= n_vocab) {
                    fail(PLS_ERR_INVALID, "grammar_triggers: token " + std::to_string(t.token) +
                                          " is outside the vocabulary (0.." + std::to_string(n_vocab - 1) + ")");
                }
                c.type = COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN;
                c.token = t.token;
                break;
            case PLS_TRIGGER_WORD:
            case PLS_TRIGGER_PATTERN:
            case PLS_TRIGGER_PATTERN_FULL:
                if (t.value == nullptr || t.value[0] == '\0') {
                    fail(PLS_ERR_INVALID, "grammar_triggers: a word or pattern trigger needs its text");
                }
                c.type = t.type == PLS_TRIGGER_WORD      ? COMMON_GRAMMAR_TRIGGER_TYPE_WORD
                         : t.type == PLS_TRIGGER_PATTERN ? COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN
                                                         : COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL;
                c.value = t.value;
                break;
            default:
                fail(PLS_ERR_INVALID, "grammar_triggers: type " + std::to_string(t.type) +
                                      " is none of token, word, pattern, pattern_full");
        }
        s.triggers.push_back(c);
    }
    if (p->grammar != nullptr && p->grammar[0] != '\0') {
        s.grammar = p->grammar;
        check_grammar(model, s.grammar, s.triggers);
    }
    return s;
}

void apply_sampling(const sampling_spec & spec, int32_t n_ctx_seq, common_params_sampling & out) {
    if (!spec.grammar.empty()) {
        out.grammar = common_grammar(COMMON_GRAMMAR_TYPE_USER, spec.grammar);
        out.grammar_lazy = !spec.triggers.empty();
        out.grammar_triggers = spec.triggers;
    }
    out.penalty_repeat = spec.penalty_repeat;
    out.penalty_freq = spec.penalty_freq;
    out.penalty_present = spec.penalty_present;
    out.penalty_last_n = spec.penalty_last_n < 0 ? n_ctx_seq : spec.penalty_last_n;
    out.logit_bias = spec.logit_bias;
}

void token_logprob(const float * logits, int32_t n_vocab, llama_token token, int32_t n_top, pls_token_logprob & out) {
    out = pls_token_logprob{};
    out.token = token;
    float max_l = -INFINITY;
    for (int32_t i = 0; i < n_vocab; ++i) {
        max_l = std::max(max_l, logits[i]);
    }
    double sum = 0.0;
    for (int32_t i = 0; i < n_vocab; ++i) {
        sum += std::exp((double) logits[i] - max_l);
    }
    const double log_z = max_l + std::log(sum);
    out.logprob = (float) ((double) logits[token] - log_z);
    n_top = std::min(std::max(n_top, 0), std::min<int32_t>(PLS_MAX_TOP_LOGPROBS, n_vocab));
    if (n_top == 0) {
        return;
    }
    // the n_top largest logits, ties by token id
    std::vector<int32_t> idx(n_top);
    std::vector<int32_t> heap;
    heap.reserve(n_top + 1);
    auto better = [&](int32_t a, int32_t b) { return logits[a] > logits[b] || (logits[a] == logits[b] && a < b); };
    for (int32_t i = 0; i < n_vocab; ++i) {
        if ((int32_t) heap.size() < n_top) {
            heap.push_back(i);
            std::push_heap(heap.begin(), heap.end(), better);
        } else if (better(i, heap.front())) {
            std::pop_heap(heap.begin(), heap.end(), better);
            heap.back() = i;
            std::push_heap(heap.begin(), heap.end(), better);
        }
    }
    std::sort(heap.begin(), heap.end(), better);
    out.n_top = (int32_t) heap.size();
    for (int32_t k = 0; k < out.n_top; ++k) {
        out.top_token[k] = heap[k];
        out.top_logprob[k] = (float) ((double) logits[heap[k]] - log_z);
    }
}

}  // namespace pls
