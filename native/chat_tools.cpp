// Chat requests with tools: rendering through the model's template and parsing the reply back, as llama-server
// does (upstream's common/chat). Requests and results cross the C boundary as JSON text.
#include "shim_common.h"

#include "common.h"
#include "chat.h"

#include <stdexcept>
#include <string>

namespace {

// The template to use: `tmpl` when given, else the model's own (its default or its tool_use variant). Throws
// status_error when there is none or it does not parse.
std::string chat_template_source(const pls_model * model, const char * tmpl) {
    const bool has_override = tmpl != nullptr && tmpl[0] != '\0';
    const char * own = llama_model_chat_template(model->model, nullptr);
    const char * own_tool_use = llama_model_chat_template(model->model, "tool_use");
    if (!has_override && own == nullptr && own_tool_use == nullptr) {
        pls::fail(PLS_ERR_NO_TEMPLATE, "the model has no chat template");
    }
    const std::string src = has_override ? tmpl : (own != nullptr ? own : own_tool_use);
    try {
        common_chat_template probe(src, "", "");
    } catch (const std::exception & e) {
        pls::fail(PLS_ERR_TEMPLATE, std::string("cannot parse the chat template: ") + e.what());
    } catch (...) {
        pls::fail(PLS_ERR_TEMPLATE, "cannot parse the chat template");
    }
    return has_override ? src : std::string();
}

common_json triggers_json(const std::vector<common_grammar_trigger> & triggers) {
    common_json out = common_json::array();
    for (const auto & t : triggers) {
        const char * type = "word";
        switch (t.type) {
            case COMMON_GRAMMAR_TRIGGER_TYPE_TOKEN:        type = "token"; break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_WORD:         type = "word"; break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN:      type = "pattern"; break;
            case COMMON_GRAMMAR_TRIGGER_TYPE_PATTERN_FULL: type = "pattern_full"; break;
        }
        common_json j = common_json::object();
        j["type"] = type;
        j["value"] = t.value;
        j["token"] = (int) t.token;
        out.push_back(j);
    }
    return out;
}

common_chat_tool_choice tool_choice_from(const common_json & req) {
    const std::string choice = req.value("tool_choice", std::string("auto"));
    if (choice == "auto") {
        return COMMON_CHAT_TOOL_CHOICE_AUTO;
    }
    if (choice == "none") {
        return COMMON_CHAT_TOOL_CHOICE_NONE;
    }
    if (choice == "required") {
        return COMMON_CHAT_TOOL_CHOICE_REQUIRED;
    }
    throw std::invalid_argument("tool_choice must be auto, none or required, not '" + choice + "'");
}

std::string chat_apply(const pls_model * model, const char * tmpl, const char * request_json) {
    const std::string override_src = chat_template_source(model, tmpl);
    common_json req = common_json::parse_no_throw(request_json);
    if (req.is_discarded() || !req.is_object()) {
        throw std::invalid_argument("the chat request is not a JSON object");
    }
    common_chat_templates_inputs inputs;
    std::vector<common_chat_tool> tools;
    try {
        inputs.messages = common_chat_msgs_parse_oaicompat(req.value("messages", common_json::array()));
        if (req.contains("tools") && !req.at("tools").is_null()) {
            tools = common_chat_tools_parse_oaicompat(req.at("tools"));
        }
        inputs.tool_choice = tool_choice_from(req);
        inputs.parallel_tool_calls = req.value("parallel_tool_calls", false);
        inputs.add_generation_prompt = req.value("add_generation_prompt", true);
    } catch (const std::exception & e) {
        throw std::invalid_argument(e.what());
    }
    inputs.tools = tools;
    inputs.use_jinja = true;
    if (req.contains("enable_thinking") && req.at("enable_thinking").is_boolean()) {
        const bool on = req.at("enable_thinking").get<bool>();
        inputs.enable_thinking = on;
        inputs.chat_template_kwargs["enable_thinking"] = on ? "true" : "false";
    }
    // the reasoning is returned in the content, as the plain chat path has always done
    inputs.reasoning_format = COMMON_REASONING_FORMAT_NONE;

    common_chat_templates_ptr tmpls = common_chat_templates_init(model->model, override_src);
    common_chat_params params;
    bool pure_content = false;
    try {
        params = common_chat_templates_apply(tmpls.get(), inputs);
    } catch (const std::bad_alloc &) {
        throw;
    } catch (const std::exception & e) {
        if (!tools.empty()) {
            // tools need the template's parser: without one the request cannot be honoured
            pls::fail(PLS_ERR_TEMPLATE, std::string("the chat template cannot render tools: ") + e.what());
        }
        // the output-parser generation can fail for a template that renders fine: render it as it is
        inputs.force_pure_content = true;
        params = common_chat_templates_apply(tmpls.get(), inputs);
        pure_content = true;
    }
    common_json caps = common_json::object();
    for (const auto & kv : common_chat_templates_get_caps(tmpls.get())) {
        caps[kv.first] = kv.second;
    }
    common_json out = common_json::object();
    out["prompt"] = params.prompt;
    out["format"] = (int) params.format;
    out["format_name"] = common_chat_format_name(params.format);
    out["pure_content"] = pure_content;
    out["grammar"] = params.grammar;
    out["grammar_lazy"] = params.grammar_lazy;
    out["grammar_triggers"] = triggers_json(params.grammar_triggers);
    out["preserved_tokens"] = params.preserved_tokens;
    out["additional_stops"] = params.additional_stops;
    out["generation_prompt"] = params.generation_prompt;
    out["parser"] = params.parser;
    out["supports_thinking"] = params.supports_thinking;
    out["thinking_start_tag"] = params.thinking_start_tag;
    out["thinking_end_tags"] = params.thinking_end_tags;
    out["caps"] = caps;
    return out.dump();
}

std::string chat_parse(const char * syntax_json, const std::string & text, bool is_partial) {
    common_json syntax = common_json::parse_no_throw(syntax_json);
    if (syntax.is_discarded() || !syntax.is_object()) {
        throw std::invalid_argument("the parser syntax is not a JSON object");
    }
    common_chat_parser_params p;
    const int format = syntax.value("format", 0);
    if (format < 0 || format >= COMMON_CHAT_FORMAT_COUNT) {
        throw std::invalid_argument("unknown chat format " + std::to_string(format));
    }
    p.format = (common_chat_format) format;
    p.generation_prompt = syntax.value("generation_prompt", std::string());
    p.parse_tool_calls = syntax.value("parse_tool_calls", true);
    p.reasoning_format = COMMON_REASONING_FORMAT_NONE;
    const std::string parser = syntax.value("parser", std::string());
    if (!parser.empty()) {
        p.parser.load(parser);
    }
    common_chat_msg msg;
    try {
        msg = common_chat_parse(text, is_partial, p);
    } catch (const std::bad_alloc &) {
        throw;
    } catch (const std::exception & e) {
        pls::fail(PLS_ERR_TEMPLATE, e.what());
    }
    return msg.to_json_oaicompat().dump();
}

// Copy `s` out: PLS_OK with its length in *n_out; the text and a NUL in buf when *n_out < buf_size.
int32_t copy_result(const std::string & s, char * buf, int32_t buf_size, int32_t * n_out) {
    if (s.size() >= (size_t) INT32_MAX) {
        pls::fail(PLS_ERR_TEMPLATE, "the result is larger than 2 GiB");
    }
    *n_out = (int32_t) s.size();
    if (buf != nullptr && buf_size > (int32_t) s.size()) {
        memcpy(buf, s.data(), s.size());
        buf[s.size()] = '\0';
    }
    return PLS_OK;
}

}  // namespace

