"""Tool calls: a request's tools and tool_choice made into what the template renders, and the reply read back
into OpenAI's tool_calls, whole or as the deltas a stream sends (OpenAI's pieces: the first delta of a call
carries its index, id, type and name with empty arguments; the following ones add to its arguments)."""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

from ..chat import ChatPlan, ChatReply
from ..errors import ChatTemplateError
from .responses import APIError
from .schemas import ChatCompletionRequest

log = logging.getLogger("pyllamaspec.server")


@dataclass(frozen=True)
class ToolSettings:
    """What the template is given: the tools offered, auto/none/required, and whether several calls may come
    in one reply."""

    tools: list[dict] | None
    tool_choice: str
    parallel: bool
    function: str | None = None     # the function tool_choice names


def tool_settings(req: ChatCompletionRequest) -> ToolSettings:
    """The request's tools and tool_choice; a tool_choice that cannot be honoured is a 400 naming it. A named
    function offers that function alone and requires a call."""
    tools = [t.model_dump(exclude_none=True) for t in req.tools or ()]
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise APIError(400, f"two tools are named '{dup}': each function needs its own name", param="tools")
    choice = req.tool_choice
    parallel = True if req.parallel_tool_calls is None else req.parallel_tool_calls
    if choice is None:
        return ToolSettings(tools or None, "auto", parallel)
    if isinstance(choice, str):
        if choice == "required" and not tools:
            raise APIError(400, "tool_choice 'required' needs tools to choose from: the request has none",
                           param="tool_choice")
        return ToolSettings(tools or None, choice, parallel)
    name = choice.function.name
    if name not in names:
        offered = ", ".join(f"'{n}'" for n in names) or "none"
        raise APIError(400, f"tool_choice names the function '{name}', which is not among the tools "
                            f"(offered: {offered})", param="tool_choice")
    return ToolSettings([t for t in tools if t["function"]["name"] == name], "required", parallel, name)


