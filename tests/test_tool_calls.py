"""Tool calls: tools and tool_choice rendered through the chat template, replies read back into OpenAI tool_calls
(upstream's chat parsers), whole and streamed, and the same calls with speculation on as without.

The synthetic models carry TOOLS_STYLE (a template of Qwen2.5's shape) for rendering and reading canned replies;
the real Qwen2.5-Coder pair generates calls through `pyllamaspec serve` and the official openai client."""

from __future__ import annotations

import json
import random
import signal
import time
from pathlib import Path

import pytest

from pyllamaspec import Model, SessionConfig, SpecSession
from pyllamaspec.errors import ChatTemplateError, ConfigError

from helpers import MIN_NEAR_TIE, TOOLS_STYLE

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Get the local time in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
TWO_CALLS = ('Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
             '<tool_call>\n{"name": "get_time", "arguments": {"city": "Tokyo", "utc": false}}\n</tool_call>')


@pytest.fixture(scope="module")
def target(dense_pair):
    with Model(dense_pair[0]) as m:
        yield m


def plan(target, tool_choice="auto", tools=(WEATHER, CLOCK), messages=ASK, **kw):
    return target.apply_chat(messages, tools=list(tools), tool_choice=tool_choice, template=TOOLS_STYLE, **kw)


# -- rendering and reading back ----------------------------------------------------------------------


def test_tools_reach_the_prompt_and_the_format_reports_its_grammar(target):
    bare = target.apply_chat(ASK, template=TOOLS_STYLE)
    auto = plan(target)
    assert '"name": "get_weather"' in auto.prompt and '"get_time"' in auto.prompt
    assert "get_weather" not in bare.prompt and len(auto.prompt) > len(bare.prompt)
    # auto: a lazy grammar that starts at the call marker; required: the grammar holds from the first token
    assert auto.grammar_lazy and [t.value for t in auto.grammar_triggers] == ["<tool_call>\n"]
    required = plan(target, "required")
    assert not required.grammar_lazy and "get_weather" in required.grammar and "get_time" in required.grammar
    assert "<tool_call>" in required.preserved_tokens
    assert auto.caps["supports_tool_calls"] and auto.tools and not plan(target, "none").tools


def test_a_reply_reads_back_into_content_and_calls(target):
    reply = plan(target).parse(TWO_CALLS)
    assert reply.content.strip() == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [
        ("get_weather", {"city": "Paris"}), ("get_time", {"city": "Tokyo", "utc": False})]
    assert plan(target).parse("Just text.").tool_calls == ()


def test_partial_reads_only_grow(target):
    p = plan(target)
    final = p.parse(TWO_CALLS)
    prev_content, prev_args = "", []
    for i in range(1, len(TWO_CALLS) + 1):
        try:
            r = p.parse(TWO_CALLS[:i], partial=True)
        except ChatTemplateError:
            continue
        assert r.content.startswith(prev_content) and final.content.startswith(r.content)
        args = [c.arguments for c in r.tool_calls]
        assert len(args) >= len(prev_args)
        for a, b in zip(prev_args, args):
            assert b.startswith(a)
        for a, c in zip(args, final.tool_calls):
            assert c.arguments.startswith(a)
        prev_content, prev_args = r.content, args
    assert prev_args == [c.arguments for c in final.tool_calls]


def test_history_with_calls_and_tool_answers_is_rendered(target):
    history = ASK + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C, cloudy"}]
    p = plan(target, messages=history)
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in p.prompt
    assert "<tool_response>\n18 C, cloudy\n</tool_response>" in p.prompt


@pytest.mark.parametrize("bad, kwargs", [
    ([{"role": "user"}], {}),                                                  # no content
    ([{"role": "assistant", "tool_calls": [{"type": "function", "function": {"arguments": "{}"}}]}], {}),
    (ASK, {"tool_choice": "always"}),
    (ASK, {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"x": float("nan")}}}]}),
    (ASK, {"tools": [{"type": "retrieval"}]}),
])
def test_malformed_requests_are_config_errors(target, bad, kwargs):
    kwargs.setdefault("tools", [WEATHER])
    with pytest.raises(ConfigError):
        target.apply_chat(bad, template=TOOLS_STYLE, **kwargs)
    assert plan(target).parse(TWO_CALLS).tool_calls  # and the model still works


# -- the server's reading: streamed pieces, the start of a required call ------------------------------------------


