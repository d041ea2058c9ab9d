"""What the clients send: request bodies, validated strictly. A per-sequence setting is held to the limits of
pyllamaspec.config.SEQUENCE_LIMITS (the API's and the command line's); the answers are responses.py's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config import GRAMMAR_TRIGGER_TYPES, INT32_MAX, MAX_STREAMS, SEQUENCE_LIMITS


def _limits(name: str) -> dict:
    _integer, lo, hi, _hint = SEQUENCE_LIMITS[name]
    return {"ge": lo, "le": hi}


class _Strict(BaseModel):
    # strict: "10" is not an int and 1 is not a bool; unknown fields are ignored
    model_config = ConfigDict(strict=True, populate_by_name=True, extra="ignore")


MAX_STOP_STRINGS = 16     # OpenAI takes 4; llama-server any number
Probability = Annotated[float, Field(**_limits("top_p"), allow_inf_nan=False)]
DraftLength = Annotated[int, Field(**_limits("n_max"))]


class SpeculativeParams(_Strict):
    """Per-request draft settings, as llama-server accepts them (also as top-level "speculative.n_max" etc.)."""

    n_max: DraftLength | None = None
    n_min: Annotated[int, Field(**_limits("n_min"))] | None = None
    p_min: Annotated[float, Field(**_limits("p_min"), allow_inf_nan=False)] | None = None


class StreamOptions(_Strict):
    include_usage: bool = False


# -- constrained output and sampling beyond temperature (OpenAI's and llama-server's fields) --------------------

class JSONSchemaFormat(_Strict):
    """OpenAI's response_format.json_schema: the schema and its name (strict or not, the output follows it)."""

    name: str | None = None
    description: str | None = None
    schema_: dict | bool | None = Field(None, alias="schema")
    strict: bool | None = None


class ResponseFormat(_Strict):
    """OpenAI's response_format; llama-server also takes a schema beside json_object."""

    type: Literal["text", "json_object", "json_schema"]
    json_schema: JSONSchemaFormat | None = None
    schema_: dict | bool | None = Field(None, alias="schema")


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
# OpenAI: -100 bans a token, 100 makes it the only choice; llama-server: false bans it
BiasValue = Annotated[float, Field(ge=-100.0, le=100.0, allow_inf_nan=False)] | bool
BAN = -100.0


class GrammarTriggerField(_Strict):
    """llama-server's grammar trigger: type 0 token, 1 word, 2 pattern, 3 pattern_full (or those names)."""

    type: Annotated[int, Field(ge=0, le=len(GRAMMAR_TRIGGER_TYPES) - 1)] | Literal[GRAMMAR_TRIGGER_TYPES]
    value: str = ""
    token: int = -1

    def triple(self) -> tuple[str, str, int]:
        kind = self.type if isinstance(self.type, str) else GRAMMAR_TRIGGER_TYPES[self.type]
        return kind, self.value, self.token


# llama-server's sampler names (and the letters of its samplers string), as upstream's common sampling reads them
_SAMPLERS = ("penalties", "dry", "top_n_sigma", "top_k", "typ_p", "top_p", "min_p", "xtc", "temperature", "infill",
             "adaptive_p")
SAMPLER_NAMES = {**{form: name for name in _SAMPLERS for form in (name, name.replace("_", "-"), name.replace("_", ""))},
                 "nucleus": "top_p", "temp": "temperature", "typ": "typ_p"}
SAMPLER_LETTERS = {"e": "penalties", "d": "dry", "s": "top_n_sigma", "k": "top_k", "y": "typ_p", "p": "top_p",
                   "m": "min_p", "x": "xtc", "t": "temperature", "i": "infill", "a": "adaptive_p"}
# the samplers that act here, in the order this server runs them (upstream's default chain; the others are off)
SAMPLER_CHAIN = ("penalties", "top_k", "top_p", "min_p", "temperature")