def _call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def tool_calls_json(calls, ids: list[str]) -> list[dict]:
    return [{"id": ids[i], "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for i, c in enumerate(calls)]


class ReplyReader:
    """Reads one reply as it grows: feed() takes each new piece of text and returns the deltas to send
    (content text, and tool-call pieces); finish() reads the whole reply and returns the last deltas. A call's
    arguments are sent only as far as they can no longer change."""

    def __init__(self, plan: ChatPlan, parallel: bool) -> None:
        self.plan = plan
        self.parallel = parallel
        self.text = ""
        self.sent_content = ""
        self.sent_calls: list[list[str]] = []   # per call: [id, name, arguments sent]
        self.final: ChatReply | None = None

    def _read(self, partial: bool) -> ChatReply | None:
        try:
            reply = self.plan.parse(self.text, partial=partial)
        except ChatTemplateError as e:
            if partial:
                return None  # not readable yet: wait for more text
            # the reply goes off its format after some calls (text after a call, a call left open): the calls
            # up to the last line that still reads are kept; a reply with no call in it is text
            reply = self._read_head()
            if reply is None:
                log.warning("the reply does not match the template's tool-call format (%s): sent as text", e)
                return ChatReply(self.text)
            log.warning("the reply goes off the template's tool-call format after %d call(s): the rest is "
                        "dropped (%s)", len(reply.tool_calls), e)
        if not self.parallel and len(reply.tool_calls) > 1:
            reply = ChatReply(reply.content, reply.tool_calls[:1], reply.reasoning_content)
        return reply

    def _read_head(self) -> ChatReply | None:
        """The longest head of the reply, cut at a line end, that reads whole and holds a call."""
        cut = len(self.text)
        while (cut := self.text.rfind("\n", 0, cut)) > 0:
            for end in (cut + 1, cut):
                try:
                    reply = self.plan.parse(self.text[:end])
                except ChatTemplateError:
                    continue
                if reply.tool_calls:
                    return reply
        return None

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        reply = self._read(partial=True)
        return self._deltas(reply, final=False) if reply is not None else []

    def finish(self) -> list[dict]:
        reply = self._read(partial=False)
        self.final = reply
        return self._deltas(reply, final=True)

    def _deltas(self, reply: ChatReply, final: bool) -> list[dict]:
        out: list[dict] = []
        if reply.content != self.sent_content and reply.content.startswith(self.sent_content) and \
                (final or not reply.tool_calls or len(self.sent_calls) == 0):
            out.append({"content": reply.content[len(self.sent_content):]})
            self.sent_content = reply.content
        calls = reply.tool_calls
        for i, call in enumerate(calls):
            # while the reply grows, only calls followed by another are complete; the last one's arguments are
            # sent as far as they only grew
            if i >= len(self.sent_calls):
                if not call.name:
                    break
                self.sent_calls.append([call.id or _call_id(), call.name, ""])
                sid, name, _ = self.sent_calls[i]
                out.append({"tool_calls": [{"index": i, "id": sid, "type": "function",
                                            "function": {"name": name, "arguments": ""}}]})
            sent = self.sent_calls[i]
            args = call.arguments
            if args != sent[2] and args.startswith(sent[2]):
                out.append({"tool_calls": [{"index": i, "function": {"arguments": args[len(sent[2]):]}}]})
                sent[2] = args
            elif args != sent[2] and final:
                log.warning("tool call %d's arguments changed after being streamed", i)
        return out

    @property
    def ids(self) -> list[str]:
        return [c[0] for c in self.sent_calls]


    def whole(self, text: str) -> tuple[ChatReply, list[dict]]:
        """The reply read at once: its content and its tool calls in OpenAI's shape."""
        self.text += text
        self.finish()
        reply = self.final
        ids = [c.id or _call_id() for c in reply.tool_calls]
        return reply, tool_calls_json(reply.tool_calls, ids)


_NAME_MARK = "pls_call_name_7f3a"
_ARG_MARK = "pls_call_arg_7f3a"


def call_opening(render, name: str | None) -> str:
    """How a reply that must call a tool begins, in the template's own format: the text the template writes
    before a call's function name (with a named function: through the name, up to its first argument). Found by
    rendering a conversation with and without a marked call (render(messages, add_generation_prompt) -> prompt).
    tool_choice 'required' (or a named function) is honoured by starting the reply with this text in the prompt
    (the template's lazy grammar serves 'auto': ToolPlan.sampling); a template that does not render calls that way
    is refused."""
    base = [{"role": "user", "content": "x"}]
    call = {"role": "assistant", "content": "", "tool_calls": [{
        "id": "call_0", "type": "function",
        "function": {"name": _NAME_MARK, "arguments": '{"%s": 0}' % _ARG_MARK}}]}
    before = render(base, True)
    after = render(base + [call], False)
    text = after[len(before):] if after.startswith(before) else ""
    i = text.find(_NAME_MARK)
    j = text.find(_ARG_MARK, i + 1) if i >= 0 else -1
    if i < 0 or j < 0 or not text[:i].strip():
        raise APIError(400, "tool_choice 'required' (or a named function) cannot be honoured with this chat "
                            "template: it does not render a tool call after the assistant's prompt",
                       param="tool_choice")
    if name is None:
        return text[:i]
    between = text[i + len(_NAME_MARK):j]
    return text[:i] + name + between[:between.rfind('"')] if '"' in between else text[:i] + name + between


class ToolPlan:
    """A chat request's plan with its tool settings: the stop strings the format adds, the special tokens its
    markup uses (sent as text, not dropped), the text the reply starts with (`prefill`, already in the prompt)
    and a reader per reply."""

    def __init__(self, plan: ChatPlan, settings: ToolSettings, target, prefill: str = "") -> None:
        self.plan = plan
        self.settings = settings
        self.prefill = prefill
        special = set()
        for text in plan.preserved_tokens:
            ids = target.tokenize(text, add_special=False, parse_special=True)
            if len(ids) == 1:
                special.add(ids[0])
        self.special_tokens = frozenset(special)
        self.stops = tuple(s for s in plan.additional_stops if s)

    def sampling(self) -> dict:
        """The template's tool-call grammar for the reply's sequence where it is lazy (tool_choice 'auto'): free
        text until the template's call opens (its triggers), then only calls of the offered tools with arguments
        their schemas allow. Nothing where the reply is prefilled with a call's opening ('required', a named function)
        or the template gives no lazy grammar."""
        plan = self.plan
        if self.prefill or not plan.tools or not plan.grammar or not plan.grammar_lazy or not plan.grammar_triggers:
            return {}
        return {"grammar": plan.grammar, "grammar_triggers": plan.grammar_triggers}

    @property
    def parses(self) -> bool:
        """Whether replies are read for tool calls (tools offered, tool_choice not none)."""
        return self.plan.tools

    def reader(self) -> ReplyReader:
        reader = ReplyReader(self.plan, self.settings.parallel)
        reader.text = self.prefill
        return reader