def stream_pieces(text: str, seed: int) -> list[str]:
    rng, out, i = random.Random(seed), [], 0
    while i < len(text):
        n = rng.randint(1, 6)
        out.append(text[i:i + n])
        i += n
    return out


def reassemble(deltas: list[dict]) -> tuple[str, list[dict]]:
    content, calls = "", {}
    for d in deltas:
        content += d.get("content", "")
        for piece in d.get("tool_calls", ()):
            call = calls.setdefault(piece["index"], {"id": None, "name": "", "arguments": ""})
            if "id" in piece:
                assert call["id"] is None and piece["type"] == "function"  # a call's first piece, once
                call["id"] = piece["id"]
            call["name"] += piece["function"].get("name", "")
            call["arguments"] += piece["function"].get("arguments", "")
    return content, [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_streamed_pieces_reassemble_to_the_whole_reply(target, seed):
    from pyllamaspec.server.tools import ReplyReader

    p = plan(target)
    whole, calls = ReplyReader(p, parallel=True).whole(TWO_CALLS)
    reader = ReplyReader(p, parallel=True)
    deltas = [d for piece in stream_pieces(TWO_CALLS, seed) for d in reader.feed(piece)] + reader.finish()
    content, streamed = reassemble(deltas)
    assert content == whole.content
    assert [(c["name"], c["arguments"]) for c in streamed] == [(c["function"]["name"], c["function"]["arguments"])
                                                               for c in calls]
    assert all(c["id"].startswith("call_") for c in streamed)
    assert len({c["id"] for c in streamed}) == 2


def test_one_call_when_parallel_calls_are_off(target):
    from pyllamaspec.server.tools import ReplyReader

    reply, calls = ReplyReader(plan(target), parallel=False).whole(TWO_CALLS)
    assert [c["function"]["name"] for c in calls] == ["get_weather"]


def test_a_reply_that_goes_off_format_keeps_the_calls_before(target):
    from pyllamaspec.server.tools import ReplyReader

    text = TWO_CALLS.split("\n<tool_call>\n{\"name\": \"get_time\"")[0] + "\n{\"name\": \"get_time\", \"argu"
    reply, calls = ReplyReader(plan(target), parallel=True).whole(text)
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in calls] == [("get_weather",
                                                                                     '{"city": "Paris"}')]
    # no call at all: the text as it is
    reply, calls = ReplyReader(plan(target), parallel=True).whole("```json\n{\"name\": \"get_weather\"}\n```")
    assert calls == [] and reply.content.startswith("```json")


def test_a_required_call_starts_as_the_template_writes_calls(target):
    from pyllamaspec.server.tools import call_opening

    def render(messages, add_generation_prompt):
        return target.apply_chat(messages, tools=[WEATHER], template=TOOLS_STYLE,
                                 add_generation_prompt=add_generation_prompt).prompt

    assert call_opening(render, None) == '<tool_call>\n{"name": "'
    assert call_opening(render, "get_weather") == '<tool_call>\n{"name": "get_weather", "arguments": {'
    p = plan(target, "required", tools=[WEATHER])
    reply = p.parse(call_opening(render, "get_weather") + '"city": "Oslo"}}\n</tool_call>')
    assert [(c.name, json.loads(c.arguments)) for c in reply.tool_calls] == [("get_weather", {"city": "Oslo"})]


def test_an_auto_reply_samples_with_the_templates_lazy_grammar_and_a_prefilled_one_without(target):
    # tool_choice auto: free text until the template's call opens, then calls of the offered tools only (the
    # grammar the template gives, lazy); required is prefilled with the call's opening, which the grammar would not
    # expect at the reply's start; none reads no calls
    from pyllamaspec.config import SequenceParams
    from pyllamaspec.server.tools import ToolPlan, ToolSettings

    auto = ToolPlan(plan(target), ToolSettings([WEATHER, CLOCK], "auto", True), target)
    sampling = auto.sampling()
    assert sampling["grammar"] == plan(target).grammar and "get_time" in sampling["grammar"]
    assert [t.value for t in sampling["grammar_triggers"]] == ["<tool_call>\n"]
    params = SequenceParams(n_predict=8, **sampling)
    assert params.grammar_triggers == (("word", "<tool_call>\n", -1),)
    # the session takes it (the grammar and its trigger check against the model); nothing opens a call here
    with SpecSession(target, None, SessionConfig(spec_types=[], n_ctx=1024)) as s:
        s.submit_params(target.tokenize(plan(target).prompt), params)
        left = 1
        while left:
            _, left = s.step_sequences()
    assert ToolPlan(plan(target, "required"), ToolSettings([WEATHER], "required", True), target,
                    '<tool_call>\n{"name": "').sampling() == {}
    assert ToolPlan(plan(target, "none"), ToolSettings([WEATHER], "none", True), target).sampling() == {}