class SamplingFields(_Strict):
    """A grammar or a JSON schema the output follows, the repetition penalties and the logit biases."""

    # llama-server's lazy grammar: the text before the first trigger is free, the grammar holds from it
    grammar_lazy: bool = False
    grammar_triggers: list[GrammarTriggerField] | None = None
    # llama-server's sampler order: taken where it runs the samplers that act here in this server's order
    samplers: str | list[str] | None = None

    @field_validator("samplers")
    @classmethod
    def _sampler_order(cls, v):
        if v is None:
            return v
        names = [SAMPLER_LETTERS.get(c) for c in v] if isinstance(v, str) else [SAMPLER_NAMES.get(n) for n in v]
        items = list(v)
        for item, name in zip(items, names):
            if name is None:
                raise ValueError(f"samplers: {item!r} is not a sampler llama-server knows")
            if name in ("infill", "adaptive_p"):
                raise ValueError(f"samplers: this server does not run {name}")
        acting = [n for n in names if n in SAMPLER_CHAIN]
        want = [n for n in SAMPLER_CHAIN if n != "penalties" or "penalties" in acting]
        if acting != want:
            raise ValueError(f"samplers: this server runs {', '.join(SAMPLER_CHAIN)} in that order (the others off); "
                             f"the request orders {', '.join(acting) or 'none of them'}")
        return names

    response_format: ResponseFormat | None = None
    grammar: str | None = None
    json_schema: dict | bool | None = None
    frequency_penalty: FiniteFloat | None = None
    presence_penalty: FiniteFloat | None = None
    repeat_penalty: Annotated[float, Field(gt=0.0, allow_inf_nan=False)] | None = None
    repeat_last_n: Annotated[int, Field(**_limits("repeat_last_n"))] | None = None
    # {"token id": bias} (OpenAI) or [[token id, bias], ...] (llama-server)
    logit_bias: dict[str, BiasValue] | list[Annotated[list[int | float | bool | str], Field(min_length=2, max_length=2)]] | None = None

    def shape_source(self) -> str | None:
        """The request field that holds the output's grammar or schema (what an error about it names)."""
        given = [name for name in ("response_format", "grammar", "json_schema")
                 if getattr(self, name) is not None and not (name == "response_format" and self.response_format.type == "text")]
        return given[0] if given else None

    def sampling_settings(self) -> dict:
        """The SequenceParams settings of these fields. ValueError (param, message) names a field it refuses."""
        out: dict = {}
        sources = [n for n in ("response_format", "grammar", "json_schema")
                   if getattr(self, n) is not None and not (n == "response_format" and self.response_format.type == "text")]
        if len(sources) > 1:
            raise ValueError(sources[1], f"{' and '.join(sources)} each set the output's format: give one")
        rf = self.response_format
        if rf is not None and rf.type == "json_object":
            out["json_schema"] = rf.schema_ if rf.schema_ is not None else {"type": "object"}
        elif rf is not None and rf.type == "json_schema":
            schema = rf.json_schema.schema_ if rf.json_schema is not None else None
            if schema is None:
                schema = rf.schema_
            if schema is None:
                raise ValueError("response_format", "response_format of type json_schema needs json_schema.schema")
            out["json_schema"] = schema
        if self.grammar is not None:
            out["grammar"] = self.grammar
        if self.json_schema is not None:
            out["json_schema"] = self.json_schema
        if self.grammar_lazy:
            if not sources:
                raise ValueError("grammar_lazy", "grammar_lazy needs a grammar (grammar, json_schema or response_format)")
            if not self.grammar_triggers:
                raise ValueError("grammar_triggers", "grammar_lazy needs grammar_triggers: where the grammar starts")
            out["grammar_triggers"] = [t.triple() for t in self.grammar_triggers]
        elif self.grammar_triggers:
            raise ValueError("grammar_triggers", "grammar_triggers start a lazy grammar: set grammar_lazy: true")
        for name in ("frequency_penalty", "presence_penalty", "repeat_penalty", "repeat_last_n"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        penalised = (self.frequency_penalty or 0.0) != 0.0 or (self.presence_penalty or 0.0) != 0.0 or \
            (self.repeat_penalty is not None and self.repeat_penalty != 1.0)
        if self.samplers is not None and penalised and "penalties" not in self.samplers:
            raise ValueError("samplers", "samplers leaves penalties out, and the request sets a penalty: list "
                                         "penalties first (or drop the penalty)")
        if self.logit_bias is not None:
            pairs = self.logit_bias.items() if isinstance(self.logit_bias, dict) else self.logit_bias
            bias = {}
            for key, value in pairs:
                try:
                    token = int(key) if isinstance(key, str) else key
                except ValueError:
                    raise ValueError("logit_bias", f"logit_bias: {key!r} is not a token id") from None
                if isinstance(token, (str, bool, float)) or not 0 <= token <= INT32_MAX:
                    raise ValueError("logit_bias", f"logit_bias: {key!r} is not a token id")
                if isinstance(value, str) or (not isinstance(value, bool) and not -100.0 <= value <= 100.0):
                    raise ValueError("logit_bias", f"logit_bias: the bias of token {token} must be within -100..100 "
                                                   f"(-100 or false bans it)")
                if value is False or (value is not True and value <= BAN):
                    bias[token] = float("-inf")
                elif value is True:
                    raise ValueError("logit_bias", f"logit_bias: token {token}: true is not a bias (false bans)")
                else:
                    bias[token] = float(value)
            out["logit_bias"] = bias
        return out


TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


# -- the other fields of llama-server's and OpenAI's requests ----------------------------------------------------
# A request's top-level field that is none of the declared ones is looked up here: taken where its value changes
# nothing on this server (with why), a 400 naming it where it would (with what to do instead). A field in neither
# place is a 400 too (`serve --ignore-unknown-fields` takes it, logged), as OpenAI answers an argument it does not
# know: a misspelt setting is never dropped unnoticed.

def _anything(_v) -> bool:
    return True


def _is(*values):
    return lambda v: any(v is x or (type(v) is type(x) and v == x) for x in values)


def _number_where(pred):
    return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and pred(v)


def _off(what: str, neutral: str) -> str:
    return f"this server does not run {what}; leave it out (or at {neutral}, which keeps it off)"


def _int_at_most(n: int):
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and v <= n


def _empty(v) -> bool:
    return v == [] or v == {} or v == ""


# name: (takes(value), the reason a taken value changes nothing, the message of a refused one); null is always taken
# (left at its default, as llama-server reads it)
OTHER_FIELDS: dict[str, tuple] = {
    # llama-server's samplers this server does not run, taken at the value that keeps them off (a client's defaults:
    # llama.cpp's web UI sends them all)
    "mirostat": (_number_where(lambda v: v == 0), "off", _off("mirostat sampling", "0")),
    "typical_p": (_number_where(lambda v: v >= 1.0), "off", _off("locally typical sampling", "1")),
    "typ_p": (_number_where(lambda v: v >= 1.0), "off (the web UI's name for typical_p)",
              _off("locally typical sampling", "1")),
    "dynatemp_range": (_number_where(lambda v: v == 0.0), "off", _off("dynamic temperature", "0")),
    "xtc_probability": (_number_where(lambda v: v == 0.0), "off", _off("XTC sampling", "0")),
    "top_n_sigma": (_number_where(lambda v: v <= 0.0), "off", _off("top-n-sigma sampling", "-1")),
    "dry_multiplier": (_number_where(lambda v: v == 0.0), "off", _off("DRY repetition penalties", "0")),
    # llama-server's per-token probabilities (this server returns OpenAI's logprobs) and its ignore_eos
    "n_probs": (_number_where(lambda v: v == 0), "none asked for",
                "ask for log-probabilities with logprobs (and top_logprobs)"),
    "ignore_eos": (_is(False), "the end of generation ends it",
                   "this server always stops at an end-of-generation token (pyllamaspec generate --ignore-eos does not)"),
    # OpenAI's bookkeeping
    "user": (_anything, "an end-user id for the provider's records", ""),
    "metadata": (_anything, "tags for the provider's records", ""),
    "store": (_anything, "whether the provider stores the exchange", ""),
    "service_tier": (_anything, "the provider's processing tier", ""),
    "modalities": (lambda v: v == ["text"], "text is the only output",
                   "this server answers in text only: modalities [\"text\"]"),
    "audio": (_empty, "", "this server has no audio output"),
    "prediction": (_empty, "", "predicted outputs are not taken: speculative decoding drafts by itself"),
    "web_search_options": (_empty, "", "this server has no web search"),
    "functions": (_empty, "", "functions is OpenAI's old form: give tools"),
    "function_call": (_empty, "", "function_call is OpenAI's old form: give tool_choice"),
    "reasoning_effort": (_empty, "", "reasoning_effort is not read by the chat templates here: set "
                                     "chat_template_kwargs.enable_thinking"),
    "best_of": (_is(1), "one candidate per choice", "best_of other than 1 is not supported: use n"),
    # settings of samplers this server keeps off (their switches are refused unless off)
    **{name: (_anything, "a setting of a sampler this server does not run (its switch is off)", "")
       for name in ("xtc_threshold", "dynatemp_exponent", "dry_base", "dry_allowed_length", "dry_penalty_last_n",
                    "dry_sequence_breakers", "mirostat_tau", "mirostat_eta")},
    # the fewest candidates top_p and min_p keep: they keep one anyway
    "min_keep": (_int_at_most(1), "top_p and min_p keep at least one candidate anyway",
                 "min_keep above 1 is not supported"),
    # llama-server's slot and context management
    "cache_prompt": (_is(True), "a slot's cached prefix is always reused",
                     "this server always reuses what a slot holds of the prompt (cache_prompt: true)"),
    "id_slot": (_is(-1), "any free slot", "this server picks the slot (id_slot: -1)"),
    "n_keep": (_anything, "the context is never shifted: a sequence that fills it ends (finish_reason length)", ""),
    "n_discard": (_anything, "the context is never shifted", ""),
    "n_indent": (_int_at_most(0), "", "n_indent is not supported"),
    "t_max_predict_ms": (_int_at_most(0), "", "there is no time limit on generation here: bound it with max_tokens"),
    "t_max_prompt_ms": (_int_at_most(0), "", "there is no time limit on prompt processing here"),
    "return_progress": (_is(False), "", "prompt progress is not streamed"),
    "response_fields": (_empty, "", "response_fields is not supported: the whole answer is sent"),
    "post_sampling_probs": (_is(False), "", "post-sampling probabilities are not returned: logprobs are the "
                                                  "target's before sampling"),
    "reasoning_budget": (_int_at_most(-1), "", "a reasoning budget is not enforced here"),
    "reasoning_budget_tag_start": (_anything, "without a reasoning budget", ""),
    "reasoning_budget_tag_end": (_anything, "without a reasoning budget", ""),
    "reasoning_budget_message": (_anything, "without a reasoning budget", ""),
    "lora": (_empty, "", "this server loads no LoRA adapters"),
    "chat_format": (_empty, "", "the chat format is the model's template's"),
    "preserved_tokens": (_empty, "", "preserved_tokens are the chat template's own here"),
    # chat requests
    "add_generation_prompt": (_is(True), "the assistant's turn is always opened",
                              "add_generation_prompt: false is not supported"),
    "continue_final_message": (_is(False), "", "continuing the final message is not supported"),
    "reasoning_format": (_is("none"), "reasoning stays in the content",
                         "this server returns reasoning in the content (reasoning_format: none)"),
}


def other_field_problem(name: str, value) -> str | None:
    """Why a known field outside the declared ones is refused at this value (None: taken, it changes nothing here).
    KeyError: not a field of llama-server's or OpenAI's requests."""
    takes, _why, refused = OTHER_FIELDS[name]
    if value is None:
        return None  # null: left at its default, as llama-server reads it
    try:
        ok = takes(value)
    except TypeError:
        ok = False
    return None if ok else f"{name}={value!r}: {refused}"


def unknown_field_message(name: str, known) -> str:
    """A field no request of this kind has: its name, and the closest one that is."""
    import difflib
    close = difflib.get_close_matches(name, list(known), n=1, cutoff=0.75)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"'{name}' is not a field of this request{hint}; serve --ignore-unknown-fields takes such fields (logged)"


class GenerationRequest(SamplingFields):
    """What a chat and a text completion request share: the model, the sampling and draft settings, the stop
    strings and how the answer is sent. Other fields are kept for the app to judge (OTHER_FIELDS)."""

    model_config = ConfigDict(strict=True, populate_by_name=True, extra="allow")

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    # llama-server's name for it (-1: no limit), read first as llama-server reads them
    n_predict: Annotated[int, Field(ge=-1, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(**_limits("top_k"))] | None = None
    min_p: Annotated[float, Field(**_limits("min_p"), allow_inf_nan=False)] | None = None
    # -1: a random seed, as llama-server takes it
    seed: Annotated[int, Field(ge=-1, le=_limits("seed")["le"])] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    # choices, each a sequence of its own (at most the server's slots: the app says how many it has)
    n: Annotated[int, Field(ge=1, le=MAX_STREAMS)] = 1
    speculative: SpeculativeParams | None = None
    speculative_n_max: DraftLength | None = Field(None, alias="speculative.n_max")
    speculative_n_min: DraftLength | None = Field(None, alias="speculative.n_min")
    speculative_p_min: Probability | None = Field(None, alias="speculative.p_min")
    return_tokens: bool = False      # llama-server's extension: the generated token ids in each choice
    timings_per_token: bool = False  # llama-server's: the timings so far in every streamed chunk

    @field_validator("n_predict")
    @classmethod
    def _n_predict_generates(cls, v):
        if v == 0:
            raise ValueError("n_predict=0 would generate nothing: give -1 (no limit) or at least 1")
        return v

    @field_validator("stop")
    @classmethod
    def _at_most_16_stops(cls, v):
        if isinstance(v, list) and len(v) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, not {len(v)}")
        return v

    def stop_strings(self) -> list[str]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        return [s for s in stops if s]

    def draft_settings(self) -> dict:
        """n_max / n_min / p_min given by the request (the dotted keys win over the nested object)."""
        nested = self.speculative or SpeculativeParams()
        out = {"n_max": self.speculative_n_max if self.speculative_n_max is not None else nested.n_max,
               "n_min": self.speculative_n_min if self.speculative_n_min is not None else nested.n_min,
               "p_min": self.speculative_p_min if self.speculative_p_min is not None else nested.p_min}
        return {k: v for k, v in out.items() if v is not None}


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class FunctionCall(_Strict):
    name: Annotated[str, Field(min_length=1)]
    arguments: str                      # JSON text, as OpenAI sends it


class ToolCall(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | Annotated[list[TextPart], Field(min_length=1)] | None = None
    tool_calls: list[ToolCall] | None = None     # an assistant's calls, earlier in the conversation
    tool_call_id: str | None = None              # a tool's answer: the call it answers
    name: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content)

    def has_tool_parts(self) -> bool:
        return bool(self.tool_calls) or self.role == "tool"

    def openai(self) -> dict:
        """The message as the template engine reads it (OpenAI's shape; developer is system)."""
        out: dict = {"role": "system" if self.role == "developer" else self.role, "content": self.text()}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id or "", "type": "function",
                                  "function": {"name": c.function.name, "arguments": c.function.arguments}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


class FunctionDef(_Strict):
    name: Annotated[str, Field(min_length=1, max_length=256)]
    description: str | None = None
    parameters: dict | None = None      # a JSON schema
    strict: bool | None = None


class Tool(_Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedFunction(_Strict):
    name: str


class NamedToolChoice(_Strict):
    type: Literal["function"]
    function: NamedFunction


class ChatTemplateKwargs(_Strict):
    """llama-server's chat_template_kwargs. Only enable_thinking reaches the template: any other variable is
    refused rather than silently dropped, since the prompt would not be the one the client asked for."""

    model_config = ConfigDict(strict=True, extra="forbid")
    enable_thinking: bool | None = None


class ChatCompletionRequest(GenerationRequest):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    chat_template_kwargs: ChatTemplateKwargs | None = None
    logprobs: bool = False
    top_logprobs: Annotated[int, Field(**_limits("n_probs"))] | None = None
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def uses_tools(self) -> bool:
        """Tools offered, or tool calls and tool answers in the conversation: the template renders them."""
        return bool(self.tools) or self.tool_choice is not None or any(m.has_tool_parts() for m in self.messages)

    def n_probs(self) -> int | None:
        """Alternatives per token with log-probabilities (None: none asked for)."""
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs", "top_logprobs needs logprobs: true")
        return (self.top_logprobs or 0) if self.logprobs else None


class CompletionRequest(GenerationRequest):
    # a text, token ids, or a list of one of either (one prompt per request)
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    echo: Literal[False] = False
    suffix: None = None
    logprobs: Annotated[int, Field(**_limits("n_probs"))] | None = None

    def n_probs(self) -> int | None:
        return self.logprobs


class EmbeddingRequest(_Strict):
    """OpenAI's /v1/embeddings: a text, texts, token ids (one input) or lists of token ids."""

    input: str | Annotated[list[str], Field(min_length=1)] | Annotated[list[TokenId], Field(min_length=1)] | \
        Annotated[list[list[TokenId]], Field(min_length=1)]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, Field(ge=1)] | None = None   # honoured only as the model's own size

    def inputs(self) -> list[str | list[int]]:
        """Each input: a text or its token ids."""
        x = self.input
        if isinstance(x, str):
            return [x]
        if x and isinstance(x[0], int):
            return [list(x)]
        return list(x)


class TokenizeRequest(_Strict):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Strict):
    tokens: list[TokenId]