extern "C" int32_t pls_chat_apply(const pls_model * model, const char * tmpl, const char * request_json, char * buf,
                                  int32_t buf_size, int32_t * n_out, char * err, size_t err_size) {
    if (n_out != nullptr) {
        *n_out = 0;
    }
    if (model == nullptr || request_json == nullptr || n_out == nullptr || buf_size < 0) {
        pls::set_err(err, err_size, "invalid arguments: a model, a request and n_out are required");
        return PLS_ERR_INVALID;
    }
    pls::ensure_init();
    return pls::guarded(err, err_size, PLS_ERR_TEMPLATE, [&]() -> int32_t {
        try {
            return copy_result(chat_apply(model, tmpl, request_json), buf, buf_size, n_out);
        } catch (const std::bad_alloc &) {
            pls::fail(PLS_ERR_MEMORY, "out of memory while rendering the chat template");
        }
    });
}

extern "C" int32_t pls_chat_parse(const char * syntax_json, const char * text, int32_t text_len, int32_t is_partial,
                                  char * buf, int32_t buf_size, int32_t * n_out, char * err, size_t err_size) {
    if (n_out != nullptr) {
        *n_out = 0;
    }
    if (syntax_json == nullptr || text == nullptr || text_len < 0 || n_out == nullptr || buf_size < 0) {
        pls::set_err(err, err_size, "invalid arguments: a syntax, a text and n_out are required");
        return PLS_ERR_INVALID;
    }
    pls::ensure_init();
    return pls::guarded(err, err_size, PLS_ERR_TEMPLATE, [&]() -> int32_t {
        try {
            return copy_result(chat_parse(syntax_json, std::string(text, (size_t) text_len), is_partial != 0), buf,
                               buf_size, n_out);
        } catch (const std::bad_alloc &) {
            pls::fail(PLS_ERR_MEMORY, "out of memory while parsing the reply");
        }
    });
}