# -- the server on the synthetic models: what is refused, what reaches the prompt ------------------------


@pytest.fixture(scope="module")
def tool_server(dense_pair):
    httpx = pytest.importorskip("httpx")
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from serving import InProcessServer
    from pyllamaspec.server.app import Loaded, create_app

    def load():
        target, drafter = Model(dense_pair[0]), Model(dense_pair[1])
        session = SpecSession(target, drafter, SessionConfig(spec_types=["draft-simple"], n_max=4, adaptive=False,
                                                             n_ctx=2048, n_parallel=2))
        return Loaded(target, drafter, session)

    app = create_app(load, chat_template=TOOLS_STYLE)
    with InProcessServer(app) as s:
        deadline = time.monotonic() + 60
        while httpx.get(s.url + "/health", timeout=30).status_code != 200:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        yield s.url


def post(url, body):
    import httpx
    return httpx.post(url + "/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, **body}, timeout=60)


@pytest.mark.parametrize("body, param, words", [
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, "tool_choice",
     "'get_time'"),
    ({"tool_choice": "required"}, "tool_choice", "needs tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools", "get_weather"),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice", ""),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name", ""),
    ({"messages": [{"role": "assistant", "tool_calls": [{"type": "function", "function": {"name": "f"}}]}]},
     "messages[0].tool_calls[0].function.arguments", ""),
])
def test_tool_fields_that_cannot_be_honoured_are_400s_naming_them(tool_server, body, param, words):
    r = post(tool_server, body)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and words in err["message"]


def test_tools_and_tool_history_reach_the_prompt(tool_server):
    n = lambda body: post(tool_server, body).json()["usage"]["prompt_tokens"]  # noqa: E731
    bare = n({})
    with_tools = n({"tools": [WEATHER]})
    history = ASK + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    followup = n({"tools": [WEATHER], "messages": history})
    assert bare < with_tools < followup
    assert n({"tools": [WEATHER], "tool_choice": "none"}) == with_tools


# -- the real pair: calls generated, exact under speculation ---------------------------------------------------


REAL_TOOLS = [WEATHER, CLOCK]
REAL_TOOLS_NAMES = ("get_weather", "get_time")
REAL_ASK = [{"role": "user", "content": "What is the weather like in Paris, and what time is it in Tokyo?"}]


def assert_near(tokens, ref, near_tie):
    """Equal, or the first divergence sits where the plain run's top-1/top-2 margin is a near-tie."""
    for i, (a, b) in enumerate(zip(tokens, ref.tokens)):
        if a != b:
            assert ref.margins[i] < near_tie, f"divergence at {i} where the margin is {ref.margins[i]:.4g}"
            return
    assert len(tokens) == len(ref.tokens)


def assert_well_formed(calls, names=("get_weather", "get_time")):
    assert calls
    for c in calls:
        assert c.type == "function" and c.id.startswith("call_")
        assert c.function.name in names
        args = json.loads(c.function.arguments)
        assert isinstance(args, dict) and isinstance(args.get("city"), str)


def streamed_calls(client, **req):
    deltas, finish = [], None
    for ch in client.chat.completions.create(stream=True, **req):
        if ch.choices:
            deltas.append(ch.choices[0].delta.model_dump(exclude_none=True))
            finish = ch.choices[0].finish_reason or finish
    for d in deltas:
        for tc in d.get("tool_calls", ()):
            tc.get("function", {}).setdefault("arguments", "")
    return reassemble(deltas), finish


