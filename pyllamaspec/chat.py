"""Chat requests with tools: what the model's template makes of them (a ChatPlan: the prompt, how to read the reply
back, and the grammar that constrains tool calls), and the reply read back into an assistant message with its
tool calls, as llama-server renders and parses them (upstream's common/chat through the native layer).

Model.apply_chat() makes a plan; ChatPlan.parse() reads a reply (whole, or partial while it streams). A plan
holds plain data: it may be used from any thread, and outlives the model."""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from . import _native
from .errors import ChatTemplateError, ConfigError

TOOL_CHOICES = ("auto", "none", "required")


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the function's name, its arguments (JSON text, as OpenAI sends them) and the id
    the template gave it (empty when it gives none)."""

    name: str
    arguments: str
    id: str = ""


@dataclass(frozen=True)
class ChatReply:
    """An assistant reply read back: its text and the tool calls it made."""

    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning_content: str = ""


@dataclass(frozen=True)
class GrammarTrigger:
    """Where a lazy grammar starts to apply: a word, a token, or a regex (pattern: anywhere; pattern_full: the
    whole output)."""

    type: str
    value: str
    token: int = -1


@dataclass(frozen=True)
class ChatPlan:
    """What a chat template makes of a request. `prompt` is the text to generate from; `format`, `parser` and
    `generation_prompt` read the reply back (parse()). `grammar` (GBNF, lazy when `grammar_lazy`: it applies
    from a trigger on) constrains tool calls where the template's format has one; `preserved_tokens` are the
    special tokens the reply's markup uses, `additional_stops` stop strings the format adds."""

    prompt: str
    format: int
    format_name: str
    parser: str = field(repr=False)
    generation_prompt: str = ""
    grammar: str = field(default="", repr=False)
    grammar_lazy: bool = False
    grammar_triggers: tuple[GrammarTrigger, ...] = ()
    preserved_tokens: tuple[str, ...] = ()
    additional_stops: tuple[str, ...] = ()
    supports_thinking: bool = False
    caps: dict = field(default_factory=dict, repr=False)
    tools: bool = False                 # the request carried tools and a tool_choice other than none

    @classmethod
    def from_json(cls, text: str, tools: bool) -> "ChatPlan":
        d = json.loads(text)
        return cls(prompt=d["prompt"], format=int(d["format"]), format_name=d["format_name"], parser=d["parser"],
                   generation_prompt=d["generation_prompt"], grammar=d["grammar"],
                   grammar_lazy=bool(d["grammar_lazy"]),
                   grammar_triggers=tuple(GrammarTrigger(t["type"], t["value"], int(t["token"]))
                                          for t in d["grammar_triggers"]),
                   preserved_tokens=tuple(d["preserved_tokens"]), additional_stops=tuple(d["additional_stops"]),
                   supports_thinking=bool(d["supports_thinking"]), caps=dict(d["caps"]), tools=tools)

    def parse(self, text: str, partial: bool = False) -> ChatReply:
        """The reply `text` (the whole of it, or what has arrived when `partial`) as content and tool calls.
        Raises ChatTemplateError when the text does not match the format (a partial text that cannot be read yet
        raises too: wait for more)."""
        if not isinstance(text, str):
            raise ConfigError("the reply must be text")
        ffi, lib = _native.load()
        syntax = json.dumps({"format": self.format, "parser": self.parser,
                             "generation_prompt": self.generation_prompt, "parse_tool_calls": self.tools})
        c_syntax = ffi.new("char[]", syntax.encode("utf-8"))
        data = text.encode("utf-8", "replace")
        c_text = ffi.new("char[]", data)
        n_out = ffi.new("int32_t *")
        err = _native.ErrorBuffer(ffi)
        cap = 2 * len(data) + 4096
        for _ in range(3):
            buf = ffi.new("char[]", cap)
            rc = lib.pls_chat_parse(c_syntax, c_text, len(data), int(partial), buf, cap, n_out, err.buf, err.SIZE)
            _native.check(rc, err, ChatTemplateError)
            if n_out[0] < cap:
                return _reply(json.loads(bytes(ffi.buffer(buf, n_out[0])).decode("utf-8", "replace")))
            cap = n_out[0] + 1
        raise ChatTemplateError("reading the reply failed: its result kept growing")


def _reply(msg: dict) -> ChatReply:
    content = msg.get("content") or ""
    if isinstance(content, list):
        content = "\n".join(p.get("text", "") for p in content)
    calls = tuple(ToolCall(tc["function"]["name"], tc["function"]["arguments"], tc.get("id", ""))
                  for tc in msg.get("tool_calls") or ())
    return ChatReply(content, calls, msg.get("reasoning_content") or "")


def chat_request_json(messages: list, tools: list | None, tool_choice: str, parallel_tool_calls: bool,
                      add_generation_prompt: bool, enable_thinking: bool | None) -> str:
    """The request pls_chat_apply reads (messages and tools in OpenAI's shapes)."""
    if tool_choice not in TOOL_CHOICES:
        raise ConfigError(f"tool_choice must be one of {', '.join(TOOL_CHOICES)}, not {tool_choice!r}")
    req = {"messages": messages, "tools": tools or None, "tool_choice": tool_choice,
           "parallel_tool_calls": bool(parallel_tool_calls), "add_generation_prompt": bool(add_generation_prompt)}
    if enable_thinking is not None:
        req["enable_thinking"] = bool(enable_thinking)
    try:
        return json.dumps(req, allow_nan=False)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"the messages or tools are not JSON data: {e}") from None
