"""What the clients send: request bodies, validated strictly. A per-sequence setting is held to the limits of
pyllamaspec.config.SEQUENCE_LIMITS (the API's and the command line's); the answers are responses.py's."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from ..config import INT32_MAX, SEQUENCE_LIMITS


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


class GenerationRequest(_Strict):
    """What a chat and a text completion request share: the model, the sampling and draft settings, the stop
    strings and how the answer is sent."""

    model: str | None = None
    max_tokens: Annotated[int, Field(ge=1, le=INT32_MAX)] | None = None
    temperature: Annotated[float, Field(ge=0.0, allow_inf_nan=False)] | None = None
    top_p: Probability | None = None
    top_k: Annotated[int, Field(**_limits("top_k"))] | None = None
    min_p: Annotated[float, Field(**_limits("min_p"), allow_inf_nan=False)] | None = None
    # -1: a random seed, as llama-server takes it
    seed: Annotated[int, Field(ge=-1, le=_limits("seed")["le"])] | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1
    speculative: SpeculativeParams | None = None
    speculative_n_max: DraftLength | None = Field(None, alias="speculative.n_max")
    speculative_n_min: DraftLength | None = Field(None, alias="speculative.n_min")
    speculative_p_min: Probability | None = Field(None, alias="speculative.p_min")
    return_tokens: bool = False      # llama-server's extension: the generated token ids in each choice

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
    tools: Annotated[list[Tool], Field(max_length=128)] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None

    def uses_tools(self) -> bool:
        """Tools offered, or tool calls and tool answers in the conversation: the template renders them."""
        return bool(self.tools) or self.tool_choice is not None or any(m.has_tool_parts() for m in self.messages)


TokenId = Annotated[int, Field(ge=0, le=INT32_MAX)]


class CompletionRequest(GenerationRequest):
    # a text, token ids, or a list of one of either (one prompt per request)
    prompt: str | list[TokenId] | list[str] | list[list[TokenId]]
    echo: Literal[False] = False
    suffix: None = None


class TokenizeRequest(_Strict):
    content: str
    add_special: bool = False
    with_pieces: bool = False


class DetokenizeRequest(_Strict):
    tokens: list[TokenId]