@pytest.mark.realmodel
def test_real_pair_calls_tools_through_the_server_as_it_does_without_speculation(real_pair, tmp_path):
    openai = pytest.importorskip("openai")
    from serving import ServerProcess

    target_path, drafter_path = real_pair
    s = ServerProcess(["-m", str(target_path), "-md", str(drafter_path), "--spec-type", "draft-simple",
                       "--spec-draft-n-max", "6", "--spec-adaptive", "off", "-np", "2", "-c", "4096"], tmp_path)
    try:
        s.wait_ready(timeout=300)
        c = openai.OpenAI(base_url=s.url + "/v1", api_key="none", timeout=300, max_retries=0)
        model = Path(target_path).stem
        for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
            req = dict(model=model, messages=REAL_ASK, tools=REAL_TOOLS, tool_choice=choice, temperature=0,
                       max_tokens=32)
            r = c.chat.completions.create(**req)
            msg = r.choices[0].message
            assert r.choices[0].finish_reason == "tool_calls"
            assert_well_formed(msg.tool_calls, ("get_time",) if isinstance(choice, dict) else REAL_TOOLS_NAMES)
            assert r.model_extra["timings"]["draft_n"] > 0
            (content, calls), finish = streamed_calls(c, **req)
            assert finish == "tool_calls"
            assert [(t["name"], t["arguments"]) for t in calls] == \
                [(t.function.name, t.function.arguments) for t in msg.tool_calls]
        # n choices: each reply is read for calls on its own; greedy, they call alike
        both = c.chat.completions.create(n=2, **req)
        assert [ch.index for ch in both.choices] == [0, 1]
        for ch in both.choices:
            assert ch.finish_reason == "tool_calls"
            assert_well_formed(ch.message.tool_calls, REAL_TOOLS_NAMES)
        assert [(t.function.name, t.function.arguments) for t in both.choices[0].message.tool_calls] == \
            [(t.function.name, t.function.arguments) for t in both.choices[1].message.tool_calls]
        # without drafting (per request) the calls are as well-formed; equality token for token, under the
        # near-tie rule, is the test below
        plain = c.chat.completions.create(extra_body={"speculative.n_max": 0}, **req)
        assert plain.model_extra["timings"]["draft_n"] == 0
        assert_well_formed(plain.choices[0].message.tool_calls, REAL_TOOLS_NAMES)
        # the follow-up turn: the calls and the tools' answers in the history
        history = REAL_ASK + [msg.model_dump(exclude_none=True)] + [
            {"role": "tool", "tool_call_id": t.id, "content": "14:05"} for t in msg.tool_calls]
        r2 = c.chat.completions.create(model=model, messages=history, tools=REAL_TOOLS, temperature=0, max_tokens=12)
        assert r2.usage.prompt_tokens > r.usage.prompt_tokens and r2.choices[0].finish_reason in ("stop", "length")
        assert s.stop() == 0, s.stderr
    finally:
        s.stop(signal.SIGKILL)


@pytest.fixture(scope="module")
def real_models(real_pair):
    with Model(real_pair[0]) as target, Model(real_pair[1]) as drafter:
        yield target, drafter


@pytest.mark.realmodel
def test_real_pair_tool_call_tokens_equal_plain_decoding(real_models):
    from pyllamaspec.server.tools import ReplyReader, call_opening

    target, drafter = real_models

    def render(messages, add_generation_prompt):
        return target.apply_chat(messages, tools=REAL_TOOLS, add_generation_prompt=add_generation_prompt).prompt

    p = target.apply_chat(REAL_ASK, tools=REAL_TOOLS, tool_choice="required")
    opening = call_opening(render, None)
    prompt = target.tokenize(p.prompt + opening)
    with SpecSession(target, None, SessionConfig(spec_types=[], margins=True, n_ctx=1024)) as s:
        ref = s.generate(prompt, 24)
    for spec, cfg in [("ngram-simple", dict(spec_types=["ngram-simple"], adaptive=False)),
                      ("draft-simple", dict(spec_types=["draft-simple"], adaptive=False, n_max=6)),
                      ("adaptive", dict(spec_types=["draft-simple"], adaptive=True))]:
        with SpecSession(target, None if spec.startswith("ngram") else drafter,
                         SessionConfig(n_ctx=1024, **cfg)) as s:
            out = s.generate(prompt, 24)
        assert_near(out.tokens, ref, MIN_NEAR_TIE)
        # read as the server reads it (what follows the first call here is off the format: dropped)
        reply, calls = ReplyReader(p, parallel=True).whole(opening + target.detokenize(out.tokens))
        assert calls, spec
        for call in calls:
            assert call["function"]["name"] in REAL_TOOLS_NAMES
            assert isinstance(json.loads(call["function"]["arguments"]), dict)
